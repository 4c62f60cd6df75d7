"""Benchmark: the user-facing figures of two checkouts, side by side, in one run on one machine.

    git worktree add ../before <rev>      # the code to compare against, checked out beside this one
    .venv/bin/python bench/before_after.py --before ../before [--phases score_load,verify,ingest,train]

Each phase runs the checkout's own benchmark script (its `bench/` as it was at that revision) in a
child process whose PYTHONPATH is that checkout, so both run with this venv's packages and differ
only in bradley's code; the two sides of a phase run back to back (before, then after) so a
machine's slow spell is less likely to fall on one of them. The phases:

- score_load: `/score` under 64 single-sample clients for the ~5M-parameter reward model (hidden
  256, 4 layers) built once here from hh-rlhf texts and handed to both sides (`--model`);
  `ratio_vs_offline`, `ratio_vs_per_request`, items/s, p99, errors;
- verify: verifier-only `/score` with 1,024 gsm8k items per request (`bench/verify_load.py --items
  1024 --keyed`): errors and the timeout path (a catastrophic regex comes back as `timeout`);
- ingest: `bench/ingest.py --rows N` against DuckDB's own `read_json` + INSERT;
- train: `bench/train_vs_trl.py`, the reward model and DPO against TRL on the same data.

Prints one JSON line: {"before": rev, "after": rev, phase: {"before": {...}, "after": {...}}}.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FIVE_M = {"hidden": 256, "layers": 4, "vocab_size": 4096}
KEEP = {  # phase -> the figures kept from its JSON line (dotted paths into it)
    "score_load": ["ratio_vs_offline", "ratio_vs_per_request", "items_per_s", "p99_ms", "errors",
                   "requests_total"],
    "verify": ["gsm8k.verify_ratio_vs_inprocess", "gsm8k.items_per_s", "gsm8k.p99_ms", "errors",
               "timeout_path"],
    "ingest": ["rows_per_s", "ratio_vs_duckdb_raw", "peak_rss_mb", "seconds"],
    "train": ["rm_speedup_vs_trl", "dpo_speedup_vs_trl", "dpo_cached_speedup_vs_trl",
              "rm_val_accuracy", "dpo_peak_rss_ratio"],
}


def revision(checkout: Path) -> str:
    done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=checkout,
                          capture_output=True, text=True)
    return done.stdout.strip() or "?"


def run_side(checkout: Path, argv: list[str], timeout: float) -> dict:
    """The last JSON line a bench script of `checkout` prints, with its wall seconds."""
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    started = time.perf_counter()
    try:
        done = subprocess.run([sys.executable, *argv], cwd=checkout, env=env, capture_output=True,
                              text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"failed": f"over {timeout:.0f} s"}
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode or not lines:
        return {"failed": done.returncode, "stderr": done.stderr[-1500:]}
    out = json.loads(lines[-1])
    out["bench_seconds"] = round(time.perf_counter() - started, 1)
    return out


def pick(figures: dict, paths: list[str]) -> dict:
    """The named figures (`a.b` reads figures["a"]["b"]); a missing one is left out, a failure kept."""
    if "failed" in figures:
        return figures
    kept = {"bench_seconds": figures.get("bench_seconds")}
    for path in paths:
        value = figures
        for part in path.split("."):
            value = value.get(part) if isinstance(value, dict) else None
        if value is not None:
            kept[path] = value
    return kept


def five_m_model(folder: Path) -> Path:
    """The ~5M reward model of bench/score_load.py, built by this checkout's code (same texts)."""
    sys.path.insert(0, str(ROOT))
    from bench.score_load import hh_items
    from rm.model.reward_model import build_tiny_reward_model

    items = hh_items(1000)
    return Path(build_tiny_reward_model(folder / "5m", [p + " " + r for p, r in items], **FIVE_M))


def phases(args, work: Path) -> dict[str, list[str]]:
    model = five_m_model(work) if "score_load" in args.phases else None
    return {
        "score_load": ["bench/score_load.py", "--model", str(model), "--scale", str(args.scale)],
        "verify": ["bench/verify_load.py", "--items", "1024", "--keyed", "--scale", str(args.scale)],
        "ingest": ["bench/ingest.py", "--rows", str(args.rows)],
        "train": ["bench/train_vs_trl.py"],
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--before", required=True, type=Path, help="the other checkout")
    parser.add_argument("--phases", default="score_load,verify,ingest,train")
    parser.add_argument("--scale", type=float, default=0.5, help="request counts of the load phases")
    parser.add_argument("--rows", type=int, default=1_000_000, help="rows of the ingest phase")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds per side of a phase")
    args = parser.parse_args()
    args.phases = [p.strip() for p in args.phases.split(",") if p.strip()]
    before = args.before.resolve()
    result = {"before": revision(before), "after": revision(ROOT)}
    with tempfile.TemporaryDirectory() as tmp:
        argv = phases(args, Path(tmp))
        for name in args.phases:
            result[name] = {side: pick(run_side(checkout, argv[name], args.timeout), KEEP[name])
                            for side, checkout in (("before", before), ("after", ROOT))}
            print(f"before_after: {name}: {json.dumps(result[name])}", file=sys.stderr, flush=True)
    result["load_avg_1m_at_end"] = round(os.getloadavg()[0], 2)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
