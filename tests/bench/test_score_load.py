"""bench/score_load.py's own arithmetic: the ratios it prints (its doctest, and one by hand)."""

from __future__ import annotations

import doctest
import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def score_load():
    spec = importlib.util.spec_from_file_location("score_load", ROOT / "bench" / "score_load.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_ratios_are_served_over_offline_naive_and_the_batch_bound():
    bench = score_load()
    result = doctest.testmod(bench)
    assert result.attempted >= 1 and result.failed == 0
    # served 400 items/s single-sample and 1,600 in 8-item requests against a 2,000 items/s ceiling,
    # a 500 items/s batch bound, a naive server's 100 and 250 items/s one row per forward
    out = {"single": {"items_per_s": 400.0}, "batch8": {"items_per_s": 1600.0},
           "naive": {"items_per_s": 100.0}, "ceiling_items_per_s": 2000.0,
           "batch_bound_items_per_s": 500.0, "offline_single_items_per_s": 250.0}
    assert bench.ratios(out) == {"ratio_vs_offline": 0.2, "batch8_ratio_vs_offline": 0.8,
                                 "ratio_vs_per_request": 4.0, "ratio_vs_batch_bound": 0.8,
                                 "per_request_bound": 8.0}
