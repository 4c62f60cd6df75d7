"""The load generator of the /score benches: concurrent keep-alive clients in raw asyncio (a few
microseconds per request), the CPU each side used (the server's process alone and with its
children), and the server's forward counters meanwhile
(bench/score_load.py, bench/abuse.py)."""

from __future__ import annotations

import asyncio
import json
import sys
import time
import urllib.request

from bench.common import post, process_cpu

CLIENTS = 64


async def _one_client(port: int, bodies: list[bytes], latencies: list[float], errors: list) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        for body in bodies:
            status, _, seconds = await post(reader, writer, body)
            latencies.append(seconds)
            if status != 200:
                errors.append(status)
    except (OSError, asyncio.IncompleteReadError, ValueError, IndexError) as exc:
        errors.append(type(exc).__name__)
    finally:
        writer.close()


def drive(port: int, items: list, requests: int, per_request: int, pid: int) -> dict:
    """64 clients, each sending its share of `requests` one after another; `pid` is the server's."""
    bodies = []
    for i in range(requests):
        chosen = [items[(i * per_request + k) % len(items)] for k in range(per_request)]
        bodies.append(json.dumps({"items": [{"prompt": p, "response": r} for p, r in chosen]}).encode())
    latencies: list[float] = []
    errors: list = []

    async def main():
        shares = [bodies[c::CLIENTS] for c in range(CLIENTS)]
        await asyncio.gather(*(_one_client(port, s, latencies, errors) for s in shares if s))

    (own_cpu, server_cpu), client_cpu = process_cpu(pid), time.process_time()
    started = time.perf_counter()
    asyncio.run(main())
    seconds = time.perf_counter() - started
    own_after, server_after = process_cpu(pid)
    own_cpu, server_cpu = own_after - own_cpu, server_after - server_cpu
    client_cpu = time.process_time() - client_cpu
    latencies.sort()
    print(f"score_load: {requests} requests of {per_request} in {seconds:.1f} s", file=sys.stderr)
    pick = lambda q: round(1000 * latencies[min(len(latencies) - 1, int(q * len(latencies)))], 2)  # noqa: E731
    return {"requests": requests, "seconds": round(seconds, 2),
            "items_per_s": round(requests * per_request / seconds, 1),
            "p50_ms": pick(0.50), "p99_ms": pick(0.99), "errors": len(errors),
            "error_kinds": sorted({str(e) for e in errors})[:5],
            "server_cpu_share": round(server_cpu / seconds, 2),
            # the server process alone, without its children (verifier workers): HTTP, decoding,
            # tokenizing, batching and, on a CPU, the forwards
            "server_process_cpu_ms_per_request": round(1000 * own_cpu / requests, 3),
            "client_cpu_share": round(client_cpu / seconds, 2)}


def forward_counters(port: int) -> dict:
    """The batcher's forward series from the server's /metrics (seconds in forwards, forwards,
    rows) and its prompt cache's look-ups."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    wanted = ("bradley_forward_seconds_sum", "bradley_forward_rows_count", "bradley_forward_rows_sum",
              'bradley_prompt_cache_lookups{result="hit"}', 'bradley_prompt_cache_lookups{result="miss"}')
    return {line.split()[0]: float(line.split()[1]) for line in text.splitlines()
            if line.split(" ", 1)[0] in wanted}


def drive_measured(port: int, items: list, requests: int, per_request: int, pid: int) -> dict:
    """`drive`, plus what the model did meanwhile: `forward_busy` (share of the time the batcher
    was in a forward: near 1, the model is the limit, not the server's other work), rows per
    forward, `forward_items_per_s` (items per second of forward) and `prompt_cache_hit_share`
    (items whose prompt part came from rm/model/prompt_cache.py: these clients cycle through the items,
    so from the second pass nearly all)."""
    before = forward_counters(port)
    out = drive(port, items, requests, per_request, pid)
    after = forward_counters(port)
    spent = {k: v - before.get(k, 0.0) for k, v in after.items()}
    seconds, forwards = spent["bradley_forward_seconds_sum"], spent["bradley_forward_rows_count"]
    rows = spent["bradley_forward_rows_sum"]
    hits = spent.get('bradley_prompt_cache_lookups{result="hit"}', 0.0)
    lookups = hits + spent.get('bradley_prompt_cache_lookups{result="miss"}', 0.0)
    return out | {"forward_busy": round(seconds / out["seconds"], 3),
                  "rows_per_forward": round(rows / max(forwards, 1), 1),
                  "forward_items_per_s": round(rows / seconds, 1) if seconds else None,
                  "prompt_cache_hit_share": round(hits / lookups, 3) if lookups else None}
