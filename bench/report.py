"""Benchmark: `bradley report` (analysis.report.build_report: snapshot, coding the verdicts in DuckDB,
length bias, agreement and cycles block by block, verdict) on simulated stores of several sizes.

Each store is simulated in a process of its own (10 judgments per prompt by default: 4 responses, 5
of their 6 pairs compared, 2 raters each, in sets of at most 100,000 prompts with seeds 7, 8, ...),
then each report runs in a fresh process whose peak resident set (VmHWM) is measured. Prints one JSON
line: per size the wall and CPU seconds (the fastest of --repeats), the peak RSS (the largest), the
seconds of each phase; scaling_2x (seconds at 2N / N, for the first two sizes N and 2N), rss_ratio
(peak RSS at the largest size / at the smallest), and, for 1,000,000 judgments over 100,000 prompts
(the first set alone: the store of the report it replaced), whether the report equals
bench/report_reference_1m.json (integers equal, floats within 1e-9).
Goals: 10M judgments over 1M prompts in <= 100 s and < 4 GB; rss_ratio <= 1.3; scaling_2x <= 2.2.

    nice -n 15 .venv/bin/python bench/report.py --judgments 1000000 2000000 10000000 \\
        --prompts 100000 200000 1000000 [--memory-limit 512MB] [--stores DIR]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import run_measured  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
REFERENCE = ROOT / "bench" / "report_reference_1m.json"
SET_PROMPTS = 100_000  # prompts simulated at once (the reference store is one such set)


def _config(prompts: int, per_prompt: int, seed: int):
    from annotation import simulate

    if per_prompt % 2 or per_prompt < 2:
        raise SystemExit(f"--judgments / --prompts = {per_prompt}: use an even number (2 raters a pair)")
    pairs = per_prompt // 2
    responses = next(k for k in range(2, 100) if k * (k - 1) // 2 >= pairs)
    return simulate.SimulationConfig(prompts=prompts, responses=responses, pairs_per_prompt=pairs,
                                     raters_per_pair=2, raters=8, seed=seed)


def build_store(path: str, judgments: int, prompts: int) -> None:
    """Simulate into a new store, a set of prompts at a time; sets after the first get their own
    prompt texts (one more batch each)."""
    from annotation import simulate
    from annotation.store import Store

    with Store(path) as store:
        for first in range(0, prompts, SET_PROMPTS):
            n = min(SET_PROMPTS, prompts - first)
            config = _config(n, judgments // prompts, 7 + first // SET_PROMPTS)
            if first == 0:
                simulate.load_into(store, config)
                continue
            columns, truth = simulate.simulate_arrays(config)
            columns["prompt"] = columns["prompt"] + f" (set {first // SET_PROMPTS})"
            source = f"bench-report:{prompts}:{first}"
            sha, tables = simulate.store_tables(columns, source=source)
            store.write_batch(source, sha, truth["n_judgments"], tables)


def measure_report(path: str, memory_limit: str) -> None:
    """One report; prints seconds, CPU seconds (every thread), phase seconds and the report."""
    from analysis import report
    from annotation.store import Store

    timings: dict = {}
    with Store(path) as store:
        started, started_cpu = time.perf_counter(), time.process_time()
        built = report.build_report(store, memory_limit=memory_limit, timings=timings)
        seconds, cpu = time.perf_counter() - started, time.process_time() - started_cpu
    print(json.dumps({"seconds": seconds, "cpu": cpu, "phases": timings, "report": built},
                     default=str))


def differences(got, want, path="") -> list[str]:
    """Where two reports differ: integers and strings unequal, floats more than 1e-9 apart."""
    if isinstance(want, dict):
        if not isinstance(got, dict) or set(got) != set(want):
            return [f"{path}: keys"]
        return [d for key in want for d in differences(got[key], want[key], f"{path}.{key}")]
    if isinstance(want, list):
        if not isinstance(got, list) or len(got) != len(want):
            return [f"{path}: length"]
        return [d for i, (g, w) in enumerate(zip(got, want, strict=True))
                for d in differences(g, w, f"{path}[{i}]")]
    if isinstance(want, float) and isinstance(got, int | float):
        return [] if math.isclose(got, want, rel_tol=0, abs_tol=1e-9) else [f"{path}: {got} != {want}"]
    return [] if got == want and type(got) is type(want) else [f"{path}: {got!r} != {want!r}"]


def _run_size(folder: Path, judgments: int, prompts: int, args) -> dict:
    store = folder / f"report-{judgments}-{prompts}.duckdb"
    if not store.exists():
        started = time.perf_counter()
        run_measured([sys.executable, __file__, "--build", str(store), "--judgments", str(judgments),
                      "--prompts", str(prompts)], folder, f"build-{judgments}")
        print(f"built {store.name} in {time.perf_counter() - started:.0f} s", file=sys.stderr)
    runs = []
    for repeat in range(args.repeats):
        out, peak = run_measured([sys.executable, __file__, "--measure", str(store), "--memory-limit",
                                  args.memory_limit], folder, f"report-{judgments}-{repeat}")
        runs.append({**json.loads(out.strip().splitlines()[-1]), "peak_rss_mb": peak})
    best = min(runs, key=lambda r: r["seconds"])
    result = {"judgments": judgments, "prompts": prompts, "seconds": round(best["seconds"], 2),
              "cpu_seconds": round(min(r["cpu"] for r in runs), 2),
              "peak_rss_mb": round(max(r["peak_rss_mb"] for r in runs), 1),
              "phases": {k: round(v, 2) for k, v in best["phases"].items()},
              "n_cyclic_triads": best["report"]["cycles"]["n_cyclic_triads"]}
    if (judgments, prompts) == (1_000_000, SET_PROMPTS):
        built = {k: v for k, v in best["report"].items() if k != "snapshot_id"}
        wrong = differences(json.loads(json.dumps(built)), json.loads(REFERENCE.read_text()))
        result.update(matches_reference=not wrong, reference_differences=wrong[:5])
    if not args.stores:
        store.unlink()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--judgments", type=int, nargs="+", default=[1_000_000, 2_000_000, 10_000_000])
    parser.add_argument("--prompts", type=int, nargs="+", default=[100_000, 200_000, 1_000_000])
    parser.add_argument("--memory-limit", default="512MB", help="handed to build_report (DuckDB)")
    parser.add_argument("--repeats", type=int, default=1, help="reports per size, each a fresh process")
    parser.add_argument("--stores", default=None, help="keep (and reuse) the stores in this folder")
    parser.add_argument("--build", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--measure", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.build:
        return build_store(args.build, args.judgments[0], args.prompts[0])
    if args.measure:
        return measure_report(args.measure, args.memory_limit)
    if len(args.judgments) != len(args.prompts):
        raise SystemExit("give as many --prompts as --judgments")
    with tempfile.TemporaryDirectory(prefix="bradley-bench-report-") as tmp:
        folder = Path(args.stores or tmp)
        folder.mkdir(parents=True, exist_ok=True)
        sizes = [_run_size(folder, n, m, args) for n, m in zip(args.judgments, args.prompts, strict=True)]
    out = {"bench": "report", "memory_limit": args.memory_limit, "sizes": sizes,
           "rss_ratio": round(sizes[-1]["peak_rss_mb"] / sizes[0]["peak_rss_mb"], 3),
           "goal": {"seconds_10m": 100, "peak_rss_mb_10m": 4096, "rss_ratio": 1.3, "scaling_2x": 2.2},
           "repeats": args.repeats, "load_average": round(os.getloadavg()[0], 2)}
    if len(sizes) >= 2 and sizes[1]["judgments"] == 2 * sizes[0]["judgments"]:
        out["scaling_2x"] = round(sizes[1]["seconds"] / sizes[0]["seconds"], 3)
        out["cpu_scaling_2x"] = round(sizes[1]["cpu_seconds"] / sizes[0]["cpu_seconds"], 3)
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
