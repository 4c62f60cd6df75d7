"""RLAIF labelling speed with `--principles all` on the default constitution, with and without prefix
reuse, on the same pairs in one run; prints one JSON line.

    .venv/bin/python bench/label.py [--judge FOLDER] [--pairs 12] [--data ../shared/data/llmbar/LLMBar_Natural.json]

Every pair is judged in both orders under each of the default constitution's principles (5), so a
pair is 10 judge sequences. Without reuse each sequence runs whole (sorted by length, batched);
with reuse the part every principle of a presentation shares (the conversation and both responses)
runs once and its KV cache serves the principles' tails. The judge defaults to a 5.2M-parameter
Llama built from a config (hidden 256, 4 layers); pass --judge a SmolLM2 folder
(`bradley models prepare smollm2`) for the real model. Figures: `label_pairs_per_s` (with reuse),
`label_pairs_per_s_no_reuse`, `label_prefix_speedup` (their ratio; goal >= 2), and whether both
ways gave the same probabilities.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch

from annotation.rlaif.constitution import load_constitution
from annotation.rlaif.orders import plan
from rm.judge.local import LocalJudge
from rm.model.reward_model import build_tiny_causal_lm

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "llmbar" / "LLMBar_Natural.json"


def pairs(path: Path, n: int) -> list[tuple[str, str, str]]:
    rows = json.loads(path.read_text())[:n]
    return [(r["input"], r["output_1"], r["output_2"]) for r in rows]


def items(data, constitution) -> list[tuple]:
    tasks = plan([str(i) for i in range(len(data))], constitution, "all")
    out = []
    for t in tasks:
        prompt, a, b = data[t.comparison]
        first, second = (a, b) if t.order == "ab" else (b, a)
        out.append((prompt, first, second, constitution.principles[t.principle].text))
    return out


def timed(judge: LocalJudge, work: list[tuple], repeats: int) -> tuple[float, list[float]]:
    judge.prefer(work[:10])  # warm-up: allocator, kernels, tokenizer caches
    best, probs = float("inf"), []
    for _ in range(repeats):
        started = time.perf_counter()
        probs = judge.prefer(work)
        best = min(best, time.perf_counter() - started)
    return best, probs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--judge", default=None, help="a causal LM folder (default: a 5.2M tiny Llama)")
    parser.add_argument("--pairs", type=int, default=12)
    parser.add_argument("--data", default=str(DATA))
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    constitution = load_constitution("default")
    data = pairs(Path(args.data), args.pairs)
    folder = args.judge or str(build_tiny_causal_lm(
        tempfile.mkdtemp(), [p + a + b for p, a, b in data], hidden=256, layers=4, vocab_size=2048))
    work = items(data, constitution)
    shared = LocalJudge(folder, constitution.split, batch_size=args.batch_size, reuse_prefix=True)
    flat = LocalJudge("", constitution.split, batch_size=args.batch_size, reuse_prefix=False,
                      model=shared.model, tokenizer=shared.tokenizer)
    t_flat, p_flat = timed(flat, work, args.repeats)
    t_shared, p_shared = timed(shared, work, args.repeats)
    print(json.dumps({
        "bench": "label", "judge": args.judge or "tiny-llama-5.2M", "pairs": len(data),
        "principles": len(constitution.principles), "sequences": len(work),
        "label_pairs_per_s": round(len(data) / t_shared, 3),
        "label_pairs_per_s_no_reuse": round(len(data) / t_flat, 3),
        "label_prefix_speedup": round(t_flat / t_shared, 3),
        "max_abs_prob_diff": round(max(abs(a - b) for a, b in zip(p_flat, p_shared, strict=True)), 7),
        "threads": args.threads}))


if __name__ == "__main__":
    main()
