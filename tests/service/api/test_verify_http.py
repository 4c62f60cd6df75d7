"""Verifiable rewards over real HTTP (service/engine/rewards.py, /score and /get_reward): acceptance 4
(timeouts counted in /metrics), 8 (dynamic sampling, /get_reward scores) and 9 (weights)."""

from __future__ import annotations

import time

import httpx
import pytest

from tests.service.conftest import free_port, make_db, start_live, stop_live

PLUGINS = "sleepy=tests.rm.verify.verifier_plugins:sleepy"
GSM = "How many apples are left?"


@pytest.fixture(scope="module")
def vlive(tmp_path_factory, tiny_models):
    """rm-tiny-a plus verifiers, a 2 s verifier limit, a hanging test checker, and gsm8k for
    ground truth that names no verifier (BRADLEY_DEFAULT_VERIFIER)."""
    from service.api.settings import load_settings

    db = make_db(tmp_path_factory.mktemp("vlive") / "v.duckdb", tiny_models)
    settings = load_settings(db=db, model="rm-tiny-a", port=free_port(), device="cpu",
                             verifier_timeout_s=2.0, verifier_plugins=PLUGINS,
                             default_verifier="gsm8k")
    server = start_live(settings)
    assert server.service.verifiers.wait_ready()
    yield server
    stop_live(server)


@pytest.fixture(scope="module")
def http(vlive):
    with httpx.Client(base_url=vlive.url, timeout=60) as client:
        yield client


def _items(responses, truth=10, **extra):
    return [{"prompt": GSM, "response": r, "ground_truth": truth, **extra} for r in responses]


def test_ground_truth_alone_is_verifier_only(http):
    out = http.post("/score", json={"items": _items(["#### 10", "#### 7", "no marker"])}).json()
    assert out["scores"] == pytest.approx([1.1, 0.1, 0.0])
    assert out["correct"] == [True, False, False]
    assert out["status"] == ["ok", "ok", "no_answer"]
    assert out["verifier"] == ["gsm8k"] * 3 and out["rm_scores"] is None
    assert out["status_counts"] == {"ok": 2, "no_answer": 1}


def test_verifier_only_groups_and_the_reward_model_weighed_in(http):
    """A verifier-only request with group_size gets its group fields; one that weighs in the reward
    model gets its scores too; a bad field is named."""
    out = http.post("/score", json={"items": _items(["#### 10"] * 3), "group_size": 3}).json()
    assert out["scores"] == [1.1] * 3 and out["degenerate_groups"] == [True]
    out = http.post("/score", json={"items": _items(["#### 10"]), "weights": {"rm": 1}}).json()
    assert out["rm_scores"] is not None and out["model"] == "rm-tiny-a"
    r = http.post("/score", content=b'{"items": [{"prompt": "p", "ground_truth": 1, "response": 5}]}')
    assert (r.status_code, r.json()["field"]) == (422, "items[0].response")


@pytest.mark.parametrize(("body", "status", "field"), [
    (b'{"items": [{"ground_truth": 1, ', 400, "body"),
    (b'{"items": [{"prompt": "p", "response": "\\ud800", "ground_truth": 1}]}', 422,
     "items[0].response"),
    (b'\xff{"items": [{"ground_truth": 1}]}', 400, "body"),
    (b'{"items": [{"prompt": "p", "response": "x", "ground_truth": 1e999}]}', 422,
     "items[0].ground_truth"),
    (b'{"items": [{"prompt": "p", "response": "x", "ground_truth": 1}], "group_size": 2}', 422,
     "group_size"),
])
def test_hostile_bodies_with_ground_truth_name_their_field(http, body, status, field):
    r = http.post("/score", content=body)
    assert (r.status_code, r.json()["field"]) == (status, field)


def test_a_ground_truth_beyond_64_bits_stays_exact_over_http(http):
    big = "123456789012345678901234567"  # orjson alone would read it as a float
    item = f'{{"prompt": "p", "response": "{big}", "ground_truth": {big}, "verifier": "exact"}}'
    body = f'{{"items": [{item}]}}'.encode()
    assert http.post("/score", content=body).json()["correct"] == [True]


def test_weights_combine_rm_and_verifier(http):
    items = _items(["3x4=12, 12-2=10\n#### 10", "#### 7"], data_source="openai/gsm8k")
    rm_only = http.post("/score", json={"items": [{"prompt": i["prompt"], "response": i["response"]}
                                                  for i in items]}).json()["scores"]
    zero = http.post("/score", json={"items": items, "weights": {"rm": 0}}).json()
    assert zero["scores"] == [1.1, 0.1]  # exactly the verifier reward
    assert zero["rm_scores"] == pytest.approx(rm_only, abs=1e-5)  # logged, not trained on
    both = http.post("/score", json={"items": items, "weights": {"rm": 1, "gsm8k": 1}}).json()
    assert both["scores"] == pytest.approx([rm_only[0] + 1.1, rm_only[1] + 0.1], abs=1e-5)
    half = http.post("/score", json={"items": items, "weights": {"rm": 0.5, "gsm8k": 2}}).json()
    assert half["scores"] == pytest.approx([0.5 * rm_only[0] + 2.2, 0.5 * rm_only[1] + 0.2], abs=1e-5)


def test_a_data_source_without_a_checker_is_left_to_the_reward_model(http):
    items = _items(["#### 10"], data_source="my/own-data")
    out = http.post("/score", json={"items": items}).json()
    rm = http.post("/score", json={"items": [{"prompt": GSM, "response": "#### 10"}]}).json()
    assert out["scores"] == pytest.approx(rm["scores"], abs=1e-6) and "verifier" not in out


def test_dynamic_sampling_and_group_stats(http, vlive):
    groups = [["#### 10"] * 4, ["#### 7"] * 4, ["x", "#### 7", "y", "z"],
              ["#### 10", "#### 7", "#### 8", "#### 9"]]
    items = _items([r for g in groups for r in g])
    out = http.post("/score", json={"items": items, "group_size": 4, "dynamic_sampling": True}).json()
    assert out["scores"][:12] == pytest.approx([1.1] * 4 + [0.1] * 4 + [0, 0.1, 0, 0])
    assert out["keep"] == [False, False, False, True]
    assert out["degenerate_groups"] == [True, True, False, False]
    assert out["advantages"][9] == pytest.approx(1.497, abs=1e-3)  # the format-only answer
    stats = out["group_stats"]
    assert stats["all_equal_share"] == 0.5 and stats["accuracy_all_equal_share"] == 0.75
    assert stats["mean_accuracy"] == pytest.approx(5 / 16)
    p = 5 / 16
    assert stats["predicted_all_equal"] == pytest.approx(p ** 4 + (1 - p) ** 4)
    assert "predicted_all_equal_per_prompt" in stats
    metrics = http.get("/metrics").text
    assert 'bradley_group_all_equal_share{kind="accuracy"} 0.75' in metrics
    assert 'bradley_group_all_equal_share{kind="predicted"}' in metrics


def test_std_ddof_and_dr_grpo_over_http(http):
    items = _items(["#### 10", "x", "y", "#### 10"], truth=10)
    body = {"items": items, "group_size": 4, "weights": {"gsm8k": 1 / 1.1}, "std_ddof": 0}
    assert http.post("/score", json=body).json()["advantages"] == pytest.approx(
        [0.9998, -0.9998, -0.9998, 0.9998], abs=1e-4)
    body.update(advantage="dr_grpo")
    assert http.post("/score", json=body).json()["advantages"] == pytest.approx(
        [0.5, -0.5, -0.5, 0.5], abs=1e-9)


def test_get_reward_reads_labels(http):
    queries = [GSM + " #### 10"] * 4 + [GSM + " #### 7"] * 4
    body = {"query": queries, "prompts": [GSM] * 8, "labels": ["10"] * 8}
    out = http.post("/get_reward", json=body).json()
    assert out["rewards"] == pytest.approx([1.1] * 4 + [0.1] * 4)
    assert out["scores"] == [1.0] * 4 + [0.0] * 4
    assert sum(out["scores"][:4]) / 4 == 1.0 and sum(out["scores"][4:]) / 4 == 0.0
    logs = out["extra_logs"]  # per item: OpenRLHF averages each key
    assert logs["verifier_reward"] == pytest.approx([1.1] * 4 + [0.1] * 4)
    assert sum(logs["verifier_reward"]) / 8 == pytest.approx(0.6)  # the component mean
    assert logs["status_ok"] == [1.0] * 8 and sum(logs["status_timeout"]) == 0
    single = http.post("/get_reward", json={"query": GSM + " #### 10", "prompts": GSM,
                                            "labels": "10", "data_source": "openai/gsm8k"}).json()
    assert (single["rewards"], single["scores"]) == (pytest.approx(1.1), 1.0)
    assert single["extra_logs"]["status_ok"] == 1.0
    plain = http.post("/get_reward", json={"query": queries[:2], "prompts": [GSM] * 2}).json()
    assert plain["scores"] == plain["rewards"]  # no labels: the reward model, as before


def test_a_hanging_verifier_answers_in_time_and_is_counted(http):
    def timeouts() -> float:
        for line in http.get("/metrics").text.splitlines():
            if line.startswith('bradley_verifier_calls_total{status="timeout",verifier="sleepy"}'):
                return float(line.split()[-1])
        return 0.0

    before = timeouts()
    started = time.monotonic()
    out = http.post("/score", json={"items": _items(["x"], verifier="sleepy")}).json()
    assert time.monotonic() - started < 3.0
    assert (out["scores"], out["status"], out["status_counts"]) == ([0.0], ["timeout"], {"timeout": 1})
    assert timeouts() == before + 1
    assert http.post("/score", json={"items": _items(["#### 10"])}).json()["scores"] == [1.1]


def _calls_counted(http, verifier: str, status: str) -> float:
    prefix = f'bradley_verifier_calls_total{{status="{status}",verifier="{verifier}"}}'
    lines = [x for x in http.get("/metrics").text.splitlines() if x.startswith(prefix)]
    return float(lines[0].split()[-1]) if lines else 0.0


def test_every_check_is_counted_per_verifier_and_status(http):
    """/metrics counts each (verifier, status): one verifier for every item, and two in one
    request."""
    keys = [("gsm8k", "ok"), ("gsm8k", "no_answer"), ("exact", "ok")]
    before = [_calls_counted(http, *k) for k in keys]
    http.post("/score", json={"items": _items(["#### 10", "#### 7", "none", "none"])})
    http.post("/score", json={"items": [*_items(["#### 10", "none"]),
                                        *_items(["a", "b", "c"], truth="a", verifier="exact")]})
    assert [_calls_counted(http, *k) - b for k, b in zip(keys, before, strict=True)] == [3, 3, 3]


def test_a_catastrophic_regex_times_out_and_its_batch_mates_are_scored(http):
    """Acceptance 4: the worker that ran the regex is killed at the limit (+1 s), the regex item
    is `timeout`, and the others are scored."""
    redos = {"prompt": "p", "response": "a" * 28 + "!", "verifier": "regex", "ground_truth": "(a+)+$"}
    started = time.monotonic()
    out = http.post("/score", json={"items": [*_items(["#### 10"]), redos, *_items(["#### 7"])]})
    assert time.monotonic() - started < 3.5
    assert out.json()["status"] == ["ok", "timeout", "ok"]
    assert out.json()["scores"] == [1.1, 0.0, 0.1]


@pytest.mark.parametrize(("body", "status", "field"), [
    ({"items": _items(["x"], verifier="gsm9k")}, 422, "items[0].verifier"),
    ({"items": _items(["x"], verifier="code")}, 501, "items[0].verifier"),
    ({"items": _items(["x"]), "weights": {"bogus": 1}}, 422, "weights.bogus"),
    ({"items": _items(["x"]), "weights": {"rm": "1"}}, 422, "weights.rm"),
    ({"items": _items(["x"], truth=True)}, 422, "items[0].ground_truth"),
    ({"items": _items(["x"]), "std_ddof": 2}, 422, "std_ddof"),
    ({"items": _items(["x"], truth=10 ** 400)}, 422, "items[0].ground_truth"),
    ({"items": _items(["x"]), "weights": {"rm": 10 ** 400}}, 422, "weights.rm"),
    ({"items": _items(["x"], verifier={"name": "gsm8k", "partial": [1]})}, 422, "items[0].verifier"),
])
def test_bad_verifier_requests_name_the_field(http, body, status, field, monkeypatch):
    monkeypatch.delenv("BRADLEY_ENABLE_CODE_VERIFIER", raising=False)
    r = http.post("/score", json=body)
    assert (r.status_code, r.json()["field"]) == (status, field)


def test_code_over_http_a_memory_bomb_is_an_error_and_the_server_lives_on(http, monkeypatch):
    monkeypatch.setenv("BRADLEY_ENABLE_CODE_VERIFIER", "1")
    items = [{"prompt": "p", "response": "def grab():\n    return bytearray(10 * 1024 ** 3)\n",
              "ground_truth": ["assert grab()"], "verifier": "code"},
             {"prompt": "p", "response": "def add(a, b):\n    return a + b\n",
              "ground_truth": ["assert add(1, 2) == 3", "assert add(1, 1) == 3"],
              "data_source": "openai/openai_humaneval"}]
    out = http.post("/score", json={"items": items}).json()
    assert out["status"] == ["error", "ok"] and out["scores"] == [0.0, 0.5]
    assert http.get("/healthz").status_code == 200
    assert http.post("/score", json={"items": _items(["#### 10"])}).json()["scores"] == [1.1]


def test_no_model_still_answers_verifier_only_requests(tmp_path):
    from service.api.settings import load_settings

    server = start_live(load_settings(db=str(tmp_path / "empty.duckdb"), port=free_port(),
                                      verifier_workers=1, default_verifier="gsm8k"))
    try:
        with httpx.Client(base_url=server.url, timeout=60) as client:
            r = client.post("/score", json={"items": _items(["#### 10"])})
            assert (r.status_code, r.json()["scores"], r.json()["model"]) == (200, [1.1], None)
            r = client.post("/score", json={"items": _items(["#### 10"]), "weights": {"rm": 1}})
            assert r.status_code == 503
            r = client.post("/get_reward", json={"query": ["#### 10"], "labels": ["10"]})
            assert (r.status_code, r.json()["scores"]) == (200, [1.0])
    finally:
        stop_live(server)
