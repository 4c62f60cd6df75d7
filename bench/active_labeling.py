"""Benchmark: does `--select uncertain` earn its place? Active labeling on simulated data with known
truth, against random selection, with the same seeds.

Data: `bradley simulate` (honest raters answering by the simulator's model P(a) = σ(κ(q_a − q_b)), no
length bias, ties or cycles; every pair of every prompt judged once). A share of the prompts is held
out: their pairs with different true quality (the source model's θ in OUT.truth.json) are the
validation set, and a reward model's accuracy is the share it orders like the truth. The other
prompts' pairs are the pool.

Labeling runs in rounds of 100 pairs: each pushed pair is answered by the simulator's verdict for it,
a tiny reward model is retrained from scratch on every label so far (`bradley ingest` + `bradley
train rm --base-model tiny`, in-process through the CLI), and the next round is chosen by
annotation.label_studio.selection (`uncertain`: |σ(r_a − r_b) − ½| smallest under the last model, scored with
`RewardModel.load(path).score`; `random`). The first round is random for both. The selection
functions are called directly, as `bradley label-studio push` calls them, without a Label Studio
server.

Prints one JSON line: accuracy after each round for both strategies (mean over runs, and each run),
`uncertain_vs_random_at_400` (ratio of mean accuracies at 400 labels), and
`uncertain_labels_to_match_random_800` (the fewest labels at which uncertain's mean accuracy reaches
random's at 800; the goal is <= 600). Run: `nice -n 10 .venv/bin/python bench/active_labeling.py`.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from annotation.label_studio import selection  # noqa: E402
from bench.common import cli  # noqa: E402

CHECKPOINTS = (200, 400, 800)


def simulated(work: Path, prompts: int, seed: int) -> tuple[list[dict], dict]:
    out = work / "sim.jsonl"
    cli(["simulate", str(out), "--prompts", str(prompts), "--responses", "4", "--raters", "2",
         "--raters-per-pair", "1", "--noisy-share", "0", "--adversarial-share", "0", "--ai-raters",
         "0", "--length-bias", "0", "--cycle-rate", "0", "--tie-rate", "0", "--seed", str(seed)])
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    return rows, json.loads(Path(f"{out}.truth.json").read_text())


def split(rows: list[dict], truth: dict, val_share: float) -> tuple[list[dict], list[tuple]]:
    """(pool rows, validation (prompt, better, worse)) by prompt: the last prompts are held out."""
    order = list(dict.fromkeys(r["prompt"] for r in rows))
    held = set(order[int(len(order) * (1 - val_share)):])
    quality = truth["source_quality"]
    pool = [r for r in rows if r["prompt"] not in held]
    val = []
    for r in rows:
        qa, qb = quality[r["model_a"]], quality[r["model_b"]]
        if r["prompt"] in held and qa != qb:
            val.append((r["prompt"], *((r["response_a"], r["response_b"]) if qa > qb
                                       else (r["response_b"], r["response_a"]))))
    return pool, val


def train(work: Path, labeled: list[dict], tag: str, seed: int, epochs: float):
    """A tiny reward model trained on `labeled`; returns the loaded model."""
    from rm.model.reward_model import RewardModel

    folder = work / tag
    folder.mkdir()
    data = folder / "labels.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in labeled))
    db = str(folder / "store.duckdb")
    cli(["--db", db, "ingest", str(data)])
    cli(["--db", db, "train", "rm", "--base-model", "tiny", "--epochs", str(epochs),
         "--val-fraction", "0", "--seed", str(seed), "--out", str(folder / "rm")])
    model = RewardModel.load(folder / "rm", device="cpu")
    shutil.rmtree(folder / "rm")
    return model


def scores(model, items: list[tuple[str, str]]) -> np.ndarray:
    """The model's reward for each (prompt, response), each distinct one scored once."""
    distinct = list(dict.fromkeys(items))
    values = dict(zip(distinct, model.score([p for p, _ in distinct], [r for _, r in distinct]),
                      strict=True))
    return np.asarray([values[item] for item in items])


def accuracy(model, val: list[tuple]) -> float:
    better = scores(model, [(p, b) for p, b, _ in val])
    worse = scores(model, [(p, w) for p, _, w in val])
    return float(np.mean(better > worse))


def run(strategy: str, pool: list[dict], val: list[tuple], seed: int, args, work: Path) -> dict:
    """Accuracy after each round of `args.round` labels, for one strategy and seed."""
    rng = np.random.default_rng(seed)
    labeled = list(rng.choice(len(pool), args.round, replace=False))  # round 1: random for both
    acc = {}
    while True:
        n = len(labeled)
        if strategy == "uncertain" or n in CHECKPOINTS:
            model = train(work, [pool[i] for i in labeled], f"{strategy}-{seed}-{n}", seed, args.epochs)
            acc[n] = accuracy(model, val)
        if n >= args.max_labels:
            return acc
        rest = np.setdiff1d(np.arange(len(pool)), labeled)
        cols = {"prompt_id": [pool[i]["prompt"] for i in rest]}
        rewards = None
        if strategy == "uncertain":
            rewards = tuple(scores(model, [(pool[i]["prompt"], pool[i][f"response_{s}"]) for i in rest])
                            for s in "ab")
        picked = selection.select(strategy, cols, args.round, seed=seed + n, scores=rewards)
        labeled += list(rest[picked])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--prompts", type=int, default=500)
    parser.add_argument("--val-share", type=float, default=0.15)
    parser.add_argument("--round", type=int, default=100)
    parser.add_argument("--max-labels", type=int, default=800)
    parser.add_argument("--epochs", type=float, default=2.0)
    args = parser.parse_args()
    began = time.monotonic()
    torch.set_num_threads(1)  # a 0.16M-parameter model: one thread is fastest on shared cores
    work = Path(tempfile.mkdtemp(prefix="bradley-active-"))
    try:
        rows, truth = simulated(work, args.prompts, seed=0)
        pool, val = split(rows, truth, args.val_share)
        results = {s: [run(s, pool, val, seed, args, work) for seed in range(args.runs)]
                   for s in ("random", "uncertain")}
    finally:
        shutil.rmtree(work, ignore_errors=True)
    mean = {s: {n: round(float(np.mean([r[n] for r in runs])), 4) for n in runs[0]}
            for s, runs in results.items()}
    target = mean["random"][max(mean["random"])]
    match = next((n for n in sorted(mean["uncertain"]) if mean["uncertain"][n] >= target), None)
    at = 400 if 400 in mean["random"] else min(mean["random"])
    print(json.dumps({
        f"uncertain_vs_random_at_{at}": round(mean["uncertain"][at] / mean["random"][at], 4),
        "uncertain_labels_to_match_random_800": match, "goal_labels": 600,
        "accuracy_mean": mean, "accuracy_runs": {s: [{str(k): round(v, 4) for k, v in r.items()}
                                                      for r in runs] for s, runs in results.items()},
        "pool_pairs": len(pool), "val_pairs": len(val), "runs": args.runs, "round": args.round,
        "epochs": args.epochs, "seconds": round(time.monotonic() - began, 1)}))


if __name__ == "__main__":
    main()
