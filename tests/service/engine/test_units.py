"""Pure parts of the service: advantages, request parsing, running correlation, settings."""

import math
import sys
import threading

import numpy as np
import pytest

from service.api.metrics import PENDING_PAIRS, Metrics, Moments, merge_moments, pearson
from service.api.payloads import Limits, PayloadError, parse_get_reward, parse_records, parse_score
from service.api.settings import SettingsError, load_settings
from service.engine.advantages import group_advantages


def test_grpo_advantages_match_hand_computation():
    # group (0, 1): mean 0.5, sample std sqrt(0.5) = 0.7071 -> (+-0.5) / (0.7071 + 1e-4)
    adv, degenerate = group_advantages([0.0, 1.0], group_size=2)
    assert adv == pytest.approx([-0.70700, 0.70700], abs=1e-5)
    assert degenerate == [False]


def test_dr_grpo_is_the_centered_reward_and_degenerate_groups_are_flagged():
    adv, degenerate = group_advantages([2.0, 4.0, 9.0, 1.0, 1.0, 1.0], 3, method="dr_grpo")
    assert adv == pytest.approx([-3.0, -1.0, 4.0, 0.0, 0.0, 0.0])
    assert degenerate == [False, True]


def test_rounding_noise_does_not_make_a_group_informative():
    # the same text scored in two forwards of different shapes: equal up to float32 rounding
    adv, degenerate = group_advantages([0.8123456, 0.8123456 + 2e-8, 0.5, 0.9], group_size=2)
    assert adv[:2] == [0.0, 0.0] and degenerate == [True, False]


def test_advantage_inputs_are_checked():
    with pytest.raises(ValueError, match="divide"):
        group_advantages([1.0, 2.0, 3.0], 2)
    with pytest.raises(ValueError, match="grpo"):
        group_advantages([1.0], 1, method="ppo")


def test_running_correlation_equals_numpy_over_many_merges():
    rng = np.random.default_rng(0)
    x, y = rng.integers(1, 500, 300).astype(float), rng.normal(size=300)
    y += 0.01 * x
    m = Moments()
    for start in range(0, 300, 7):
        m = merge_moments(m, x[start:start + 7].tolist(), y[start:start + 7].tolist())
    assert m.n == 300
    assert pearson(m) == pytest.approx(np.corrcoef(x, y)[0, 1], abs=1e-12)
    assert np.isnan(pearson(merge_moments(Moments(), [3.0, 3.0], [1.0, 2.0])))


def test_served_length_correlation_is_numpys_over_every_request_when_read():
    """Pairs wait in a buffer (merged past PENDING_PAIRS, and when /metrics reads the gauge)."""
    rng = np.random.default_rng(1)
    n = PENDING_PAIRS + 1000  # one merge on the way, the rest at the read
    lengths, y = rng.integers(1, 400, n), rng.normal(size=n)
    y += 0.004 * lengths
    metrics, read = Metrics(), lambda: metrics.registry.get_sample_value(
        "bradley_reward_length_correlation")
    metrics.on_model("a")
    for start in range(0, n, 3):
        metrics.on_scores("a", ["x" * k for k in lengths[start:start + 3]], y[start:start + 3].tolist())
    metrics.on_scores("a", ["a diverged model's", "scores"], [math.nan, math.inf])  # left out
    metrics.on_scores("swapped out", ["x", "xxxxxxxxx"], [9.0, -9.0])  # another model's: left out
    assert read() == pytest.approx(np.corrcoef(lengths, y)[0, 1], abs=1e-12)
    metrics.on_model("b")  # a new model starts its own correlation
    assert np.isnan(read())


def test_a_model_swap_beside_scoring_never_misaligns_the_pairs():
    """on_model (a hot swap's worker thread) against on_scores (the event loop): every reading
    works, and the pairs kept stay aligned (unlocked, a swap between the two extends broke both)."""
    metrics, stop, errors = Metrics(), threading.Event(), []

    def swap():
        while not stop.is_set():
            metrics.on_model("m")

    previous = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    swapper = threading.Thread(target=swap)
    swapper.start()
    try:
        for i in range(20_000):
            metrics.on_scores("m", ["ab", "abcd", "abcdef"], [1.0, 2.0, 3.0 + i % 2])
            if i % 500 == 0:
                try:
                    metrics.registry.get_sample_value("bradley_reward_length_correlation")
                except ValueError as exc:  # noqa: PERF203 - the failure this test looks for
                    errors.append(exc)
    finally:
        stop.set()
        swapper.join()
        sys.setswitchinterval(previous)
    assert errors == [] and len(metrics._lengths) == len(metrics._scores)


@pytest.mark.parametrize("body, field", [
    ({"items": []}, "items"),
    ({"items": "x"}, "items"),
    ({"items": [{"prompt": "p"}]}, "items[0].response"),
    ({"items": [{"prompt": None, "response": "r"}]}, "items[0].prompt"),
    ({"items": [{"prompt": [{"role": "user"}], "response": "r"}]}, "items[0].prompt[0].content"),
    ({"items": [{"prompt": [{"role": "boss", "content": "x"}], "response": "r"}]},
     "items[0].prompt[0].role"),
    ({"items": [{"prompt": "p", "response": "r"}], "group_size": 0}, "group_size"),
    ({"items": [{"prompt": "p", "response": "r"}] * 3, "group_size": 2}, "group_size"),
    ({"items": [{"prompt": "p", "response": "r"}], "advantage": "ppo"}, "advantage"),
    ([1, 2], "body"),
])
def test_score_bodies_name_the_bad_field(body, field):
    with pytest.raises(PayloadError) as info:
        parse_score(body, Limits())
    assert info.value.field == field and 400 <= info.value.status < 500


def test_huge_strings_are_refused_with_413():
    with pytest.raises(PayloadError) as info:
        parse_score({"items": [{"prompt": "p", "response": "x" * 11}]}, Limits(max_text_chars=10))
    assert (info.value.field, info.value.status) == ("items[0].response", 413)


def test_upload_bodies_object_list_or_jsonl():
    assert parse_records(b'{"a": 1}') == [{"a": 1}]
    assert parse_records(b'[{"a": 1}, {"a": 2}]') == [{"a": 1}, {"a": 2}]
    assert parse_records(b'{"a": 1}\n{"a": 2}\n') == [{"a": 1}, {"a": 2}]
    for body, field in ((b"[]", "body"), (b"[1]", "[0]"), (b'{"a": 1}\n{"a": ', "line 2"),
                        (b"\xff", "body"), (b"  ", "body")):
        with pytest.raises(PayloadError) as info:
            parse_records(body)
        assert info.value.field == field


def test_openrlhf_body_is_checked_here_and_split_by_the_template():
    req = parse_get_reward({"query": ["Q: hi A: yo", "other"], "prompts": ["Q: hi", "x"],
                            "labels": ["4", None]}, Limits())
    assert (req.queries, req.prompts, req.labels, req.single) == (
        ["Q: hi A: yo", "other"], ["Q: hi", "x"], ["4", None], False)
    assert parse_get_reward({"query": "abc", "prompts": "a"}, Limits()).prompts == ["a"]
    with pytest.raises(PayloadError, match="BRADLEY_MAX_GET_REWARD_ITEMS") as info:
        parse_get_reward({"query": ["q"] * 3}, Limits(max_get_reward_items=2))
    assert info.value.status == 413
    with pytest.raises(PayloadError, match="as long as query"):
        parse_get_reward({"query": ["q"] * 2, "labels": ["1"]}, Limits())


def test_settings_from_environment(monkeypatch):
    monkeypatch.setenv("BRADLEY_API_KEYS", " first-key-1 ,second-key-2,")
    monkeypatch.setenv("BRADLEY_SCORE_REQUIRES_KEY", "true")
    s = load_settings(port=8123)
    assert s.api_keys == ("first-key-1", "second-key-2") and s.score_requires_key and s.port == 8123


def test_bad_settings_name_the_variable_and_hide_keys(monkeypatch):
    monkeypatch.setenv("BRADLEY_API_KEYS", "short")
    with pytest.raises(SettingsError) as info:
        load_settings()
    assert "BRADLEY_API_KEYS" in str(info.value) and "short" not in str(info.value)
    monkeypatch.delenv("BRADLEY_API_KEYS")
    with pytest.raises(SettingsError, match="BRADLEY_MAX_WAIT_MS"):
        load_settings(max_wait_ms=-1)


@pytest.mark.parametrize(("threads", "omp", "device", "expected"), [
    (None, None, "cpu", "cores"),  # the single model worker takes every usable core
    (3, None, "cpu", 3),           # BRADLEY_TORCH_THREADS wins
    (None, "1", "cpu", "unchanged"),  # OMP_NUM_THREADS is the operator's: left alone
    (None, None, "cuda", "unchanged"),  # a GPU forward does not need CPU threads
])
def test_forward_threads(monkeypatch, threads, omp, device, expected):
    import os

    import torch

    from service.engine.runtime import _set_threads

    previous = torch.get_num_threads()
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    if omp:
        monkeypatch.setenv("OMP_NUM_THREADS", omp)
    torch.set_num_threads(5)
    try:
        _set_threads(threads, device)
        got = torch.get_num_threads()
    finally:
        torch.set_num_threads(previous)
    cores = len(os.sched_getaffinity(0))
    assert got == {"cores": cores, "unchanged": 5}.get(expected, expected)


def test_score_items_checked_at_once_or_one_by_one_give_the_same_request():
    """The usual body (string prompts and responses) is read in passes that run in C; any other
    falls back to the item loop, which names the item at fault."""
    plain = [{"prompt": f"p{i}", "response": f"r{i}"} for i in range(4)]
    req = parse_score({"items": plain}, Limits())
    assert (req.prompts, req.responses) == (["p0", "p1", "p2", "p3"], ["r0", "r1", "r2", "r3"])
    chat = plain[:2] + [{"prompt": [{"role": "user", "content": "hi"}], "response": "r2"}]
    assert parse_score({"items": chat}, Limits()).prompts[2] == [{"role": "user", "content": "hi"}]
    for bad, field, status in [({"prompt": 7, "response": "r"}, "items[2].prompt", 422),
                               ({"prompt": "p"}, "items[2].response", 422),
                               ({"prompt": "p", "response": "x" * 11}, "items[2].response", 413),
                               ("item", "items[2]", 422)]:
        with pytest.raises(PayloadError) as info:
            parse_score({"items": plain[:2] + [bad] + plain[2:]}, Limits(max_text_chars=10))
        assert (info.value.field, info.value.status) == (field, status)


GSM = {"ground_truth": "10", "verifier": "gsm8k"}


@pytest.mark.parametrize("items, default, want", [
    ([GSM] * 3, "", [("gsm8k", "10", None)] * 3),
    ([GSM, {"ground_truth": "b", "verifier": "exact"}], "", [("gsm8k", "10", None), ("exact", "b", None)]),
    ([{"ground_truth": "1", "data_source": "openai/gsm8k"}, {"ground_truth": "", "data_source": "openai/gsm8k"}],
     "", [("gsm8k", "1", None), None]),
    ([{"ground_truth": "1", "data_source": "someone/else"}] * 2, "", [None, None]),
    ([{"ground_truth": "1"}] * 2, "", [None, None]),
    ([{"ground_truth": "1"}] * 2, "numeric", [("numeric", "1", None)] * 2),
    ([{"ground_truth": "1"}, {}], "numeric", [("numeric", "1", None), None]),
    ([{"ground_truth": 7, "verifier": "numeric"}, {"ground_truth": "7", "verifier": "numeric"}], "",
     [("numeric", 7, None), ("numeric", "7", None)]),
    ([{"ground_truth": "7", "verifier": {"name": "numeric", "atol": 0.5}}] * 2, "",
     [("numeric", "7", {"atol": 0.5})] * 2),
])
def test_checks_at_once_or_one_by_one_agree(items, default, want):
    from rm.verify.rules import VERIFIERS
    from service.engine.rewards import parse_checks

    assert parse_checks(items, Limits(), set(VERIFIERS), default) == want


@pytest.mark.parametrize("items, field, status", [
    ([{"ground_truth": "1", "verifier": "nope"}] * 3, "items[0].verifier", 422),
    ([GSM, GSM, {"ground_truth": "x" * 11, "verifier": "gsm8k"}], "items[2].ground_truth", 413),
    ([GSM, {"ground_truth": True, "verifier": "gsm8k"}], "items[1].ground_truth", 422),
    ([GSM, {"ground_truth": "1", "verifier": 5}], "items[1].verifier", 422),
])
def test_checks_name_the_item_at_fault(items, field, status):
    from rm.verify.rules import VERIFIERS
    from service.engine.rewards import parse_checks

    with pytest.raises(PayloadError) as info:
        parse_checks(items, Limits(max_text_chars=10), set(VERIFIERS), "")
    assert (info.value.field, info.value.status) == (field, status)
