"""The load generator of the /score benches: concurrent keep-alive clients in raw asyncio (a few
microseconds per request), the CPU each side used (the server's process alone and with its
children), and the server's forward counters meanwhile
(bench/score_load.py, bench/verify_load.py)."""

from __future__ import annotations

import asyncio
import json
import sys
import time
import urllib.request

from bench.common import percentile_ms, post, process_cpu

CLIENTS = 64


async def _one_client(port: int, bodies: list[bytes], seen: dict, key: str | None, on_reply) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        for body in bodies:
            status, payload, seconds, _ = await post(reader, writer, body, key=key)
            seen["latencies"].append(seconds)
            if status != 200:
                seen["errors"].append(status)
                continue
            seen["answered"] += 1
            if on_reply:
                on_reply(payload, seconds)
    except (OSError, asyncio.IncompleteReadError, ValueError, IndexError) as exc:
        seen["errors"].append(type(exc).__name__)
    finally:
        writer.close()


def run_clients(port: int, bodies: list[bytes], pid: int, key: str | None = None,
                on_reply=None) -> dict:
    """64 clients, each sending its share of `bodies` one after another, and what they saw:
    sorted latencies, errors (statuses and exceptions), replies answered 200 (each also handed to
    `on_reply(payload, seconds)`), seconds, and CPU seconds of the server `pid` alone
    (`server_own_cpu`) and with its children (`server_cpu`) and of this process (`client_cpu`)."""
    seen: dict = {"latencies": [], "errors": [], "answered": 0}

    async def main():
        await asyncio.gather(*(_one_client(port, bodies[c::CLIENTS], seen, key, on_reply)
                               for c in range(CLIENTS) if bodies[c::CLIENTS]))

    (own_cpu, server_cpu), client_cpu = process_cpu(pid), time.process_time()
    started = time.perf_counter()
    asyncio.run(main())
    seconds = time.perf_counter() - started
    own_after, server_after = process_cpu(pid)
    seen["latencies"].sort()
    return seen | {"seconds": seconds, "server_own_cpu": own_after - own_cpu,
                   "server_cpu": server_after - server_cpu,
                   "client_cpu": time.process_time() - client_cpu}


def bodies_of(items: list, requests: int, per_request: int) -> list[bytes]:
    """`requests` /score bodies of `per_request` items each, cycling through `items`: item dicts or
    (prompt, response) pairs."""
    as_item = lambda i: i if isinstance(i, dict) else {"prompt": i[0], "response": i[1]}  # noqa: E731
    return [json.dumps({"items": [as_item(items[(i * per_request + k) % len(items)])
                                  for k in range(per_request)]}).encode() for i in range(requests)]


def drive(port: int, items: list, requests: int, per_request: int, pid: int) -> dict:
    """`requests` requests of `per_request` items over 64 clients; `pid` is the server's."""
    run = run_clients(port, bodies_of(items, requests, per_request), pid)
    seconds, latencies, errors = run["seconds"], run["latencies"], run["errors"]
    print(f"score_load: {requests} requests of {per_request} in {seconds:.1f} s", file=sys.stderr)
    return {"requests": requests, "seconds": round(seconds, 2),
            "items_per_s": round(requests * per_request / seconds, 1),
            "p50_ms": percentile_ms(latencies, 0.50), "p99_ms": percentile_ms(latencies, 0.99),
            "errors": len(errors), "error_kinds": sorted({str(e) for e in errors})[:5],
            "server_cpu_share": round(run["server_cpu"] / seconds, 2),
            # the server process alone, without its children (verifier workers): HTTP, decoding,
            # tokenizing, batching and, on a CPU, the forwards
            "server_process_cpu_ms_per_request": round(1000 * run["server_own_cpu"] / requests, 3),
            "client_cpu_share": round(run["client_cpu"] / seconds, 2)}


def metrics(port: int) -> dict[str, float]:
    """The server's /metrics: each series (name and labels) -> its value."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    return {series: float(value) for series, _, value in
            (line.rpartition(" ") for line in text.splitlines() if line and line[0] != "#")}


def drive_measured(port: int, items: list, requests: int, per_request: int, pid: int) -> dict:
    """`drive`, plus what the model did meanwhile: `forward_busy` (share of the time the batcher
    was in a forward: near 1, the model is the limit, not the server's other work), rows per
    forward, `forward_items_per_s` (items per second of forward) and `prompt_cache_hit_share`
    (items whose prompt part came from rm/model/prompt_cache.py: these clients cycle through the items,
    so from the second pass nearly all)."""
    before = metrics(port)
    out = drive(port, items, requests, per_request, pid)
    spent = {k: v - before.get(k, 0.0) for k, v in metrics(port).items()}
    seconds, forwards = spent["bradley_forward_seconds_sum"], spent["bradley_forward_rows_count"]
    rows = spent["bradley_forward_rows_sum"]
    hits = spent.get('bradley_prompt_cache_lookups{result="hit"}', 0.0)
    lookups = hits + spent.get('bradley_prompt_cache_lookups{result="miss"}', 0.0)
    return out | {"forward_busy": round(seconds / out["seconds"], 3),
                  "rows_per_forward": round(rows / max(forwards, 1), 1),
                  "forward_items_per_s": round(rows / seconds, 1) if seconds else None,
                  "prompt_cache_hit_share": round(hits / lookups, 3) if lookups else None}
