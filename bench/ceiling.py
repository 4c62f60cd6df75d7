"""The offline ceiling of /score benches: how fast the model scores pre-tokenized items with no
server, no HTTP and no tokenizing, in the cuts a given server would make (bench/score_load.py)."""

from __future__ import annotations

import sys
import time


def offline_rate(model_dir: str, items: list, budget: int, rows: int = 256,
                 seconds: float = 8.0, device: str = "cpu", seen: int | None = None,
                 padding: float = float("inf")) -> float:
    """Items/s of RewardModel.score_encoded on pre-tokenized items in globally length-sorted
    forwards of at most `rows` rows and `budget` padded tokens (rows=1: one forward per item).
    `seen=N`: items in a fixed random order, sorted only within each N (what a server sees when
    N single-sample clients wait at once: the batch bound), cut into forwards as the server's
    batcher cuts a batch (service.engine.batcher.plan_forwards; `padding`: its BRADLEY_MAX_PADDING
    default, service.engine.runtime.AUTO_PADDING)."""
    import random

    from rm.model.reward_model import RewardModel
    from service.engine.batcher import plan_forwards

    model = RewardModel.load(model_dir, device=device)
    if rows == 1:  # one forward per item: a quarter of them (on the H200 each took 31 ms)
        items = random.Random(1).sample(items, len(items) // 4)
    ids = model.encode([p for p, _ in items], [r for _, r in items])
    order = random.Random(0).sample(range(len(ids)), len(ids))
    groups = [order[k:k + seen] for k in range(0, len(ids), seen)] if seen else [order]
    forwards = [[ids[g[i]] for i in f] for g in groups
                for f in plan_forwards([len(ids[i]) for i in g], budget, rows, padding)]
    model.score_encoded(forwards[0])  # warm-up
    started, done = time.perf_counter(), 0
    while done < 2 * len(ids) or time.perf_counter() - started < seconds:
        for forward in forwards:
            model.score_encoded(forward)
        done += len(ids)
    seconds = time.perf_counter() - started
    print(f"score_load: offline {done} items (rows {rows}) in {seconds:.1f} s", file=sys.stderr)
    return done / seconds
