"""The watch's windows by hand, its bounded runs, and what reaches the gauges and GET /watch."""

from __future__ import annotations

import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from rm.model.reference_stats import ReferenceStats
from service.api.payloads import PayloadError
from service.engine.ensemble import Scored
from service.engine.watch import OTHER_RUN, Watch, WatchGauges, Window, run_of

REF = ReferenceStats(score_mean=1.0, score_std=2.0, score_quantiles={}, length_correlation=0.1,
                     response_chars_mean=4.0, mahalanobis_p99=5.0, n_val=100, n_fit=100,
                     hidden_dim=8, rank=2)


def test_a_window_summarises_its_last_items_by_hand():
    window = Window(4)
    window.extend([9.0, 0.0, 1.0, 2.0, 3.0], [99, 2, 4, 6, 8], [7, 1, 1, 2, 3],
                  [0.0, 1.0, 6.0, 2.0, 9.0], [0.5] * 5)
    s = window.summary(ood_beyond=5.0, chars_reference=4.0)
    assert s["items"] == 4 and s["reward_z_mean"] == 1.5
    assert s["reward_z_p50"] == 1.5 and s["reward_z_p05"] == pytest.approx(0.15)
    assert s["reward_length_correlation"] == pytest.approx(1.0)  # chars = 2 z + 2
    assert s["response_chars"] == 5.0 and s["response_chars_ratio"] == 1.25
    assert s["duplicate_share"] == 0.25  # 1, 1, 2, 3: one repeat in four
    assert s["ood_share"] == 0.5  # 6 and 9 lie beyond 5
    assert s["disagreement"] == 0.5


def test_undefined_signals_are_nan_not_errors():
    window = Window(8)
    window.extend([1.0, 1.0], [3, 3], [1, 2], [0.0, 0.0], None)
    s = window.summary(ood_beyond=1.0, chars_reference=3.0)
    assert np.isnan(s["reward_length_correlation"]) and np.isnan(s["disagreement"])


def test_runs_are_named_by_the_body_or_the_header():
    assert run_of({"run": "ppo-7b/3"}, {}) == "ppo-7b/3"
    assert run_of({}, {"x-bradley-run": "grpo"}) == "grpo"
    assert run_of({}, {}) == "default"
    for bad in ("", "a b", "x" * 65, 7):
        with pytest.raises(PayloadError, match="run: must be 1-64"):
            run_of({"run": bad}, {})


def served(raw: list[float], distances: list[float], model: str = "rm-a") -> Scored:
    return Scored(model, raw, {model: raw}, {}, {model: distances})


@pytest.fixture
def watch():
    registry = CollectorRegistry()
    w = Watch(WatchGauges(registry), window=100, max_runs=2)
    w.install({"rm-a": REF})
    w.registry = registry
    yield w
    w.close()


def gauge(watch, name: str, **labels) -> float:
    return watch.registry.get_sample_value(f"bradley_watch_{name}", labels)


def test_reward_is_measured_in_validation_stds_and_runs_beyond_the_limit_count_as_other(watch):
    watch.record("ppo", ["abcd", "abcdefgh"], served([3.0, 5.0], [1.0, 7.0]))
    for run in ("grpo", "third", "fourth"):
        watch.record(run, ["x"], served([1.0], [0.0]))
    watch.refresh()
    assert gauge(watch, "reward_z", model="rm-a", run="ppo", stat="mean") == 1.5  # (1 + 2) / 2
    assert gauge(watch, "response_chars_ratio", model="rm-a", run="ppo") == 1.5
    assert gauge(watch, "ood_share", model="rm-a", run="ppo") == 0.5
    assert gauge(watch, "items", model="rm-a", run=OTHER_RUN) == 2
    assert gauge(watch, "reference_length_correlation", model="rm-a") == 0.1
    runs = watch.snapshot()["models"]["rm-a"]["runs"]
    assert set(runs) == {"ppo", "grpo", OTHER_RUN}
    assert runs["ppo"]["current"]["disagreement"] is None  # NaN as null in JSON
    assert len(runs["ppo"]["history"]) == 1


def test_a_new_model_drops_the_old_windows_and_records_of_other_models_are_ignored(watch):
    watch.record("ppo", ["a"], served([1.0], [0.0]))
    watch.refresh()
    watch.install({"rm-b": REF})
    watch.record("ppo", ["a"], served([1.0], [0.0], model="rm-a"))  # scored before the swap
    watch.refresh()
    models = watch.snapshot()["models"]
    assert list(models) == ["rm-b"] and models["rm-b"]["runs"] == {}
    assert gauge(watch, "items", model="rm-a", run="ppo") is None


def test_nothing_is_kept_while_nothing_is_watched():
    w = Watch(WatchGauges(CollectorRegistry()))
    w.install(None, "model rm-x has no reference statistics")
    w.record("ppo", ["a"], served([1.0], [0.0]))
    snapshot = w.snapshot()
    assert not snapshot["watching"] and "reference statistics" in snapshot["reason"]
    assert w._pending == []
