"""The issue's acceptance checks through real HTTP against a uvicorn server on 127.0.0.1."""

from __future__ import annotations

import gzip
import json
import re
import threading
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

MTBENCH = "mtbench_human/mtbench_turn1_judgments.jsonl.gz"


@pytest.fixture(scope="module")
def http(live):
    with httpx.Client(base_url=live.url, timeout=60) as client:
        yield client


def score_body(items):
    return {"items": [{"prompt": p, "response": r} for p, r in items]}


def test_score_matches_the_model_offline(http, hh_items, offline):
    items = hh_items[:12]
    r = http.post("/score", json=score_body(items))
    assert r.status_code == 200 and r.json()["model"] == "rm-tiny-a"
    expected = offline["rm-tiny-a"].score([p for p, _ in items], [x for _, x in items])
    assert r.json()["scores"] == pytest.approx(expected, abs=1e-5)


def test_score_with_group_size_returns_grpo_advantages(http, hh_items):
    prompt = hh_items[0][0]
    body = score_body([(prompt, hh_items[i][1]) for i in range(4)] + [(prompt, "same")] * 2)
    body["group_size"] = 2
    out = http.post("/score", json=body).json()
    s = out["scores"]
    for g in range(2):  # two distinct completions: advantages are -+ (|d|/2) / (|d|/sqrt2 + 1e-4)
        d = abs(s[2 * g] - s[2 * g + 1]) / 2
        assert abs(out["advantages"][2 * g]) == pytest.approx(d / (d * 2 ** 0.5 + 1e-4), rel=1e-6)
    assert out["advantages"][4:] == [0.0, 0.0]
    assert out["degenerate_groups"] == [False, False, True]


def test_messages_prompts_are_accepted(http):
    body = {"items": [{"prompt": [{"role": "user", "content": "hi"}], "response": "hello"}]}
    assert len(http.post("/score", json=body).json()["scores"]) == 1


def test_openrlhf_batch_and_single_sample(http, hh_items, offline):
    items = hh_items[:6]
    queries = [p + r for p, r in items]
    body = {"query": queries, "prompts": [p for p, _ in items], "labels": [""] * 6}
    out = http.post("/get_reward", json=body).json()
    expected = offline["rm-tiny-a"].score([p for p, _ in items], [r for _, r in items])
    assert out["rewards"] == pytest.approx(expected, abs=1e-5)
    assert out["scores"] == out["rewards"] and "extra_logs" in out
    single = http.post("/get_reward", json={"query": [queries[0]], "prompts": [items[0][0]]}).json()
    assert single["rewards"] == pytest.approx(expected[:1], abs=1e-5)


def test_scores_do_not_depend_on_batch_mates(live, http, hh_items, offline):
    target = hh_items[3]
    alone = http.post("/score", json=score_body([target])).json()["scores"][0]
    long_items = [(p * 3, r * 3) for p, r in hh_items[10:40]]
    with ThreadPoolExecutor(16) as pool:  # the target shares the queue with 31 long requests
        others = [pool.submit(http.post, "/score", json=score_body([it])) for it in long_items]
        mixed = [pool.submit(http.post, "/score", json=score_body([target])) for _ in range(8)]
        assert all(f.result().status_code == 200 for f in others)
        values = [f.result().json()["scores"][0] for f in mixed]
    ids = offline["rm-tiny-a"].encode([target[0]], [target[1]])
    reference = offline["rm-tiny-a"].score_encoded(ids)[0]
    assert values == pytest.approx([alone] * 8, abs=1e-6)
    assert alone == pytest.approx(reference, abs=1e-6)
    assert live.service.batcher.stats["forwards"] < live.service.batcher.stats["items"]


def test_forward_budgets_follow_the_device_unless_set(live):
    from service.engine.runtime import AUTO_BATCH_TOKENS, AUTO_PADDING

    assert (AUTO_BATCH_TOKENS, AUTO_PADDING) == ({"cpu": 16384, "cuda": 65536}, {"cpu": 0.1, "cuda": 1.0})
    batcher, service = live.service.batcher, live.service
    assert (batcher.max_batch_tokens, batcher.max_padding) == (16384, 0.1)  # a CPU model, unset
    settings = service.settings
    try:
        service.settings = settings.model_copy(update={"max_batch_tokens": 512, "max_padding": 0.5})
        service._install(service.current)
        assert (batcher.max_batch_tokens, batcher.max_padding) == (512, 0.5)
    finally:
        service.settings = settings
        service._install(service.current)
    assert (batcher.max_batch_tokens, batcher.max_padding) == (16384, 0.1)


def test_auth_401_without_key_403_with_wrong_key(http):
    r = http.post("/judgments", json={"prompt": "p"})
    assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
    assert r.json()["field"] == "Authorization"
    r = http.post("/judgments", json={"prompt": "p"}, headers={"Authorization": "Bearer wrong-key-1"})
    assert r.status_code == 403 and "invalid API key" in r.json()["error"]
    assert http.post("/models/rm-tiny-b/load").status_code == 401
    assert http.get("/reports/latest.json").status_code == 401


def test_oversized_bodies_get_413(http, auth):
    big = score_body([("p", "x" * 20_000)] * 4)  # 80 kB, limit 64 kB
    for path, headers in (("/score", {}), ("/judgments", auth)):
        r = http.post(path, json=big, headers=headers)
        assert r.status_code == 413 and r.json()["field"] == "body"
    chunks = (b'{"items": [' + b'{"prompt": "p", "response": "r"},' * 1000 for _ in range(3))
    r = http.post("/score", content=chunks)  # chunked: no Content-Length to check up front
    assert r.status_code == 413


@pytest.mark.parametrize("content, status, field", [
    (b'{"items": [', 400, "body"),
    (b'{"items": [{"prompt": 1, "response": "r"}]}', 422, "items[0].prompt"),
    (b'{"items": []}', 422, "items"),
    (json.dumps(score_body([("p", "y" * 20_001)])).encode(), 413, "items[0].response"),
    (b'{"items": [{"prompt": "\xff\xfe", "response": "r"}]}', 400, "body"),
    (b'', 400, "body"),
])
def test_bad_score_bodies_are_4xx_naming_the_field(http, content, status, field):
    r = http.post("/score", content=content, headers={"Content-Type": "application/json"})
    assert (r.status_code, r.json()["field"]) == (status, field)
    assert "Traceback" not in r.text


@pytest.mark.parametrize("content, status, field", [
    (b"[]", 422, "body"), (b"\xff\xfe", 400, "body"), (b"[1, 2]", 422, "[0]"),
    (b'{"prompt": "x"}\n{"prompt": ', 400, "line 2"),
])
def test_bad_upload_bodies_are_4xx_naming_the_field(http, auth, content, status, field):
    r = http.post("/judgments", content=content, headers=auth)
    assert (r.status_code, r.json()["field"]) == (status, field)


def test_health_ready_models_metrics(http):
    assert http.get("/healthz").json() == {"status": "ok"}
    assert http.get("/readyz").json()["model"] in ("rm-tiny-a", "rm-tiny-b")
    models = {m["id"]: m for m in http.get("/models").json()["models"]}
    assert set(models) == {"rm-tiny-a", "rm-tiny-b"} and sum(m["active"] for m in models.values()) == 1
    text = http.get("/metrics").text
    for name in ("bradley_request_seconds_bucket{", 'route="/score"', "bradley_scored_items_total",
                 "bradley_scored_tokens_total", "bradley_forward_rows_bucket", "bradley_queue_items",
                 "bradley_model_info{", "bradley_reward_length_correlation"):
        assert name in text
    assert http.get("/no-such-route").json()["error"]


def test_a_prompt_scored_again_is_taken_from_the_prompt_cache(http, offline):
    """A GRPO group (3 responses to one prompt) sent twice: the first request misses 3 times,
    the second hits 3 times, with the same scores as the model offline."""
    def lookups():
        text = http.get("/metrics").text
        found = re.findall(r'^bradley_prompt_cache_lookups\{result="(\w+)"\} (\S+)$', text, re.M)
        return {result: float(n) for result, n in found}

    prompt, responses = "a prompt only this test sends", ["a", "b", "c"]
    before = lookups()
    first = http.post("/score", json=score_body([(prompt, r) for r in responses])).json()
    middle = lookups()
    again = http.post("/score", json=score_body([(prompt, r) for r in responses])).json()
    after = lookups()
    assert middle["miss"] - before["miss"] == 3 and middle["hit"] == before["hit"]
    assert after["hit"] - middle["hit"] == 3 and after["miss"] == middle["miss"]
    model = offline[first["model"]]
    assert first["scores"] == again["scores"]
    assert first["scores"] == pytest.approx(model.score([prompt] * 3, responses), abs=1e-5)


def test_label_studio_webhooks_become_judgments(live, http, auth, shared_data):
    bodies = (shared_data / "label_studio" / "webhooks.jsonl").read_bytes().splitlines()
    assert http.post("/webhooks/label-studio", content=bodies[1]).status_code == 401
    before = _count(live, "judgments")
    answers = [http.post("/webhooks/label-studio", content=b, headers=auth) for b in bodies]
    statuses = [r.status_code for r in answers]
    # the recorded server sent: TASKS_CREATED, 3 valid pairwise verdicts, 4 invalid ones
    # ("selected": "middle" and an unknown from_name), which Label Studio itself accepted
    assert statuses.count(202) == 1 and statuses.count(201) == 3 and statuses.count(422) == 4
    fields = {r.json()["field"] for r in answers if r.status_code == 422}
    assert fields == {"annotation[3].result.value.selected", "annotation[7].result.value.selected",
                      "annotation[4].result[0].from_name", "annotation[8].result[0].from_name"}
    assert all("--on-error" not in r.json()["error"] for r in answers if r.status_code == 422)
    assert _count(live, "judgments") - before == 3
    again = http.post("/webhooks/label-studio", content=bodies[1], headers=auth)
    assert again.status_code == 200 and again.json()["duplicate"] is True


def _mtbench(shared_data, n):
    """The first n MT-Bench turn-1 verdicts that compare two different answers (two rows of the
    file compare an answer with itself, which ingest rightly rejects)."""
    with gzip.open(shared_data / MTBENCH, "rt", encoding="utf-8") as f:
        rows = [json.loads(line) for line in f]
    return [r for r in rows if r["response_a"] != r["response_b"]][:n]


def _count(live, table):
    return live.service.call_store(live.service.store.counts)[table]


def test_uploads_during_scoring_load_lose_nothing(live, http, auth, shared_data, hh_items):
    records = _mtbench(shared_data, 400)
    before = _count(live, "judgments")
    stop, failures, scored = threading.Event(), [], [0]

    def load():
        with httpx.Client(base_url=live.url, timeout=60) as c:
            while not stop.is_set():
                r = c.post("/score", json=score_body(hh_items[:4]))
                scored[0] += 1
                if r.status_code != 200:
                    failures.append(r.status_code)

    loaders = [threading.Thread(target=load) for _ in range(6)]
    for t in loaders:
        t.start()
    with ThreadPoolExecutor(4) as pool:
        uploads = [pool.submit(http.post, "/judgments", json=records[i:i + 10], headers=auth)
                   for i in range(0, 400, 10)]
        results = [f.result() for f in uploads]
    stop.set()
    for t in loaders:
        t.join()
    assert [r.status_code for r in results] == [201] * 40, [r.text[:200] for r in results]
    assert sum(r.json()["rows_ok"] for r in results) == 400
    assert _count(live, "judgments") - before == 400
    assert failures == [] and scored[0] > 0


def test_pairs_and_feedback_uploads_and_duplicates(live, http, auth, hh_items):
    pairs = [{"prompt": hh_items[i][0], "chosen": hh_items[i][1], "rejected": hh_items[i + 1][1]}
             for i in range(0, 20, 2)]
    jsonl = "\n".join(json.dumps(p) for p in pairs).encode()
    first = http.post("/pairs", content=jsonl, headers=auth)
    assert first.status_code == 201 and first.json()["rows_ok"] == 10
    again = http.post("/pairs", content=jsonl, headers=auth)
    assert again.status_code == 200 and again.json()["duplicate"] is True
    feedback = [{"prompt": p, "completion": r, "label": i % 2 == 0}
                for i, (p, r) in enumerate(hh_items[:6])]
    before = _count(live, "feedback")
    assert http.post("/feedback", json=feedback, headers=auth).json()["rows_ok"] == 6
    assert _count(live, "feedback") - before == 6


def test_invalid_upload_writes_nothing_and_names_the_problem(live, http, auth):
    before = _count(live, "judgments")
    rows = [{"prompt": "p", "response_a": "x", "response_b": "y", "winner": "a", "rater": "human:1"},
            {"prompt": "p", "response_a": "x", "response_b": "z", "winner": "maybe", "rater": "human:1"}]
    r = http.post("/judgments", json=rows, headers=auth)
    assert 400 <= r.status_code < 500 and "winner" in r.json()["error"]
    assert _count(live, "judgments") == before
    skipped = http.post("/judgments?on_error=skip", json=rows, headers=auth).json()
    assert (skipped["rows_ok"], skipped["rows_rejected"]) == (1, 1) and "winner" in skipped["errors"][0]
    assert _count(live, "judgments") == before + 1


def test_reports_json_and_html(http, auth):
    r = http.get("/reports/latest.json", headers=auth)
    assert r.status_code == 200 and isinstance(r.json(), dict)
    html = http.get("/reports/latest.html", headers=auth)
    assert html.status_code == 200 and html.headers["content-type"].startswith("text/html")
    assert http.get("/reports/latest.pdf", headers=auth).status_code == 404
    assert 400 <= http.get("/reports/no-such-snapshot", headers=auth).status_code < 500


def test_hot_swap_under_load_fails_no_request(live, http, auth, hh_items, offline):
    stop, seen, failures = threading.Event(), [], []
    answered = [threading.Event() for _ in range(8)]  # each client's first answer came back

    def load(first: threading.Event):
        with httpx.Client(base_url=live.url, timeout=60) as c:
            mine = []
            while not stop.is_set() or not first.is_set():
                r = c.post("/score", json=score_body(hh_items[:3]))
                if r.status_code != 200:
                    failures.append(r.text)
                else:
                    mine.append(r.json()["model"])
                first.set()
            seen.append(mine)

    threads = [threading.Thread(target=load, args=(first,)) for first in answered]
    for t in threads:
        t.start()
    try:
        assert all(first.wait(60) for first in answered)  # every client is under way: then swap
        swapped = http.post("/models/rm-tiny-b/load", headers=auth)
        assert swapped.status_code == 200 and swapped.json()["model"] == "rm-tiny-b"
        after = http.post("/score", json=score_body(hh_items[:3])).json()
    finally:
        stop.set()
        for t in threads:
            t.join()
        http.post("/models/rm-tiny-a/load", headers=auth)  # leave the shared server as it was
    assert failures == []
    for mine in seen:  # each client moves from a to b once and never back
        assert mine == sorted(mine) and mine
    expected = offline["rm-tiny-b"].score([p for p, _ in hh_items[:3]], [r for _, r in hh_items[:3]])
    assert after["model"] == "rm-tiny-b" and after["scores"] == pytest.approx(expected, abs=1e-5)
    assert http.post("/models/no-such-model/load", headers=auth).status_code == 404


def test_grafana_dashboard_queries_metrics_the_service_exports(http):
    import re

    from tests.service.conftest import ROOT

    dashboard = (ROOT / "deploy" / "grafana" / "dashboards" / "bradley.json").read_text()
    exported = http.get("/metrics").text
    # a recording rule (level:metric:operations, deploy/prometheus/rules.yml) is Prometheus's own
    names = set(re.findall(r"(?<![:\w])bradley_[a-z_]+(?![\w:])", dashboard))
    assert "bradley_verifier_calls_total" in names and "bradley_verifier_failure_ratio" not in names
    for name in names:  # a labelled family shows only its HELP/TYPE lines until first used
        family = re.sub(r"_(bucket|count|sum)$", "", name)
        assert f"\n{name}" in exported or f"# TYPE {family} " in exported, name
