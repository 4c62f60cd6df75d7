"""Benchmark: /score under the load pattern of PPO/GRPO trainers, against the two numbers that matter.

For a tiny reward model (hidden 64, 2 layers) and a ~5M-parameter one (hidden 256, 4 layers), both
built from a config, on (prompt, response) items from hh-rlhf (cut to 300 characters each):

1. ceiling: the offline batched forward of the same model on the same items, pre-tokenized, in
   length-sorted forwards of the server's token budget (nothing else running), the best of a
   measurement before and one after the servers ran, each taken two ways: in this process with
   every thread, and on the forward processes `bradley serve` starts on a CPU (one thread each,
   service/engine/forward_pool.py; `ceiling_before_after` has both); once the server has learned
   its forwards' cost, the same items cut by that cost too (`ceiling_cut_by_cost_after`); in
   forwards of a half and a quarter of the budget (`ceiling_by_budget`: smaller forwards can run
   faster per item, as packed ones do on a CPU); and the batch bound below: the fastest of all;
2. served: `bradley serve` (the real CLI, a separate process) driven by 64 concurrent clients over
   keep-alive HTTP/1.1, first each sending single-sample requests (OpenRLHF's newer client), then
   8-item requests; the load generator is raw asyncio (a few microseconds per request) and shares
   the machine's cores with the server;
3. naive: a server that runs one forward per request (what OpenRLHF's serve_rm.py does), same
   clients, single-sample requests;
4. overhead (tiny model): requests/s of a 1-token item (empty prompt, response "a") on `bradley
   serve` against a FastAPI hello-world endpoint on the same uvicorn, same clients:
   `overhead_ratio_vs_hello` is what the server's own per-request work leaves of the floor.

Prints one JSON line. Top-level figures are for the 5M model, single-sample requests, 64 clients:
items_per_s, p50_ms, p99_ms, ratio_vs_offline (served / ceiling), ratio_vs_offline_in_process
(served / the in-process ceiling alone, the one issue 20 was measured against), ratio_vs_per_request
(served / naive); tiny_ratio_vs_offline, tiny_batch8_ratio_vs_offline and tiny_p99_ms are the cheap model's
(where the server's overhead shows, issue 20), with overhead_ratio_vs_hello; `models` has every
phase of both models; requests_total and errors count all phases.
Goals: ratio_vs_offline >= 0.8 for both models and both request sizes, ratio_vs_per_request >= 3,
20,000 requests with zero errors.

Fairness: the in-process ceiling and the naive server use --torch-threads (default: every core this
process may use), as would `bradley serve` with BRADLEY_FORWARD_PROCESSES=0; its forward processes
and the ceiling measured on them use one each. Each phase reports the CPU share (cores busy) of the
server (with its forward processes) and of the clients, and `server_process_cpu_ms_per_request`:
the server process's own CPU per request, without its forward processes (HTTP, decoding,
tokenizing, batching: what caps a server whose forwards run on a GPU); the summary's
`process_cpu_ms_per_request` has it for the tiny model, 1-token items and hello-world.

A server with 64 single-sample clients never holds more than 64 items, so it cannot sort 1,000 by
length as the ceiling does: `batch_bound_items_per_s` is the offline forward on the same items in a
fixed random order sorted only within each 64 and cut as the server cuts them (no HTTP, no
tokenizing): by the forward cost it learned while serving (service/engine/forward_plan.py), else by its
padding limit; the most such a server could reach; `ratio_vs_batch_bound` is served / that bound.
`batch_bound_in_process_by_padding` has it at padding limits 0.1, 1 and none too (in this process,
"cost N": the learned cut), to tell whether cutting by cost beats every fixed limit on this device.
Each served phase also reads the server's /metrics: `forward_busy` (share of the phase the model
was in a forward; near 1 the forward is the limit), `forward_items_per_s` (its speed meanwhile)
and `forward_overhead_tokens` (a forward's fixed cost in padded tokens, as the server learned it).
On a CPU the forwards share the cores with the server and the clients: `cpu_bound_ratio` (per
phase; `tiny_cpu_bound_ratio`) is the most `ratio_vs_offline` their measured CPU per item leaves room
for, were the served forwards as cheap per item as the ceiling's (`cpu_bound_ratio()`).

`layout` (per model and in the summary) is how its forwards lay out their rows (RewardModel.layout:
"packed" on a CPU). Since b03781d the ceiling is the highest of more noisy rates: its ratios read
lower than earlier runs' for the same service.

On a CPU a ~100-token row already fills the matmuls, so batching gains little over a naive server:
`per_request_bound` = ceiling / `offline_single_items_per_s` (one row per forward) is the most it
could gain here. On a GPU a single-row forward leaves the device mostly idle.

    nice -n 10 .venv/bin/python bench/score_load.py [--scale 1.0]

`--model FOLDER --device cuda` benchmarks one given reward-model folder instead of the two built ones
(bench/gpu/run.sh does this on a GPU with a 135M model); `--requests N` sets every phase to N
requests, `--offline-seconds S` shortens the ceiling's timing and `--items N` cycles through N items
(for smoke runs).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench.ceiling import offline_rate  # noqa: E402
from bench.common import spawn, stop  # noqa: E402
from bench.load import CLIENTS, drive, drive_measured  # noqa: E402
from service.cli.ports import free_port  # noqa: E402  (after the path line, as the script runs)
from service.engine.runtime import AUTO_BATCH_TOKENS, AUTO_PADDING, forward_processes  # noqa: E402

CUT = 300
PADDINGS = (0.1, 1.0, float("inf"))  # padding limits the batch bound is also measured at
MODELS = {  # name -> build_tiny_reward_model arguments, requests per phase at scale 1
    "tiny": ({"hidden": 64, "layers": 2, "vocab_size": 512},
             {"single": 20_000, "batch8": 2_500, "naive": 3_000, "overhead": 5_000}),
    "5m": ({"hidden": 256, "layers": 4, "vocab_size": 4096},
           {"single": 3_000, "batch8": 500, "naive": 1_000}),
}


def hh_items(limit: int = 1000) -> list[tuple[str, str]]:
    data = Path(os.environ.get("BRADLEY_SHARED_DATA", ROOT.parent / "shared" / "data"))
    items = []
    with gzip.open(data / "hh-rlhf" / "harmless-base-test.jsonl.gz", "rt", encoding="utf-8") as f:
        for line in f:
            text = json.loads(line)["chosen"]
            cut = text.rindex("\n\nAssistant:") + len("\n\nAssistant:")
            items.append((text[:cut].strip()[-CUT:], text[cut:].strip()[:CUT] or "ok"))
            if len(items) >= limit:
                break
    return items


# --- servers ---------------------------------------------------------------------------------


REFERENCE = str(ROOT / "bench" / "reference_servers.py")  # the naive and hello-world servers


def start(argv: list[str], port: int, env: dict | None = None) -> subprocess.Popen:
    return spawn(argv, f"http://127.0.0.1:{port}/readyz", 180, f"server {argv[2:4]}", env)


def serve_argv(folder: str, port: int) -> list[str]:
    """`bradley serve` of one model folder, read-only, on `port`."""
    return [sys.executable, "-m", "service.cli", "--db", str(Path(folder).parent / "none.duckdb"),
            "serve", "--read-only", "--port", str(port), "--model", folder]


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


def overhead(folder: str, n: int, env: dict) -> dict:
    """Requests/s of a 1-token item (empty prompt, one-character response: all the server's own
    work, next to nothing of the model's) on `bradley serve`, against the hello-world server."""
    one = [("", "a")]
    port = free_port()
    server = start(serve_argv(folder, port), port, env)
    try:
        drive(port, one, CLIENTS * 4, 1, server.pid)
        scored = drive(port, one, n, 1, server.pid)
    finally:
        stop(server)
    port = free_port()
    server = start([sys.executable, REFERENCE, "hello", str(port)], port, env)
    try:
        drive(port, one, CLIENTS * 4, 1, server.pid)
        hello = drive(port, one, n, 1, server.pid)
    finally:
        stop(server)
    return {"one_token": scored, "hello": hello,
            "overhead_ratio_vs_hello": round(scored["items_per_s"] / hello["items_per_s"], 3)}


def naive(folder: str, items: list, n: dict, env: dict) -> dict:
    port = free_port()
    server = start([sys.executable, REFERENCE, "naive", folder, str(port)], port, env)
    try:
        drive(port, items, CLIENTS, 1, server.pid)
        return {"naive": drive(port, items, n["naive"], 1, server.pid)}
    finally:
        stop(server)


def cpu_bound_ratio(phase: dict, per_request: int, ceiling: float, cores: int) -> float:
    """The most `ratio_vs_offline` a served phase's own CPU leaves room for when the forwards share
    the machine's `cores`, were its forwards as cheap per item as the ceiling's:

        f / (f + s),  f = cores / ceiling (the ceiling's CPU per item, all cores busy),
                      s = (server process + clients) CPU per served item

    served items/s <= cores / (f + s): assuming the ceiling kept every core busy (one forward
    process per core), nothing else loaded the machine (a slowed ceiling makes f too high) and the
    served forwards cost at least f per item. The server process is HTTP, decoding, tokenizing and
    batching (its forward processes are the forwards). What stays between this and the measured
    ratio is the forwards' cuts and scheduling. Not for a GPU, whose forwards do not take these
    cores.

    Run 1 of issue 20's tiny model at 0a8e39b: a 1,471 items/s ceiling on 2 cores is 1.360 ms of
    CPU per item; 20,000 single-sample requests in 22.7 s, 0.415 ms of server CPU each, clients
    0.04 of a core (0.045 ms per item): s = 0.460 ms, so at most 1.360 / 1.820 = 0.747 of the
    ceiling (it served 0.599); 0.8 needs s <= 0.340 ms.

    >>> phase = {"items_per_s": 881.1, "seconds": 22.7, "requests": 20_000,
    ...          "server_process_cpu_ms_per_request": 0.415, "client_cpu_share": 0.04}
    >>> cpu_bound_ratio(phase, per_request=1, ceiling=1471, cores=2)
    0.747
    """
    items = phase["requests"] * per_request
    own = phase["server_process_cpu_ms_per_request"] * phase["requests"] / 1000
    clients = phase["client_cpu_share"] * phase["seconds"]
    forward = cores / ceiling
    return round(forward / (forward + (own + clients) / items), 3)


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
    # the forward's two ways on this machine: this process with every thread, and as many forward
    # processes as `bradley serve` starts here (0 on a GPU); the ceiling is the faster
    ways = {"in_process": 0}
    if processes := forward_processes(None, kind):
        ways["processes"] = processes

    def ceiling(overhead_tokens: float | None = None, budget: int = args.batch_tokens) -> dict:
        return {way: offline_rate(folder, items, budget, seconds=seconds, device=device,
                                  processes=p, overhead_tokens=overhead_tokens)
                for way, p in ways.items()}

    before = ceiling()
    single = offline_rate(folder, items, args.batch_tokens, rows=1, seconds=seconds / 2, device=device)
    out |= served(folder, items, n, env) | naive(folder, items, n, env)
    # the server's cuts of 64 waiting rows: by the forward cost it learned while serving, else
    # (not learned) by its padding limit; and, in this process, at padding limits instead: whether
    # cutting by cost beats every fixed limit on this device (on a GPU whose forward costs its
    # kernel launches, padding is nearly free and every cut costs a forward)
    learned = out["single"].get("forward_overhead_tokens")
    learned = float(learned) if learned is not None else None
    bound = {way: offline_rate(folder, items, args.batch_tokens, seconds=seconds, device=device,
                               seen=CLIENTS, padding=AUTO_PADDING[kind], processes=p,
                               overhead_tokens=learned)
             for way, p in ways.items()}
    by_padding = {str(limit): offline_rate(folder, items, args.batch_tokens, seconds=seconds,
                                           device=device, seen=CLIENTS, padding=limit)
                  for limit in PADDINGS if learned is not None or limit != AUTO_PADDING[kind]}
    by_padding[f"cost {learned}" if learned is not None else str(AUTO_PADDING[kind])] = \
        bound["in_process"]
    if "overhead" in n:
        out["overhead"] = overhead(folder, n["overhead"], env)
    # other work on a shared machine moves every figure: the ceiling is the best of the
    # measurements taken around the served runs
    after = ceiling()
    # the server cuts by the cost it learned: the sorted items cut so may go faster still; and
    # smaller forwards can run faster per item (packed ones on a CPU: their activations stay in
    # cache), so the sorted items in forwards of a half and a quarter of the budget too
    by_cost = ceiling(learned) if learned is not None else {}
    smaller = {budget: ceiling(budget=budget) for budget in (args.batch_tokens // 2,
                                                             args.batch_tokens // 4)}
    best = {way: max(before[way], after[way], by_cost.get(way, 0.0), bound[way],
                     *(rates[way] for rates in smaller.values())) for way in ways}
    out["ceiling_items_per_s"] = round(max(best.values()), 1)
    out["ceiling_by_budget"] = {str(budget): {way: round(rate, 1) for way, rate in rates.items()}
                                for budget, rates in smaller.items()}
    out["ceiling_before_after"] = {way: [round(before[way], 1), round(after[way], 1)] for way in ways}
    out["ceiling_cut_by_cost_after"] = {way: round(rate, 1) for way, rate in by_cost.items()}
    out["forward_processes"] = ways.get("processes", 0)
    out["offline_single_items_per_s"] = round(single, 1)
    out["batch_bound_items_per_s"] = round(max(bound.values()), 1)
    out["batch_bound_by_way"] = {way: round(rate, 1) for way, rate in bound.items()}
    out["batch_bound_in_process_by_padding"] = {cut: round(rate, 1) for cut, rate in by_padding.items()}
    out["ratio_vs_batch_bound"] = round(out["single"]["items_per_s"] / max(bound.values()), 3)
    out["per_request_bound"] = round(out["ceiling_items_per_s"] / single, 2)
    out["ratio_vs_offline"] = round(out["single"]["items_per_s"] / out["ceiling_items_per_s"], 3)
    out["batch8_ratio_vs_offline"] = round(out["batch8"]["items_per_s"] / out["ceiling_items_per_s"], 3)
    # the in-process ceiling alone (every thread: issue 20 was measured against it; it is now cut
    # both ways too), beside the stricter one
    in_process = best["in_process"]
    out["ratio_vs_offline_in_process"] = round(out["single"]["items_per_s"] / in_process, 3)
    out["ratio_vs_per_request"] = round(out["single"]["items_per_s"] / out["naive"]["items_per_s"], 2)
    if kind == "cpu":
        cores = len(os.sched_getaffinity(0))
        out["cpu_bound_ratio"] = {phase: cpu_bound_ratio(out[phase], size, out["ceiling_items_per_s"],
                                                         cores)
                                  for phase, size in (("single", 1), ("batch8", 8))}
    return out


def cheap_model_figures(tiny: dict | None) -> dict:
    """The tiny model's ratios (the server's own cost), when it ran: `--model FOLDER` benches one."""
    if tiny is None:
        return {}
    figures = {"tiny_ratio_vs_offline": tiny["ratio_vs_offline"],
               "tiny_batch8_ratio_vs_offline": tiny["batch8_ratio_vs_offline"],
               "tiny_ratio_vs_offline_in_process": tiny["ratio_vs_offline_in_process"],
               "tiny_p99_ms": tiny["single"]["p99_ms"],
               "tiny_ratio_vs_batch_bound": tiny["ratio_vs_batch_bound"],
               "tiny_forward_busy": tiny["single"]["forward_busy"],
               "tiny_forward_items_per_s": tiny["single"]["forward_items_per_s"],
               "tiny_prompt_cache_hit_share": tiny["single"]["prompt_cache_hit_share"],
               "tiny_batch_bound_share_of_ceiling": round(
                   tiny["batch_bound_items_per_s"] / tiny["ceiling_items_per_s"], 3)}
    if "cpu_bound_ratio" in tiny:
        figures["tiny_cpu_bound_ratio"] = tiny["cpu_bound_ratio"]["single"]
    if "overhead" in tiny:
        figures["overhead_ratio_vs_hello"] = tiny["overhead"]["overhead_ratio_vs_hello"]
        figures["process_cpu_ms_per_request"] = {  # the server process alone (no forward processes)
            "tiny": tiny["single"]["server_process_cpu_ms_per_request"],
            "one_token": tiny["overhead"]["one_token"]["server_process_cpu_ms_per_request"],
            "hello": tiny["overhead"]["hello"]["server_process_cpu_ms_per_request"]}
    return figures


def summary(results: dict, args) -> dict:
    name = "5m" if "5m" in results else next(iter(results))
    main_case = results[name]
    extra = [p for r in results.values() if "overhead" in r
             for p in (r["overhead"]["one_token"], r["overhead"]["hello"])]
    phases = [p for r in results.values() for p in (r["single"], r["batch8"], r["naive"])] + extra
    served_phases = [p for r in results.values() for p in (r["single"], r["batch8"])]
    return {
        "bench": "score_load", "clients": CLIENTS, "model": name, "device": args.device,
        "parameters": main_case["parameters"], "request": "single-sample",
        "items_per_s": main_case["single"]["items_per_s"], "p50_ms": main_case["single"]["p50_ms"],
        "p99_ms": main_case["single"]["p99_ms"], "ratio_vs_offline": main_case["ratio_vs_offline"],
        "ratio_vs_offline_in_process": main_case["ratio_vs_offline_in_process"],
        "ratio_vs_per_request": main_case["ratio_vs_per_request"],
        "per_request_bound": main_case["per_request_bound"],
        "cpu_bound_ratio": main_case.get("cpu_bound_ratio", {}).get("single"),
        "scores_without_mask": main_case["scores_without_mask"],
        "layout": main_case["layout"],
        **cheap_model_figures(results.get("tiny")),
        "served_requests": sum(p["requests"] for p in served_phases),
        "served_errors": sum(p["errors"] for p in served_phases),
        "requests_total": sum(p["requests"] for p in phases), "errors": sum(p["errors"] for p in phases),
        "ceiling": f"offline RewardModel.score_encoded on pre-tokenized items, globally length-sorted "
                   f"forwards of <={args.batch_tokens} padded tokens, with no server running; the "
                   f"best of {args.offline_seconds:g} s runs before and after the served runs, in "
                   "the bench process and on the forward processes bradley serve runs, cut by "
                   "the padding limit and by the forward cost the server learned, at the budget, "
                   "its half and its quarter, and the batch bound: the fastest offline rate",
        "threads": f"{args.torch_threads} intra-op thread(s) for the in-process ceiling and the "
                   "naive server (torch.set_num_threads, OMP_NUM_THREADS); one per forward process",
        "torch_threads": args.torch_threads, "batch_tokens": args.batch_tokens, "scale": args.scale,
        "cpu_count": os.cpu_count(), "load_avg_1m_at_end": round(os.getloadavg()[0], 2),
        "models": results}


def progress(name: str, figures: dict) -> dict:
    """One stderr line per benched model: a run cut short by a time limit still shows them."""
    print(f"score_load: {name}: ratio_vs_offline {figures['ratio_vs_offline']}, 8-item "
          f"{figures['batch8_ratio_vs_offline']}, {figures['single']['items_per_s']} items/s, p99 "
          f"{figures['single']['p99_ms']} ms, overhead_ratio_vs_hello "
          f"{figures.get('overhead', {}).get('overhead_ratio_vs_hello')}", file=sys.stderr)
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
    args = parser.parse_args()
    if args.batch_tokens is None:
        args.batch_tokens = AUTO_BATCH_TOKENS["cuda"] if args.device.startswith("cuda") else 4096
    import torch

    from rm.model.reward_model import build_tiny_reward_model

    torch.set_num_threads(args.torch_threads)
    items = hh_items(args.items)
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
