"""Benchmark: can callers without a key starve the trainers?

`bradley serve` (the real CLI, a separate process, default settings, the tiny reward model of
bench/score_load.py built from a config) is driven twice for --seconds each:

1. without abusers: 64 normal clients, each sending single-item /score requests (hh-rlhf texts cut
   to 300 characters) one after another over keep-alive HTTP/1.1, and a prober sending GET /healthz
   every 20 ms on a connection of its own;
2. with abusers: the same, plus --abusers clients that send the largest /score request a caller
   without a key may send (BRADLEY_ANON_MAX_REQUEST_CHARS characters in all, items of
   --item-chars characters of real text) in a loop, from another address (127.0.0.2, so the
   per-client bound of the abusers is theirs, not the normal clients').

Every client is anonymous, as OpenRLHF's and TRL's are by default. Prints one JSON line: the
normal clients' p50/p99 and /healthz p99 in both phases, normal_p99_ratio = with / without (goal
<= 3), healthz_p99_ms with abusers (goal <= 100 on 2 cores), the normal clients' non-2xx count
(goal 0), and what the abusers got (statuses, characters scored per second).

    nice -n 10 .venv/bin/python bench/abuse.py [--seconds 15] [--abusers 4]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import percentile_ms, post, process_cpu  # noqa: E402
from bench.score_load import MODELS, free_port, hh_items, serve_argv, start, stop  # noqa: E402

ABUSER_ADDRESS = "127.0.0.2"  # the whole 127.0.0.0/8 is loopback on Linux
PROBE_EVERY_S = 0.02


async def _loop(port: int, deadline: float, method: str, path: str, body: bytes, out: dict,
                source: str | None = None, pause: float = 0.0) -> None:
    """Send the same request until the deadline, reconnecting when told to (or when dropped)."""
    conn = None
    while time.perf_counter() < deadline:
        try:
            if conn is None:
                conn = await asyncio.open_connection(
                    "127.0.0.1", port, local_addr=(source, 0) if source else None)
            status, _, seconds, close = await post(*conn, body, path, method=method)
            out["latencies"].append(seconds)
            out["statuses"][status] += 1
            if close:
                conn[1].close()
                conn = None
        except (OSError, asyncio.IncompleteReadError, ValueError, IndexError) as exc:
            out["statuses"][type(exc).__name__] += 1
            conn = None
        if pause:
            await asyncio.sleep(pause)
    if conn is not None:
        conn[1].close()


def _bodies(items: list, budget: int, item_chars: int) -> tuple[list[bytes], bytes]:
    normal = [json.dumps({"items": [{"prompt": p, "response": r}]}).encode() for p, r in items]
    text = " ".join(p + " " + r for p, r in items)
    n = budget // item_chars
    abusive = [{"prompt": text[i:i + 24], "response": text[i + 24:i + item_chars]}
               for i in range(0, n * 7, 7)]
    return normal, json.dumps({"items": abusive}).encode()


def phase(port: int, pid: int, normal: list[bytes], abusive: bytes, args, abusers: int) -> dict:
    results = {name: {"latencies": [], "statuses": Counter()} for name in ("normal", "healthz",
                                                                         "abuse")}

    async def main():
        deadline = time.perf_counter() + args.seconds
        tasks = [_loop(port, deadline, "POST", "/score", normal[c % len(normal)], results["normal"])
                 for c in range(args.clients)]
        tasks.append(_loop(port, deadline, "GET", "/healthz", b"", results["healthz"],
                           pause=PROBE_EVERY_S))
        tasks += [_loop(port, deadline, "POST", "/score", abusive, results["abuse"],
                        source=ABUSER_ADDRESS) for _ in range(abusers)]
        await asyncio.gather(*tasks)

    cpu, started = process_cpu(pid)[1], time.perf_counter()
    asyncio.run(main())
    seconds = time.perf_counter() - started
    out = {"server_cpu_share": round((process_cpu(pid)[1] - cpu) / seconds, 2)}
    for name, r in results.items():
        lat = sorted(r["latencies"])
        out[name] = {"requests": len(lat), "p50_ms": percentile_ms(lat, 0.5, 1),
                     "p99_ms": percentile_ms(lat, 0.99, 1),
                     "statuses": {str(k): v for k, v in sorted(r["statuses"].items(), key=str)}}
    out["normal"]["items_per_s"] = round(len(results["normal"]["latencies"]) / seconds, 1)
    return out


def non_2xx(statuses: dict) -> int:
    return sum(v for k, v in statuses.items() if not k.startswith("2"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--abusers", type=int, default=4)
    parser.add_argument("--item-chars", type=int, default=1024,
                        help="characters per abusive item (prompt + response)")
    args = parser.parse_args()
    from rm.model.reward_model import build_tiny_reward_model
    from service.api.settings import Settings

    defaults = Settings()
    items = hh_items(1000)
    normal, abusive = _bodies(items, defaults.anon_max_request_chars, args.item_chars)
    with tempfile.TemporaryDirectory() as tmp:
        folder = str(build_tiny_reward_model(Path(tmp) / "rm-tiny", [p + " " + r for p, r in items],
                                             **MODELS["tiny"][0]))
        port = free_port()
        server = start(serve_argv(folder, port), port,
                       {"BRADLEY_LOG_LEVEL": "warning", "BRADLEY_DEVICE": "cpu"})
        try:
            warm = argparse.Namespace(**{**vars(args), "seconds": 3.0})
            phase(port, server.pid, normal, abusive, warm, abusers=0)
            calm = phase(port, server.pid, normal, abusive, args, abusers=0)
            abused = phase(port, server.pid, normal, abusive, args, abusers=args.abusers)
        finally:
            stop(server)
    print(json.dumps(summary(calm, abused, args, defaults, len(abusive))))


def summary(calm: dict, abused: dict, args, defaults, abusive_bytes: int) -> dict:
    return {
        "bench": "abuse",
        "healthz_p99_ms": abused["healthz"]["p99_ms"],
        "normal_p99_ratio": round(abused["normal"]["p99_ms"] / calm["normal"]["p99_ms"], 2),
        "normal_non_2xx": non_2xx(calm["normal"]["statuses"]) + non_2xx(abused["normal"]["statuses"]),
        "without_abusers": calm, "with_abusers": abused,
        "abusive_request": {"chars": defaults.anon_max_request_chars, "item_chars": args.item_chars,
                            "items": defaults.anon_max_request_chars // args.item_chars,
                            "bytes": abusive_bytes, "abusers": args.abusers},
        "clients": args.clients, "seconds_per_phase": args.seconds, "cores": len(os.sched_getaffinity(0)),
        "goals": "healthz_p99_ms <= 100 on 2 cores, normal_p99_ratio <= 3, normal_non_2xx 0",
    }


if __name__ == "__main__":
    main()
