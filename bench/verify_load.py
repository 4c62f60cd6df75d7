"""Benchmark: verifier-only /score under trainer load, against calling the verifiers in-process.

Items are real: reasoning-gym's gsm_symbolic problems (tests/verify_data.py builds them in a cached
venv of their own) in three variants each (the worked solution, the answer + 1, the marker removed)
for `gsm8k`; for `math`, the same answers as LaTeX (`\\boxed{N}`, `\\boxed{\\frac{2N}{2}}`,
`\\boxed{N+1}`, a bare number).

1. in-process: one loop calling `rm.verify.rules.run_verifier` on the items in this process (what a
   trainer's own reward function does), nothing else running;
2. served: `bradley serve` (the real CLI, a separate process, no reward model loaded) driven by 64
   concurrent clients over keep-alive HTTP/1.1, each request a batch of --items items; the server
   decodes each request, spreads its calls over the verifier worker processes, every call under
   the 5 s limit, and answers; the clients decode replies with orjson, as a trainer's would;
3. timeout path: the gsm8k load again with a few requests carrying a regex item that backtracks
   catastrophically (`(a+)+$` on 28 a's and a "!"): each must come back as `status: timeout` after
   about the limit while the rest keeps flowing, counted in the responses and in /metrics.

Prints one JSON line: per verifier items_per_s, p50_ms, p99_ms, inprocess_items_per_s and
verify_ratio_vs_inprocess (served / in-process); errors (HTTP errors plus `status: error` verdicts,
goal 0); timeout_path (timeouts seen, their latency, /metrics counter). Goal:
verify_ratio_vs_inprocess >= 0.7 for gsm8k on 2 cores. The load generator shares the cores.

    nice -n 10 .venv/bin/python bench/verify_load.py [--scale 1.0] [--items 64] [--keyed]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import orjson

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench.common import percentile_ms, spawn, stop  # noqa: E402
from bench.load import CLIENTS, bodies_of, metrics, run_clients  # noqa: E402
from service.ports import free_port  # noqa: E402

KEY = "bench-verify-load-key-0123"
REDOS = {"prompt": "p", "response": "a" * 28 + "!", "verifier": "regex", "ground_truth": "(a+)+$"}


def gsm_items(problems: list[dict]) -> list[dict]:
    items = []
    for p in problems:
        head, _ = p["solution"].rsplit("####", 1)
        wrong = f"{head}#### {float(p['answer']) + 1:g}"
        for response in (p["solution"], wrong, p["solution"].replace("####", "")):
            items.append({"prompt": p["question"], "response": response,
                          "ground_truth": p["answer"], "verifier": "gsm8k"})
    return items


def math_items(problems: list[dict]) -> list[dict]:
    items = []
    for p in problems:
        n = float(p["answer"])
        n_text = f"{n:g}"
        for response in (f"so \\boxed{{{n_text}}}", f"\\boxed{{\\frac{{{2 * n:g}}}{{2}}}}",
                         f"\\boxed{{{n + 1:g}}}", n_text):
            items.append({"prompt": p["question"], "response": response, "ground_truth": n_text,
                          "verifier": "math"})
    return items


def in_process(items: list[dict], seconds: float) -> tuple[float, float]:
    """(items/s, CPU µs per item) of a plain loop over the verifiers in this process."""
    from rm.verify.rules import run_verifier

    run_verifier(items[0]["verifier"], items[0]["response"], items[0]["ground_truth"])  # imports
    done, started, cpu = 0, time.perf_counter(), time.process_time()
    while time.perf_counter() - started < seconds:
        for item in items:
            run_verifier(item["verifier"], item["response"], item["ground_truth"])
        done += len(items)
    return done / (time.perf_counter() - started), 1e6 * (time.process_time() - cpu) / done


def drive(port: int, bodies: list[bytes], items_per_request: int, pid: int,
          key: str | None = None) -> dict:
    """items_per_s counts the items of answered (200) requests only."""
    statuses: dict = {}
    timeout_latencies: list[float] = []

    def count(payload: bytes, seconds: float) -> None:
        counts = orjson.loads(payload)["status_counts"]  # as a trainer would: C, not json
        for name, n in counts.items():
            statuses[name] = statuses.get(name, 0) + n
        if counts.get("timeout"):
            timeout_latencies.append(seconds)

    run = run_clients(port, bodies, pid, key, count)
    seconds, lat, errors = run["seconds"], run["latencies"], run["errors"]
    n_items = len(bodies) * items_per_request
    return {"requests": len(bodies), "items_per_s": round(run["answered"] * items_per_request / seconds, 1),
            "p50_ms": percentile_ms(lat, 0.5), "p99_ms": percentile_ms(lat, 0.99),
            "http_errors": len(errors), "error_kinds": sorted({str(e) for e in errors})[:5],
            "server_cpu_us_per_item": round(1e6 * run["server_cpu"] / n_items, 1),
            "client_cpu_us_per_item": round(1e6 * run["client_cpu"] / n_items, 1),
            "statuses": statuses, "timeout_latency_s": [round(x, 2) for x in sorted(timeout_latencies)]}


def start_server(port: int, db: str):
    env = {"BRADLEY_VERIFIER_WORKERS": "2", "BRADLEY_LOG_LEVEL": "warning", "BRADLEY_API_KEYS": KEY}
    argv = [sys.executable, "-m", "service.cli", "--db", db, "serve", "--port", str(port)]
    return spawn(argv, f"http://127.0.0.1:{port}/healthz", 120, "bradley serve", env)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--scale", type=float, default=1.0, help="multiplies the request counts")
    parser.add_argument("--items", type=int, default=64, help="items per request")
    parser.add_argument("--keyed", action="store_true",
                        help="clients send a key, as a trainer holding one does: no anonymous limits "
                             "(a keyless request is held to 262,144 characters, ~600 of these items)")
    args = parser.parse_args()
    key = KEY if args.keyed else None
    import logging

    from tests.verify_data import load_verify_data

    logging.getLogger("math_verify").setLevel(logging.ERROR)  # "timeouts are off": they are, here

    problems = load_verify_data()["gsm_symbolic"]
    sets = {"gsm8k": gsm_items(problems), "math": math_items(problems[:150])}
    requests = {"gsm8k": int(1500 * args.scale), "math": int(60 * args.scale)}
    result: dict = {"bench": "verify_load", "clients": CLIENTS, "items_per_request": args.items,
                    "keyed": args.keyed, "cores": len(os.sched_getaffinity(0))}
    with tempfile.TemporaryDirectory() as tmp:
        port = free_port()
        server = start_server(port, str(Path(tmp) / "bench.duckdb"))
        try:
            for name, items in sets.items():
                result[name] = phase(port, server.pid, items, requests[name], args.items, key)
            result["timeout_path"] = timeout_path(port, server.pid, sets["gsm8k"],
                                                  requests["gsm8k"], args.items, key)
        finally:
            stop(server)
    result["load_average_1m"] = os.getloadavg()[0]
    result["verify_ratio_vs_inprocess"] = result["gsm8k"]["verify_ratio_vs_inprocess"]
    result["errors"] = sum(result[k]["http_errors"] + result[k]["statuses"].get("error", 0)
                           for k in ("gsm8k", "math", "timeout_path"))
    print(json.dumps(result))


def phase(port: int, pid: int, items: list[dict], requests: int, per_request: int,
          key: str | None) -> dict:
    """In-process before and after the served run (the better one counts: the machine is shared),
    the served run, and their ratios: wall-clock items/s and CPU per item."""
    before = in_process(items, 3.0)
    drive(port, bodies_of(items, CLIENTS, per_request), per_request, pid, key)  # warm-up
    served = drive(port, bodies_of(items, requests, per_request), per_request, pid, key)
    best = max(before, in_process(items, 3.0))
    served.update(inprocess_items_per_s=round(best[0], 1), inprocess_cpu_us_per_item=round(best[1], 1),
                  verify_ratio_vs_inprocess=round(served["items_per_s"] / best[0], 3),
                  cpu_ratio_vs_inprocess=round(best[1] / served["server_cpu_us_per_item"], 3))
    return served


def timeout_path(port: int, pid: int, items: list[dict], requests: int, per_request: int,
                 key: str | None) -> dict:
    """The gsm8k load with 4 requests that each carry one catastrophically backtracking regex."""
    bodies = bodies_of(items, requests, per_request)
    step = len(bodies) // 4
    for i in range(4):
        value = json.loads(bodies[i * step + step // 2])
        value["items"][0] = REDOS
        bodies[i * step + step // 2] = json.dumps(value).encode()
    prefix = 'bradley_verifier_calls_total{status="timeout"'
    timeouts = lambda: sum(v for k, v in metrics(port).items() if k.startswith(prefix))  # noqa: E731
    before = timeouts()
    out = drive(port, bodies, per_request, pid, key)
    out["metrics_timeouts"] = timeouts() - before
    for key in ("server_cpu_us_per_item", "client_cpu_us_per_item"):
        out.pop(key)  # the killed workers took their CPU counts with them
    return out


if __name__ == "__main__":
    main()
