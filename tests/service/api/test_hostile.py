"""Hostile HTTP clients: hostile bodies get a 4xx naming the field over a keep-alive connection
that stays usable, tokenization never runs on the event loop, callers without a key have a
character budget and a per-client concurrency bound, and upload/report errors point the right way.
Everything through a real uvicorn server on 127.0.0.1."""

from __future__ import annotations

import http.client
import json
import threading

import httpx
import pytest

from service.api.settings import SettingsError, load_settings
from tests.service.conftest import API_KEY, free_port, make_db, start_live, stop_live

ITEM = {"prompt": "What is 2+2?", "response": "4"}
GOOD = json.dumps({"items": [ITEM]}).encode()


@pytest.fixture(scope="module")
def guarded(tmp_path_factory, tiny_models):
    """A server whose budget for callers without a key is small: 2,000 characters per request and
    one request in flight per client address."""
    db = make_db(tmp_path_factory.mktemp("hostile") / "hostile.duckdb", tiny_models)
    settings = load_settings(db=db, model="rm-tiny-a", api_keys=API_KEY, port=free_port(),
                             max_body_bytes=256 * 1024, device="cpu", anon_max_request_chars=2_000,
                             anon_max_concurrent=1)
    server = start_live(settings)
    yield server
    stop_live(server)


def _post(conn: http.client.HTTPConnection, path: str, body: bytes, headers: dict | None = None):
    conn.request("POST", path, body=body, headers={"Content-Type": "application/json",
                                                   **(headers or {})})
    response = conn.getresponse()
    return response.status, response.getheader("connection"), json.loads(response.read() or b"null")


# Five bodies that once gave 500s, and their neighbours: each must be a 4xx naming the field.
BAD_BODIES = [
    ("/score", {"items": [ITEM], "group_size": 1, "advantage": []}, "advantage"),
    ("/score", {"items": [ITEM], "group_size": 1, "advantage": {}}, "advantage"),
    ("/score", '{"items": [{"prompt": "\\ud800", "response": "4"}]}', "items[0].prompt"),
    ("/score", '{"items": [{"prompt": "p", "response": "ok \\udfff"}]}', "items[0].response"),
    ("/get_reward", '{"query": ["fine", "\\ud800"]}', "query[1]"),
    ("/score", '{"items": [{"prompt": "p", "response": "r"}], "group_size": ' + "7" * 5000 + "}",
     "group_size"),
    ("/score", '{"items": [{"prompt": "p", "response": "r"}], "group_size": NaN}', "group_size"),
    ("/score", '{"items": [{"prompt": [{"role": "user", "content": "\\udc00"}], "response": "r"}]}',
     "items[0].prompt[0].content"),
]


@pytest.mark.parametrize("path, body, field", BAD_BODIES)
def test_bad_values_are_4xx_naming_the_field_and_the_connection_stays_usable(live, path, body, field):
    """One persistent HTTP/1.1 connection: the bad request, then a good one on the same socket."""
    raw = body.encode() if isinstance(body, str) else json.dumps(body).encode()
    conn = http.client.HTTPConnection("127.0.0.1", int(live.url.rsplit(":", 1)[1]), timeout=30)
    try:
        status, connection, answer = _post(conn, path, raw)
        assert 400 <= status < 500 and answer["field"] == field, answer
        assert connection != "close"
        sock = conn.sock
        status, _, answer = _post(conn, "/score", GOOD)
        assert status == 200 and len(answer["scores"]) == 1
        assert conn.sock is sock  # the same connection, not a silent reconnect
    finally:
        conn.close()


def test_an_unexpected_exception_is_a_500_that_keeps_the_connection(tmp_path):
    """The general mechanism: any exception no handler knows still ends in a complete response."""
    settings = load_settings(db=str(tmp_path / "boom.duckdb"), port=free_port(), device="cpu")
    from service.api.app import create_app

    def boom():
        raise TypeError("a bug")

    app = create_app(settings)
    app.add_api_route("/boom", boom, methods=["GET"])
    server = _serve(app, settings)
    try:
        conn = http.client.HTTPConnection("127.0.0.1", settings.port, timeout=30)
        conn.request("GET", "/boom")
        r = conn.getresponse()
        assert r.status == 500 and json.loads(r.read())["error"].startswith("internal error")
        sock = conn.sock
        conn.request("GET", "/healthz")
        assert conn.getresponse().status == 200 and conn.sock is sock
        conn.close()
        metrics = httpx.get(f"http://127.0.0.1:{settings.port}/metrics").text
        assert 'bradley_responses_total{route="/boom",status="500"} 1.0' in metrics
    finally:
        server.should_exit = True
        server.thread.join(30)


def _serve(app, settings):
    import time

    import uvicorn

    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=settings.port,
                                           log_level="critical"))
    server.thread = threading.Thread(target=server.run, daemon=True)
    server.thread.start()
    while not server.started:
        time.sleep(0.05)
    return server


def test_an_oversized_body_says_connection_close(live):
    """A 413 before the body is read must not leave the unread rest to be parsed as a request."""
    conn = http.client.HTTPConnection("127.0.0.1", int(live.url.rsplit(":", 1)[1]), timeout=30)
    status, connection, answer = _post(conn, "/score", b"x" * (64 * 1024 + 1))
    assert (status, connection, answer["field"]) == (413, "close", "body")
    status, _, _ = _post(conn, "/score", GOOD)  # http.client reopens after `close`
    assert status == 200
    conn.close()


def test_tokenization_never_runs_on_the_event_loop(live, hh_items):
    """Small and large requests alike are encoded in a worker thread (on main, requests of up to 64
    items were encoded in the event loop's thread and a 7.5 MB one stalled every route)."""
    rm = live.service.current.rm
    threads: list[str] = []
    original = rm.encode

    def spy(prompts, responses):
        threads.append(threading.current_thread().name)
        return original(prompts, responses)

    rm.encode = spy
    try:
        with httpx.Client(base_url=live.url, timeout=60) as c:
            for n in (1, 8, 80):
                items = [{"prompt": p, "response": r} for p, r in hh_items[:n]]
                assert c.post("/score", json={"items": items}).status_code == 200
    finally:
        del rm.encode
    loop_thread = live.server.thread.name
    assert len(threads) == 3 and all(t.startswith("bradley-tokenize") for t in threads), threads
    assert loop_thread not in threads


def test_callers_without_a_key_have_a_character_budget(guarded):
    items = [{"prompt": "p" * 500, "response": "r" * 500}] * 3  # 3,000 characters, budget 2,000
    with httpx.Client(base_url=guarded.url, timeout=60) as c:
        r = c.post("/score", json={"items": items})
        assert (r.status_code, r.json()["field"]) == (413, "items")
        assert "2,000" in r.json()["error"] and "key" in r.json()["error"]
        r = c.post("/get_reward", json={"query": ["q" * 2_001]})
        assert (r.status_code, r.json()["field"]) == (413, "query")
        keyed = c.post("/score", json={"items": items}, headers={"Authorization": f"Bearer {API_KEY}"})
        assert keyed.status_code == 200 and len(keyed.json()["scores"]) == 3


def test_callers_without_a_key_have_a_concurrency_bound_per_client(guarded):
    """With BRADLEY_ANON_MAX_CONCURRENT=1, a second request from the same address while the first
    is being tokenized is refused with 429 and Retry-After; a keyed request is not bounded."""
    rm = guarded.service.current.rm
    entered, release = threading.Event(), threading.Event()
    original = rm.encode

    def slow(prompts, responses):
        entered.set()
        release.wait(30)
        return original(prompts, responses)

    rm.encode = slow
    first: list = []
    holder = threading.Thread(target=lambda: first.append(
        httpx.post(f"{guarded.url}/score", content=GOOD, timeout=60)))
    holder.start()
    try:
        assert entered.wait(30)
        second = httpx.post(f"{guarded.url}/score", content=GOOD, timeout=60)
        assert (second.status_code, second.json()["field"]) == (429, "client")
        assert second.headers["retry-after"] == "1"
        rm.encode = original  # a keyed request is accepted (it waits for the busy tokenizer lane)
        keyed = threading.Thread(target=lambda: first.append(httpx.post(
            f"{guarded.url}/get_reward", json={"query": ["x"]}, timeout=60,
            headers={"Authorization": f"Bearer {API_KEY}"})))
        keyed.start()
    finally:
        release.set()
        holder.join(60)
    keyed.join(60)
    del rm.encode
    assert [r.status_code for r in first] == [200, 200]
    assert guarded.app.state.anon_slots.in_flight == {}  # every slot was given back
    assert httpx.post(f"{guarded.url}/score", content=GOOD).status_code == 200


def test_a_refused_anonymous_request_gives_its_slot_back(guarded):
    """The slot is taken by a plain dependency and given back by the outermost middleware
    (service.api.deps.release_held), so a request that fails after taking it (bad JSON, an item over
    the anonymous size limit, a wrong field) still frees it: with a limit of 1, each next request
    from the same address is answered, not refused with 429."""
    bodies = [b'{"items": [', json.dumps({"items": [{"prompt": "p", "response": "x" * 5_000}]}),
              json.dumps({"items": [{"prompt": 3, "response": "r"}]})]
    statuses = [httpx.post(f"{guarded.url}/score", content=b).status_code for b in bodies]
    assert 429 not in statuses and all(400 <= s < 500 for s in statuses), statuses
    assert guarded.app.state.anon_slots.in_flight == {}
    assert httpx.post(f"{guarded.url}/score", content=GOOD).status_code == 200


@pytest.mark.parametrize("name, value", [("anon_max_request_chars", 0), ("anon_max_concurrent", 0)])
def test_the_budgets_are_validated_settings(name, value):
    with pytest.raises(SettingsError, match=f"BRADLEY_{name.upper()}"):
        load_settings(**{name: value})


def test_a_huge_integer_in_an_upload_names_its_field(live, auth):
    body = '[{"prompt": "p", "chosen": "a", "rejected": "b", "strength": ' + "9" * 5000 + "}]"
    r = httpx.post(f"{live.url}/pairs", content=body, headers=auth)
    assert 400 <= r.status_code < 500 and r.json()["field"] == "[0].strength"
    assert "5,000 digits" in r.json()["error"] and "set_int_max_str_digits" not in r.text


def test_upload_errors_cite_the_query_parameter_not_the_cli_flag(live, auth):
    pytest.importorskip("annotation.ingest.batch")
    rows = [{"prompt": "p", "response_a": "x", "response_b": "y", "winner": "maybe", "rater": "h:1"}]
    r = httpx.post(f"{live.url}/judgments", json=rows, headers=auth)
    assert r.status_code == 422 and "?on_error=skip" in r.json()["error"]
    assert "--on-error" not in r.text


def test_an_unknown_snapshot_is_404(live, auth):
    pytest.importorskip("analysis.report")
    for suffix in ("", ".json", ".html"):
        r = httpx.get(f"{live.url}/reports/no-such-snapshot{suffix}", headers=auth)
        assert r.status_code == 404 and "not found" in r.json()["error"]
