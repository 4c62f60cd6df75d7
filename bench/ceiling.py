"""The offline ceiling of /score benches: how fast the model scores pre-tokenized items with no
server, no HTTP and no tokenizing, in the cuts a given server would make (bench/score_load.py)."""

from __future__ import annotations

import sys
import time


def offline_rate(model_dir: str, items: list, budget: int, rows: int = 256,
                 seconds: float = 8.0, device: str = "cpu", seen: int | None = None,
                 padding: float = float("inf"), processes: int = 0,
                 overhead_tokens: float | None = None) -> float:
    """Items/s of RewardModel.score_encoded on pre-tokenized items in globally length-sorted
    forwards of at most `rows` rows and `budget` padded tokens (rows=1: one forward per item).
    `seen=N`: items in a fixed random order, sorted only within each N (what a server sees when
    N single-sample clients wait at once: the batch bound), cut into forwards as the server cuts
    them (`padding`: its BRADLEY_MAX_PADDING default, service.engine.runtime.AUTO_PADDING; or, given
    `overhead_tokens`, by cost as a server that learned that overhead cuts them, each forward at
    most a share of its pool per forward process: service/engine/forward_plan.py).
    `processes=N`: the same forwards on N forward processes of one thread each, N at a time
    (service/engine/forward_pool.py, what `bradley serve` runs on a CPU), instead of in this process."""
    import random

    from rm.model.reward_model import RewardModel
    from service.engine.forward_plan import cut_pool

    model = RewardModel.load(model_dir, device=device)
    if rows == 1:  # one forward per item: a quarter of them (on the H200 each took 31 ms)
        items = random.Random(1).sample(items, len(items) // 4)
    ids = model.encode([p for p, _ in items], [r for _, r in items])
    order = random.Random(0).sample(range(len(ids)), len(ids))
    groups = [order[k:k + seen] for k in range(0, len(ids), seen)] if seen else [order]
    forwards = [[ids[g[i]] for i in f] for g in groups
                for f in cut_pool([len(ids[i]) for i in g], budget, rows, padding, overhead_tokens,
                                  processes)]
    if processes:
        done, seconds = _pool_run(model_dir, forwards, processes, seconds)
    else:
        model.score_encoded(forwards[0])  # warm-up
        started, done = time.perf_counter(), 0
        while done < 2 * len(ids) or time.perf_counter() - started < seconds:
            for forward in forwards:
                model.score_encoded(forward)
            done += len(ids)
        seconds = time.perf_counter() - started
    print(f"score_load: offline {done} items (rows {rows}, processes {processes}) in {seconds:.1f} s",
          file=sys.stderr)
    return done / seconds


def _pool_run(model_dir: str, forwards: list, processes: int, seconds: float) -> tuple[int, float]:
    """Items done and seconds taken by `processes` forward processes (one feeding thread each)
    going through `forwards` together, for at least `seconds`."""
    import threading

    from service.engine.forward_pool import ForwardPool

    pool = ForwardPool(model_dir, processes)
    lock, progress = threading.Lock(), {"next": 0, "done": 0}

    def feed(until: float) -> None:
        while time.perf_counter() < until:
            with lock:
                forward = forwards[progress["next"] % len(forwards)]
                progress["next"] += 1
            pool.score_encoded(forward)
            with lock:
                progress["done"] += len(forward)

    try:
        for _ in range(processes):
            pool.score_encoded(forwards[0])  # warm-up
        started = time.perf_counter()
        feeders = [threading.Thread(target=feed, args=(started + seconds,)) for _ in range(processes)]
        for feeder in feeders:
            feeder.start()
        for feeder in feeders:
            feeder.join()
        return progress["done"], time.perf_counter() - started
    finally:
        pool.close()
