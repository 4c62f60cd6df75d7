"""`POST /score` takes its own way in (service.api.routes_score.ScoreLane, issue 20): past Starlette's
middleware stack, FastAPI's router and its dependency solver. Held against the route it bypasses:
the same requests sent to an app without the lane get byte-for-byte the same answers, errors and
headers included."""

from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient

from service.api import routes_score
from service.api.app import create_app
from service.api.settings import load_settings
from tests.service.conftest import API_KEY

KEY = {"Authorization": f"Bearer {API_KEY}"}
ITEMS = {"items": [{"prompt": "p", "response": "r"}, {"prompt": "q", "response": "a longer one"}]}
REQUESTS = [  # (body bytes, headers): answers of every status the route gives
    (json.dumps(ITEMS).encode(), {}),
    (json.dumps(ITEMS).encode(), KEY),
    (json.dumps({"items": ITEMS["items"], "group_size": 2}).encode(), {}),
    (b"{", {}),
    (b'{"items": []}', {}),
    (b'{"items": [{"prompt": "p"}]}', {}),
    (b'{"items": [{"prompt": "\\ud800", "response": "r"}]}', {}),
    (b'{"items": [{"prompt": "p", "response": "r", "ground_truth": "4", "verifier": "nope"}]}', {}),
    (b'[1, 2]', {}),
    (b"\xff\xfe", {}),
    (b"x" * 5000, {}),  # over max_body_bytes: 413 that closes the connection
    (json.dumps(ITEMS).encode(), {"Authorization": "Bearer wrong-key-000"}),
    (json.dumps(ITEMS).encode(), {"Authorization": "Basic abc"}),
]
HEADERS = ("content-type", "content-length", "retry-after", "www-authenticate", "connection")


def _client(tmp_path, name, tiny_models, lane: bool, **overrides) -> TestClient:
    settings = load_settings(db=str(tmp_path / f"{name}.duckdb"), device="cpu", api_keys=API_KEY,
                             model=tiny_models["rm-tiny-a"], max_body_bytes=4096, **overrides)
    app = create_app(settings)
    if not lane:  # /score goes through FastAPI's middleware stack and router like any route
        app.score_lane = None
    return TestClient(app, raise_server_exceptions=False)


def _answers(client: TestClient) -> list[tuple]:
    out = []
    for body, headers in REQUESTS:
        r = client.post("/score", content=body, headers={"content-type": "application/json", **headers})
        out.append((r.status_code, r.content, {h: r.headers.get(h) for h in HEADERS}))
    return out


@pytest.mark.parametrize("requires_key", [False, True])
def test_the_lane_answers_exactly_as_the_route_it_bypasses(tmp_path, tiny_models, requires_key):
    with _client(tmp_path, "lane", tiny_models, True, score_requires_key=requires_key) as fast, \
            _client(tmp_path, "route", tiny_models, False, score_requires_key=requires_key) as slow:
        fast_answers, slow_answers = _answers(fast), _answers(slow)
        metrics = fast.get("/metrics").text
    statuses = sorted({a[0] for a in fast_answers})
    assert statuses == ([200, 400, 401, 403, 413, 422] if not requires_key else [200, 401, 403])
    for request, got, want in zip(REQUESTS, fast_answers, slow_answers, strict=True):
        assert got == want, request
    # the lane's requests are counted under the route's template, like every other route's
    assert f'bradley_responses_total{{route="/score",status="200"}} {1.0 + (not requires_key) * 2}' \
        in metrics


def test_score_requests_take_the_lane_and_others_the_app(tmp_path, tiny_models, monkeypatch):
    seen = []
    original = routes_score.score

    async def recording(request, caller, body):
        seen.append(request.url.path)
        return await original(request, caller, body)

    monkeypatch.setattr(routes_score, "score", recording)  # what the lane calls; the route kept its own
    with _client(tmp_path, "lane", tiny_models, True) as c:
        assert c.post("/score", json=ITEMS).status_code == 200
        assert c.get("/score").status_code == 405  # other methods: FastAPI's answer
        assert c.post("/get_reward", json={"query": ["x"]}).status_code == 200
    assert seen == ["/score"]


def test_an_anonymous_slot_taken_in_the_lane_is_given_back_after_an_error(tmp_path, tiny_models):
    with _client(tmp_path, "lane", tiny_models, True, anon_max_concurrent=1) as c:
        for _ in range(3):  # a slot kept after a refused body would make the second request a 429
            assert c.post("/score", content=b"{", headers={"content-type": "application/json"}
                          ).status_code == 400
        assert c.post("/score", json=ITEMS).status_code == 200
        assert c.app.state.anon_slots.in_flight == {}
