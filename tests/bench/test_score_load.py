"""bench/score_load.py's own arithmetic: the CPU bound it prints beside its ratios (the worked
example in its docstring is issue 20's run 1, by hand)."""

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


def test_cpu_bound_ratio_is_the_ceilings_cpu_share_of_each_served_item():
    bench = score_load()
    result = doctest.testmod(bench)
    assert result.attempted >= 2 and result.failed == 0
    # 1 core, ceiling 1,000 items/s (1 ms per item); 1,000 requests of 2 items in 1 s with 0.5 ms
    # of server CPU each (0.25 ms per item) and clients at 0.25 of the core (0.125 ms per item):
    # 1 / (1 + 0.375)
    phase = {"items_per_s": 2000.0, "seconds": 1.0, "requests": 1000,
             "server_process_cpu_ms_per_request": 0.5, "client_cpu_share": 0.25}
    assert bench.cpu_bound_ratio(phase, 2, ceiling=1000, cores=1) == round(1 / 1.375, 3)
    # the more cores the same ceiling takes, the more CPU per item its forwards have to spare
    assert bench.cpu_bound_ratio(phase, 2, ceiling=1000, cores=2) == round(2 / 2.375, 3)
