"""Benchmark: build the full report (snapshot, verdict table, length bias, agreement, cycles, verdict)
on 1,000,000 simulated judgments over 100,000 prompts and on 2,000,000 over 200,000.

Prints one JSON line: seconds_1m, seconds_2m, scaling_2x (= seconds_2m / seconds_1m), peak_rss_mb,
the same in CPU seconds (cpu_*), and the seconds of each stage (reading the verdict table, then
each analysis) measured again on the same store after the timed build.
Goal: seconds_1m <= 60 on a 2-core machine and scaling_2x <= 2.2.

    .venv/bin/python bench/report.py [--scale 1.0]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from analysis import report  # noqa: E402
from annotation import simulate  # noqa: E402
from annotation.store import Store  # noqa: E402


def _config(judgments: int) -> simulate.SimulationConfig:
    # 4 responses per prompt, 5 of their 6 pairs compared, 2 raters each: 10 judgments per prompt.
    return simulate.SimulationConfig(prompts=judgments // 10, responses=4, pairs_per_prompt=5,
                                     raters_per_pair=2, raters=8, seed=7)


def _timed_build(folder: str, judgments: int, repeats: int) -> tuple[dict, dict, Store]:
    """Best of `repeats` builds, wall-clock and CPU seconds (all threads of this process). The
    machine is shared: the minimum is the least disturbed run, and CPU time shows the algorithm's
    own scaling when other processes compete for the cores."""
    store = Store(Path(folder) / f"bench-{judgments}.duckdb")
    simulate.load_into(store, _config(judgments))
    wall = cpu = math.inf
    for _ in range(repeats):
        started, started_cpu = time.perf_counter(), time.process_time()
        built = report.build_report(store)
        wall = min(wall, time.perf_counter() - started)
        cpu = min(cpu, time.process_time() - started_cpu)
    return {"wall": wall, "cpu": cpu}, built, store


def _sections(store: Store) -> dict:
    started = time.perf_counter()
    table = store.verdict_arrays()
    seconds = {"verdict_arrays": round(time.perf_counter() - started, 2)}
    for name, analyze in report._analyses().items():
        started = time.perf_counter()
        analyze(table)
        seconds[name] = round(time.perf_counter() - started, 2)
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=float, default=1.0, help="fraction of the full sizes (smoke runs)")
    parser.add_argument("--repeats", type=int, default=2, help="builds per size; the fastest counts")
    args = parser.parse_args()
    n1 = int(1_000_000 * args.scale)
    with tempfile.TemporaryDirectory() as folder:
        seconds_1m, built, store = _timed_build(folder, n1, args.repeats)
        sections = _sections(store)
        store.close()
        seconds_2m, _, store = _timed_build(folder, 2 * n1, args.repeats)
        sections_2m = _sections(store)
        store.close()
    print(json.dumps({
        "judgments": [n1, 2 * n1],
        "seconds_1m": round(seconds_1m["wall"], 2),
        "seconds_2m": round(seconds_2m["wall"], 2),
        "scaling_2x": round(seconds_2m["wall"] / seconds_1m["wall"], 3),
        "cpu_seconds_1m": round(seconds_1m["cpu"], 2),
        "cpu_seconds_2m": round(seconds_2m["cpu"], 2),
        "cpu_scaling_2x": round(seconds_2m["cpu"] / seconds_1m["cpu"], 3),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "sections_1m": sections,
        "sections_2m": sections_2m,
        "goal": {"seconds_1m": 60, "scaling_2x": 2.2},
        "repeats": args.repeats, "load_average": round(os.getloadavg()[0], 2),
        "n_cyclic_triads_1m": built["cycles"].get("n_cyclic_triads"),
    }), flush=True)


if __name__ == "__main__":
    main()
