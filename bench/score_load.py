"""Benchmark: /score under the load pattern of PPO/GRPO trainers, against the two numbers that matter.

A tiny reward model (hidden 64, 2 layers) and a ~5M-parameter one (hidden 256, 4 layers), both built
from a config, score (prompt, response) items from hh-rlhf (cut to 300 characters each) three ways:
`ceiling`, their offline batched forward (pre-tokenized, length-sorted, in this process; the better of
a run before and one after the servers, `ceiling_before_after`); served, `bradley serve` driven by
bench/load.py's 64 clients with single-sample (`single`) then 8-item (`batch8`) requests; `naive`, a
one-forward-per-request server (bench/reference_servers.py, OpenRLHF serve_rm.py's shape). All three
use --torch-threads.

Prints one JSON line. Top level, the 5M model's single-sample phase: items_per_s, p50_ms, p99_ms,
ratio_vs_offline (served / ceiling), ratio_vs_per_request (served / naive), per_request_bound
(ceiling / `offline_single_items_per_s`, one row per forward: the most batching can gain here);
`tiny_*`, the tiny model's (where the server's own cost shows); requests_total and errors over every
phase. Goals: ratio_vs_offline >= 0.8 (5M), ratio_vs_per_request >= 3, zero errors. `models` holds
every phase (bench/load.py names its fields) and per model `batch_bound_items_per_s` (the offline
forward on items sorted only within each 64, as a server holding 64 single-sample requests can),
`ratio_vs_batch_bound` and `layout` (RewardModel.layout).

    nice -n 10 .venv/bin/python bench/score_load.py [--scale 1.0]

`--watch`: served items/s with BRADLEY_WATCH off and on, alternately (`watch_ratio`: on / off), and
a 3-member ensemble (`ensemble_ratio_vs_single`, `per_member_ms_per_item`). `--model FOLDER --device
cuda`: one given model instead (bench/gpu/run.sh); `--requests`, `--offline-seconds` and `--items`
shrink a smoke run.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench.ceiling import offline_rate  # noqa: E402
from bench.common import hh_rlhf_rows, spawn, stop  # noqa: E402
from bench.load import CLIENTS, drive, drive_measured  # noqa: E402
from service.engine.runtime import AUTO_BATCH_TOKENS, AUTO_PADDING  # noqa: E402
from service.ports import free_port  # noqa: E402  (after the path line, as the script runs)

CUT = 300
MODELS = {  # name -> build_tiny_reward_model arguments, requests per phase at scale 1
    "tiny": ({"hidden": 64, "layers": 2, "vocab_size": 512},
             {"single": 20_000, "batch8": 2_500, "naive": 3_000}),
    "5m": ({"hidden": 256, "layers": 4, "vocab_size": 4096},
           {"single": 3_000, "batch8": 500, "naive": 1_000}),
}


def hh_items(limit: int = 1000) -> list[tuple[str, str]]:
    items = []
    for row in hh_rlhf_rows():
        text = row["chosen"]
        cut = text.rindex("\n\nAssistant:") + len("\n\nAssistant:")
        items.append((text[:cut].strip()[-CUT:], text[cut:].strip()[:CUT] or "ok"))
        if len(items) >= limit:
            break
    return items


# --- servers ---------------------------------------------------------------------------------


REFERENCE = str(ROOT / "bench" / "reference_servers.py")  # the one-forward-per-request server


def start(argv: list[str], port: int, env: dict | None = None) -> subprocess.Popen:
    return spawn(argv, f"http://127.0.0.1:{port}/readyz", 180, f"server {argv[2:4]}", env)


def serve_argv(folder: str, port: int) -> list[str]:
    """`bradley serve` of one model folder (an ensemble: folders joined by commas), read-only, on
    `port`."""
    folders = folder.split(",")
    return [sys.executable, "-m", "service.cli", "--db", str(Path(folders[0]).parent / "none.duckdb"),
            "serve", "--read-only", "--port", str(port), *(a for f in folders for a in ("--model", f))]


# --- the run ---------------------------------------------------------------------------------


def served(folder: str, items: list, n: dict, env: dict) -> dict:
    port = free_port()
    server = start(serve_argv(folder, port), port, env)
    try:
        drive(port, items, CLIENTS * 4, 1, server.pid)  # warm-up
        return {"single": drive_measured(port, items, n["single"], 1, server.pid),
                "batch8": drive_measured(port, items, n["batch8"], 8, server.pid)}
    finally:
        stop(server)


def naive(folder: str, items: list, n: dict, env: dict) -> dict:
    port = free_port()
    server = start([sys.executable, REFERENCE, "naive", folder, str(port)], port, env)
    try:
        drive(port, items, CLIENTS, 1, server.pid)
        return {"naive": drive(port, items, n["naive"], 1, server.pid)}
    finally:
        stop(server)


def ratios(out: dict) -> dict:
    """A benched model's ratios from its phases and offline rates.

    >>> ratios({"single": {"items_per_s": 900.0}, "batch8": {"items_per_s": 1100.0},
    ...         "naive": {"items_per_s": 300.0}, "ceiling_items_per_s": 1000.0,
    ...         "batch_bound_items_per_s": 950.0, "offline_single_items_per_s": 250.0})
    {'ratio_vs_offline': 0.9, 'batch8_ratio_vs_offline': 1.1, 'ratio_vs_per_request': 3.0, \
'ratio_vs_batch_bound': 0.947, 'per_request_bound': 4.0}
    """
    served, ceiling = out["single"]["items_per_s"], out["ceiling_items_per_s"]
    return {"ratio_vs_offline": round(served / ceiling, 3),
            "batch8_ratio_vs_offline": round(out["batch8"]["items_per_s"] / ceiling, 3),
            "ratio_vs_per_request": round(served / out["naive"]["items_per_s"], 2),
            "ratio_vs_batch_bound": round(served / out["batch_bound_items_per_s"], 3),
            "per_request_bound": round(ceiling / out["offline_single_items_per_s"], 2)}


def bench_model(folder: str, items: list, requests: dict, args) -> dict:
    from rm.model.reward_model import RewardModel, count_parameters

    n = {k: args.requests or max(CLIENTS, int(v * args.scale)) for k, v in requests.items()}
    env = {"BRADLEY_MAX_BATCH_TOKENS": str(args.batch_tokens), "BRADLEY_LOG_LEVEL": "warning",
           "BRADLEY_DEVICE": args.device, "BRADLEY_TORCH_THREADS": str(args.torch_threads),
           "OMP_NUM_THREADS": str(args.torch_threads)}
    model = RewardModel.load(folder, device=args.device)
    layout = model.layout  # decided on first use (a probe forward); no scoring needed for it
    out = {"parameters": count_parameters(model.net),
           "mean_tokens": round(sum(map(len, model.encode(*zip(*items, strict=True)))) / len(items), 1),
           "scores_without_mask": model.scores_without_mask, "layout": layout}
    seconds, device = args.offline_seconds, args.device
    kind = "cuda" if device.startswith("cuda") else "cpu"
    before = offline_rate(folder, items, args.batch_tokens, seconds=seconds, device=device)
    single = offline_rate(folder, items, args.batch_tokens, rows=1, seconds=seconds / 2, device=device)
    out |= served(folder, items, n, env) | naive(folder, items, n, env)
    # the server's cuts of 64 waiting rows at its default padding limit
    bound = offline_rate(folder, items, args.batch_tokens, seconds=seconds, device=device,
                         seen=CLIENTS, padding=AUTO_PADDING[kind])
    # other work on a shared machine moves every figure: the ceiling is the better of the
    # measurements taken around the served runs
    after = offline_rate(folder, items, args.batch_tokens, seconds=seconds, device=device)
    out["ceiling_items_per_s"] = round(max(before, after), 1)
    out["ceiling_before_after"] = [round(before, 1), round(after, 1)]
    out["offline_single_items_per_s"] = round(single, 1)
    out["batch_bound_items_per_s"] = round(bound, 1)
    return out | ratios(out)


def cheap_model_figures(tiny: dict | None) -> dict:
    """The tiny model's ratios (the server's own cost), when it ran: `--model FOLDER` benches one."""
    if tiny is None:
        return {}
    figures = {"tiny_ratio_vs_offline": tiny["ratio_vs_offline"],
               "tiny_batch8_ratio_vs_offline": tiny["batch8_ratio_vs_offline"],
               "tiny_p99_ms": tiny["single"]["p99_ms"],
               "tiny_ratio_vs_batch_bound": tiny["ratio_vs_batch_bound"],
               "tiny_forward_busy": tiny["single"]["forward_busy"],
               "tiny_forward_items_per_s": tiny["single"]["forward_items_per_s"],
               "tiny_prompt_cache_hit_share": tiny["single"]["prompt_cache_hit_share"],
               "tiny_batch_bound_share_of_ceiling": round(
                   tiny["batch_bound_items_per_s"] / tiny["ceiling_items_per_s"], 3)}
    return figures


def summary(results: dict, args) -> dict:
    name = "5m" if "5m" in results else next(iter(results))
    main_case = results[name]
    phases = [p for r in results.values() for p in (r["single"], r["batch8"], r["naive"])]
    served_phases = [p for r in results.values() for p in (r["single"], r["batch8"])]
    return {
        "bench": "score_load", "clients": CLIENTS, "model": name, "device": args.device,
        "parameters": main_case["parameters"], "request": "single-sample",
        "items_per_s": main_case["single"]["items_per_s"], "p50_ms": main_case["single"]["p50_ms"],
        "p99_ms": main_case["single"]["p99_ms"], "ratio_vs_offline": main_case["ratio_vs_offline"],
        "ratio_vs_per_request": main_case["ratio_vs_per_request"],
        "per_request_bound": main_case["per_request_bound"],
        "scores_without_mask": main_case["scores_without_mask"],
        "layout": main_case["layout"],
        **cheap_model_figures(results.get("tiny")),
        "served_requests": sum(p["requests"] for p in served_phases),
        "served_errors": sum(p["errors"] for p in served_phases),
        "requests_total": sum(p["requests"] for p in phases), "errors": sum(p["errors"] for p in phases),
        "ceiling": f"offline RewardModel.score_encoded on pre-tokenized items, globally length-sorted "
                   f"forwards of <={args.batch_tokens} padded tokens, with no server running; the "
                   f"better of {args.offline_seconds:g} s runs before and after the served runs",
        "threads": f"{args.torch_threads} intra-op thread(s) for the ceiling, bradley serve and the "
                   "naive server (torch.set_num_threads, OMP_NUM_THREADS)",
        "torch_threads": args.torch_threads, "batch_tokens": args.batch_tokens, "scale": args.scale,
        "cpu_count": os.cpu_count(), "load_avg_1m_at_end": round(os.getloadavg()[0], 2),
        "models": results}


def with_reference_stats(folder: Path, items: list) -> str:
    """`folder` with the reference statistics the watch and ensembles need (half the items fit the
    latent statistics, the other half are the validation side)."""
    from rm.model.reference_stats import compute_reference_stats, write_reference_stats
    from rm.model.reward_model import RewardModel

    half = len(items) // 2
    write_reference_stats(folder, compute_reference_stats(
        RewardModel.load(folder, device="cpu"), items[:half], items[half:]))
    return str(folder)


def watch_cost(name: str, items: list, args, tmp: str) -> dict:
    """Served items/s with the watch off and on, alternately, and of a 3-member ensemble."""
    from rm.model.reward_model import build_tiny_reward_model

    shape, requests = MODELS[name]
    n = {k: args.requests or max(CLIENTS, int(v * args.scale)) for k, v in requests.items()}
    texts = [p + " " + r for p, r in items]
    folders = [with_reference_stats(build_tiny_reward_model(Path(tmp) / f"{name}-seed{seed}", texts,
                                                            seed=seed, **shape), items)
               for seed in (0, 1, 2)]
    env = {"BRADLEY_MAX_BATCH_TOKENS": str(args.batch_tokens), "BRADLEY_LOG_LEVEL": "warning",
           "BRADLEY_DEVICE": args.device, "BRADLEY_TORCH_THREADS": str(args.torch_threads),
           "OMP_NUM_THREADS": str(args.torch_threads)}
    runs = {"off": [], "on": []}
    for mode in ("off", "on", "off", "on"):
        runs[mode].append(served(folders[0], items, n, env | {"BRADLEY_WATCH": mode}))
    ensemble = served(",".join(folders), items, n, env | {"BRADLEY_WATCH": "on"})
    return {"watch_off": runs["off"], "watch_on": runs["on"], "ensemble_3": ensemble,
            **watch_ratios(runs, ensemble)}


def watch_ratios(runs: dict, ensemble: dict) -> dict:
    """The watch's and the ensemble's figures from their phases.

    >>> one = {"single": {"items_per_s": 100.0, "forward_items_per_s": 400.0},
    ...        "batch8": {"items_per_s": 200.0}}
    >>> watch_ratios({"off": [one, one], "on": [one]}, {"single": {"items_per_s": 40.0,
    ...              "forward_items_per_s": 150.0}})["ensemble_ratio_vs_single"]
    0.4
    """
    def mean(mode, phase, key="items_per_s"):
        return sum(r[phase][key] for r in runs[mode]) / len(runs[mode])

    single = ensemble["single"]
    return {"watch_ratio": round(mean("on", "single") / mean("off", "single"), 3),
            "watch_ratio_batch8": round(mean("on", "batch8") / mean("off", "batch8"), 3),
            "ensemble_ratio_vs_single": round(single["items_per_s"] / mean("on", "single"), 3),
            "per_member_ms_per_item": round(1000 / single["items_per_s"] / 3, 3),
            "single_ms_per_item": round(1000 / mean("on", "single"), 3),
            "forward_ms_per_item_per_member": round(1000 / single["forward_items_per_s"] / 3, 3),
            "single_forward_ms_per_item": round(
                1000 / mean("on", "single", "forward_items_per_s"), 3)}


def progress(name: str, figures: dict) -> dict:
    """One stderr line per benched model: a run cut short by a time limit still shows them."""
    print(f"score_load: {name}: ratio_vs_offline {figures['ratio_vs_offline']}, 8-item "
          f"{figures['batch8_ratio_vs_offline']}, {figures['single']['items_per_s']} items/s, p99 "
          f"{figures['single']['p99_ms']} ms", file=sys.stderr)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--scale", type=float, default=1.0, help="multiply every request count")
    parser.add_argument("--torch-threads", type=int, default=len(os.sched_getaffinity(0)),
                        help="forward threads of both servers and the ceiling (default: every core "
                             "this process may use, what `bradley serve` takes on a CPU)")
    parser.add_argument("--batch-tokens", type=int, default=None,
                        help="BRADLEY_MAX_BATCH_TOKENS (default 4096 on CPU, 65536 on CUDA: there a "
                             "forward's cost is its kernel launches, whatever its rows)")
    parser.add_argument("--model", default=None, metavar="FOLDER",
                        help="bench this reward-model folder (named by its folder) instead of the "
                             "two built ones")
    parser.add_argument("--device", default="cpu", help="cpu | cuda: servers and ceiling alike")
    parser.add_argument("--requests", type=int, default=None, help="requests in every phase")
    parser.add_argument("--offline-seconds", type=float, default=8.0,
                        help="timing of each offline (ceiling) run")
    parser.add_argument("--items", type=int, default=1000,
                        help="hh-rlhf items the clients cycle through and the ceiling scores")
    parser.add_argument("--watch", action="store_true",
                        help="measure the watch (off vs on) and a 3-member ensemble instead")
    parser.add_argument("--watch-models", default="tiny,5m", help="models --watch measures")
    args = parser.parse_args()
    if args.batch_tokens is None:
        args.batch_tokens = AUTO_BATCH_TOKENS["cuda"] if args.device.startswith("cuda") else 4096
    import torch

    from rm.model.reward_model import build_tiny_reward_model

    torch.set_num_threads(args.torch_threads)
    items = hh_items(args.items)
    if args.watch:
        with tempfile.TemporaryDirectory() as tmp:
            figures = {name: watch_cost(name, items, args, tmp)
                       for name in args.watch_models.split(",")}
        print(json.dumps({"bench": "score_load", "phase": "watch", "device": args.device,
                          "clients": CLIENTS, "torch_threads": args.torch_threads,
                          "scale": args.scale, "cpu_count": os.cpu_count(),
                          "load_avg_1m_at_end": round(os.getloadavg()[0], 2), "models": figures}))
        return
    if args.model:
        requests = MODELS["tiny"][1]   # the larger counts: a GPU serves faster than these CPUs
        name = Path(args.model).name
        print(json.dumps(summary({name: progress(name, bench_model(args.model, items, requests,
                                                                   args))}, args)))
        return
    with tempfile.TemporaryDirectory() as tmp:
        results = {name: progress(name, bench_model(str(build_tiny_reward_model(
            Path(tmp) / name, [p + " " + r for p, r in items], **shape)), items, requests, args))
            for name, (shape, requests) in MODELS.items()}
    print(json.dumps(summary(results, args)))


if __name__ == "__main__":
    main()
