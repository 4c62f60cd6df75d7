"""Time analysis.agreement and analysis.cycles on synthetic verdicts; prints one JSON line.

    .venv/bin/python bench/analysis_stats.py [--judgments 1000000] [--prompts 100000]

Each prompt has 4 responses with Bradley–Terry scores; each judgment picks a random pair, a random
rater (40 humans, 2 AI judges) and a winner drawn from the scores, with 10% ties.
"""

from __future__ import annotations

import argparse
import json
import resource
import time

import numpy as np
import pyarrow as pa

from analysis import agreement, cycles

RESPONSES = 4


def synthetic(n_judgments: int, n_prompts: int, seed: int = 0) -> pa.Table:
    rng = np.random.default_rng(seed)
    prompt = rng.integers(0, n_prompts, n_judgments)
    a = rng.integers(0, RESPONSES, n_judgments)
    b = (a + rng.integers(1, RESPONSES, n_judgments)) % RESPONSES
    score = rng.normal(0, 1, (n_prompts, RESPONSES))
    p_a = 1 / (1 + np.exp(score[prompt, b] - score[prompt, a]))
    winner = np.where(rng.random(n_judgments) < p_a, "a", "b").astype("U3")
    winner[rng.random(n_judgments) < 0.1] = "tie"
    raters = np.array([f"human:{k}" for k in range(40)] + ["ai:judge-1:c", "ai:judge-2:c"])
    prompt_ids = np.char.add("p", prompt.astype(str))
    return pa.table({
        "prompt_id": prompt_ids,
        "response_a": np.char.add(np.char.add(prompt_ids, "-r"), a.astype(str)),
        "response_b": np.char.add(np.char.add(prompt_ids, "-r"), b.astype(str)),
        "winner": winner,
        "rater": raters[rng.integers(0, len(raters), n_judgments)],
    })


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--judgments", type=int, default=1_000_000)
    parser.add_argument("--prompts", type=int, default=100_000)
    args = parser.parse_args()
    table = synthetic(args.judgments, args.prompts)
    figures = {"n_judgments": args.judgments, "n_prompts": args.prompts}
    for name, module in (("agreement", agreement), ("cycles", cycles)):
        start = time.perf_counter()
        module.analyze(table)
        figures[f"seconds_{name}"] = round(time.perf_counter() - start, 2)
    figures["seconds_total"] = round(figures["seconds_agreement"] + figures["seconds_cycles"], 2)
    figures["peak_rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
