"""Benchmark: which covariance of the final hidden state the watch's out-of-distribution test uses
(rm/model/reference_stats.py): diagonal (rank 0) or low rank plus diagonal (ranks 4 to 64).

A tiny reward model is trained on hh-rlhf pairs (`--model FOLDER`: a given one instead); its
latent mean and covariance are fitted on the training pairs' responses, the 99th percentile of the
Mahalanobis distance is taken on one half of the validation responses, and for each rank:

* `held_out_beyond_p99`: the share of the other half of the validation responses beyond it (the
  false-positive rate; 0.01 is what the percentile promises);
* per out-of-distribution set, `share` beyond it and `auroc` of the distance against the held-out
  half: random printable ASCII, random Cyrillic letters, random emoji (each as long as the
  validation response it replaces), and each validation response repeated six times (long).

    nice -n 10 .venv/bin/python bench/watch_covariance.py [--model FOLDER] [--steps 60]

Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench.common import hh_rlhf_rows  # noqa: E402

RANKS = (0, 4, 8, 16, 32, 64)


def hh_rows() -> list[dict]:
    from rm.eval.pairs import _hh

    rows = []
    for i, raw in enumerate(hh_rlhf_rows()):
        try:
            row = _hh(raw)
        except ValueError:
            continue
        rows.append({**row, "prompt_id": f"hh-{i}", "p_chosen": 1.0})
    return rows


def train(rows: list[dict], out: Path, steps: int) -> Path:
    from rm.train.loop import TrainConfig
    from rm.train.reward import RewardRunConfig, train_reward_model
    from rm.train.run import RunInputs

    train_reward_model(RewardRunConfig(base_model="tiny", out=str(out), device="cpu", max_length=128,
                                       train=TrainConfig(steps=steps, batch_size=16)),
                       RunInputs(pairs=rows, snapshot_id="hh"))
    return out


def shifted(items: list[tuple], seed: int = 0) -> dict[str, list[tuple]]:
    rnd = random.Random(seed)
    cyrillic = "абвгдежзийклмнопрстуфхцчшщыэюя "
    return {"ascii": [(p, "".join(chr(rnd.randint(33, 126)) for _ in r)) for p, r in items],
            "cyrillic": [(p, "".join(rnd.choice(cyrillic) for _ in r)) for p, r in items],
            "emoji": [(p, "".join(chr(rnd.randint(0x1F600, 0x1F64F))
                                  for _ in range(max(1, len(r) // 4)))) for p, r in items],
            "long": [(p, " ".join([r] * 6)) for p, r in items]}


def auroc(inside: np.ndarray, outside: np.ndarray) -> float:
    """P(an outside distance > an inside one), ties counting half (the Mann-Whitney U statistic)."""
    from scipy.stats import mannwhitneyu

    return float(mannwhitneyu(outside, inside).statistic / (len(inside) * len(outside)))


def separation(latent, states, inside: np.ndarray, p99: float) -> dict:
    distances = latent.distance(states).numpy()
    return {"share": round(float((distances > p99).mean()), 3),
            "auroc": round(auroc(inside, distances), 3)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default=None, metavar="FOLDER")
    parser.add_argument("--steps", type=int, default=60, help="training steps of the tiny model")
    args = parser.parse_args()
    import torch

    from rm.model.reference_stats import collect, fit_latent
    from rm.model.reward_model import RewardModel
    from rm.train.reward_data import split_of

    torch.set_num_threads(len(os.sched_getaffinity(0)))
    rows = hh_rows()
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(args.model) if args.model else train(rows, Path(tmp) / "rm", args.steps)
        model = RewardModel.load(folder, device="cpu")
        sides = {"train": [], "val": []}
        for r in rows:
            sides[split_of(r["prompt_id"], 0.1)] += [(r["prompt"], r["chosen"]),
                                                     (r["prompt"], r["rejected"])]
        half = len(sides["val"]) // 2
        _, fit = collect(model, sides["train"][::2])
        _, calibrate = collect(model, sides["val"][:half])
        _, held_out = collect(model, sides["val"][half:])
        outside = {name: collect(model, items)[1]
                   for name, items in shifted(sides["val"][half:]).items()}
    ranks = {}
    for rank in RANKS:
        latent = fit_latent(fit, rank)
        p99 = float(np.quantile(latent.distance(calibrate).numpy(), 0.99))
        inside = latent.distance(held_out).numpy()
        ranks[str(rank)] = {"held_out_beyond_p99": round(float((inside > p99).mean()), 4),
                            **{name: separation(latent, states, inside, p99)
                               for name, states in outside.items()}}
    print(json.dumps({"bench": "watch_covariance",
                      "model": str(args.model or f"tiny, {args.steps} steps"),
                      "hidden": int(fit.shape[1]), "fit_items": len(fit),
                      "held_out_items": len(held_out),
                      "seconds": round(time.perf_counter() - started, 1), "ranks": ranks}))


if __name__ == "__main__":
    main()
