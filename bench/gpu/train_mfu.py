"""Benchmark: `bradley train rm` and `bradley train po --loss dpo` on a 135M-parameter Llama with
SmolLM2-135M's shape and random weights (MFU does not depend on the weights; a working tree that
travels to the GPU machine can carry no real ones), in bf16 autocast on CUDA. Prints, and writes to
OUT/<name>.json, one JSON line per objective: tokens/s and MFU.

Every text is longer than --max-length, so every sequence is cut to exactly max_length tokens (the
JSON line checks the truncation counts): a step of B pairs runs 2·B·T tokens, no padding. Each
objective is trained three times through the real CLI (in this process): a discarded warm-up run, then
n and 3n optimizer steps; the step time is the difference of the last two runs' train_seconds over
the 2n extra steps, which cancels start-up and the final validation.

Model FLOPs per step follow PaLM (Chowdhery et al. 2022, appendix B): 6·N + 12·L·d·T per token for
the forward and backward, N the parameters that take part in matrix products (embeddings are
look-ups; a reward model has a 1-output head instead of the vocabulary projection, which DPO's
policy does compute), L layers, d the model width, T the sequence length. Gradient-checkpointing
recomputation and padding would count as waste, not as model FLOPs. MFU = model FLOPs ÷ time ÷ the
peak: 790e12 FLOP/s, the bf16 matrix rate measured on this H200 type (the datasheet's dense figure
is ~990e12). DPO's reference log-probs are computed once before training and are not in its steps.

Worked example, the 135M shape at T = 1024: N_rm = 30 · 3,538,944 + 576 (head) = 106,168,896;
per token 6 · N_rm + 12 · 30 · 576 · 1024 = 637.0M + 212.3M = 849.4M FLOPs; a step of 16 pairs
(32,768 tokens) is 2.78e13 FLOPs, so 0.1 s per step is MFU 0.35.

    >>> matmul_parameters(SMOLLM2_135M, causal_head=False)
    106168896
    >>> round(flops_per_token(SMOLLM2_135M, 1024, causal_head=False) / 1e6, 1)
    849.4

    python3 bench/gpu/train_mfu.py --out OUT            (GPU: the 135M shape)
    python3 bench/gpu/train_mfu.py --out OUT --smoke    (CPU: a tiny shape, seconds)
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from bench.common import cli  # noqa: E402  (train_1b.py calls it as mfu.cli)

PEAK_FLOPS = 790e12
# HuggingFaceTB/SmolLM2-135M config.json: 134.5M parameters (checked in tests/bench)
SMOLLM2_135M = {"hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30,
                "num_attention_heads": 9, "num_key_value_heads": 3, "vocab_size": 49152,
                "max_position_embeddings": 8192, "rope_theta": 100000.0, "rms_norm_eps": 1e-5,
                "tie_word_embeddings": True, "hidden_act": "silu"}
TINY = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "vocab_size": 512, "max_position_embeddings": 256,
        "tie_word_embeddings": True}
PLANS = {  # shape, pairs in the store, max_length, (rm batch, dpo batch), base steps n, device
    "gpu": (SMOLLM2_135M, 640, 1024, (16, 8), 10, "cuda"),
    "smoke": (TINY, 48, 48, (4, 4), 1, "cpu"),
}
WORDS = ("the answer is correct clear precise helpful because each step follows from the last "
         "wrong vague sloppy useless however this reply misses the point entirely and rambles").split()


def build_model(folder: Path, shape: dict, texts: list[str]) -> tuple[Path, int]:
    """A tokenizer trained on `texts` (rm/model/reward_model.py's tiny recipe) and a causal LM of `shape` from a
    config with random weights, saved with save_pretrained; (folder, parameter count)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from rm.model.reward_model import build_tiny_causal_lm

    path = build_tiny_causal_lm(folder, texts, vocab_size=min(4096, shape["vocab_size"]))
    config = AutoConfig.from_pretrained(path)
    config.update(shape)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    model.save_pretrained(path)
    return path, sum(p.numel() for p in model.parameters())


def write_pairs(path: Path, n: int, words: int) -> None:
    """TRL rows whose prompt and responses are each longer than `words` tokens."""
    rng = random.Random(0)
    text = lambda k: " ".join(rng.choice(WORDS) for _ in range(k))  # noqa: E731
    with path.open("w") as f:
        for i in range(n):
            f.write(json.dumps({"prompt": f"question {i}: " + text(words // 4),
                                "chosen": text(words), "rejected": text(words)}) + "\n")


def matmul_parameters(shape: dict, causal_head: bool) -> int:
    """Parameters in matrix products: the layers, plus the vocabulary projection (causal LM) or the
    1-output score head (reward model)."""
    d, f, layers = shape["hidden_size"], shape["intermediate_size"], shape["num_hidden_layers"]
    kv = d * shape["num_key_value_heads"] // shape["num_attention_heads"]
    per_layer = 2 * d * d + 2 * d * kv + 3 * d * f   # q, o; k, v; gate, up, down
    return layers * per_layer + (shape["vocab_size"] * d if causal_head else d)


def total_parameters(shape: dict) -> int:
    """Every parameter of the causal LM with tied embeddings: embeddings, layers (+ 2 norms each),
    the final norm. SmolLM2-135M: 134,515,008.

    >>> total_parameters(SMOLLM2_135M)
    134515008
    """
    d = shape["hidden_size"]
    return shape["vocab_size"] * d + matmul_parameters(shape, False) - d + \
        shape["num_hidden_layers"] * 2 * d + d


def flops_per_token(shape: dict, seq_len: int, causal_head: bool) -> float:
    return 6 * matmul_parameters(shape, causal_head) + \
        12 * shape["num_hidden_layers"] * shape["hidden_size"] * seq_len


def measure(name: str, argv: list[str], steps: int, tokens_per_step: int, flops_per_step: float,
            device: str, work: Path, warmup: bool = True) -> dict:
    # a discarded first run takes CUDA's one-time costs (kernel loading, cuBLAS handles, the
    # allocator's first blocks), which would otherwise land in the n run alone and shrink the
    # difference: without it the RM's step time came out at 18.5 ms, an impossible MFU of 1.9
    # (`warmup=False`: the caller ran one already in this process)
    if warmup:
        cli([*argv, "--steps", str(steps), "--out", str(work / f"{name}-warmup")])
    runs = []
    for n in (steps, 3 * steps):
        if device == "cuda":
            import torch

            torch.cuda.reset_peak_memory_stats()
        started = time.perf_counter()
        metrics = json.loads(cli([*argv, "--steps", str(n), "--out", str(work / f"{name}-{n}")]))
        runs.append((n, metrics, time.perf_counter() - started))
    (n1, m1, _), (n2, m2, wall) = runs
    step_s = (m2["train_seconds"] - m1["train_seconds"]) / (n2 - n1)
    # a few tiny steps on a busy CPU (--smoke) can time shorter in the longer run: then the whole
    # longer run, overheads included, is the (pessimistic) figure
    method = "difference" if step_s > 0 else "3n_run_total"
    if step_s <= 0:
        step_s = m2["train_seconds"] / n2
    line = {"bench": f"gpu_{name}", "steps": [n1, n2], "train_seconds": [m1["train_seconds"],
            m2["train_seconds"]], "step_seconds": round(step_s, 5), "step_time_from": method, "tokens_per_step": tokens_per_step,
            "tokens_per_s": round(tokens_per_step / step_s, 1),
            "model_tflops_per_s": float(f"{flops_per_step / step_s / 1e12:.4g}"),
            "mfu": float(f"{flops_per_step / step_s / PEAK_FLOPS:.4g}"), "wall_seconds_3n_run": round(wall, 1)}
    if device == "cuda":
        import torch

        line["peak_memory_gb"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
        line["gpu"] = torch.cuda.get_device_name()
    return line | {"final": m2}


def prepare(work: Path, shape: dict, n_pairs: int, seq: int) -> tuple[str, str, int]:
    """`work` with TRL pairs written and ingested into a store, and a base model of `shape` built
    from their texts: (store path, base model folder, its parameters)."""
    work.mkdir(parents=True, exist_ok=True)
    db = str(work / "bench.duckdb")
    write_pairs(work / "pairs.jsonl", n_pairs, words=seq + 16)
    texts = [json.loads(line)["chosen"] for line in (work / "pairs.jsonl").open()][:64]
    base, parameters = build_model(work / "base", shape, texts)
    cli(["--db", db, "ingest", str(work / "pairs.jsonl"), "--format", "trl"])
    return db, str(base), parameters


def train_flags(base: str, device: str, seq: int) -> list[str]:
    """The `bradley train` flags every measured run shares."""
    return ["--base-model", base, "--device", device, "--max-length", str(seq),
            "--val-fraction", "0.05", "--eval-every", "100000", "--lr", "1e-5"]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True, help="folder for the JSON lines (and the models)")
    parser.add_argument("--work", default=None, help="scratch folder (default OUT/work)")
    parser.add_argument("--smoke", action="store_true", help="tiny shape on CPU, seconds")
    parser.add_argument("--serve-only", action="store_true",
                        help="only train the reward model bench/score_load.py serves (n steps)")
    args = parser.parse_args()
    shape, n_pairs, seq, (rm_batch, dpo_batch), steps, device = PLANS["smoke" if args.smoke else "gpu"]
    out = Path(args.out)
    work = Path(args.work or out / "work")
    db, base, parameters = prepare(work, shape, n_pairs, seq)
    common = ["--db", db, "train"]
    flags = train_flags(base, device, seq)
    if args.serve_only:  # a 135M reward model for bench/score_load.py, and no measurements
        line = json.loads(cli([*common, "rm", *flags, "--batch-size", str(rm_batch), "--steps",
                               str(steps), "--out", str(work / "rm_serve")]))
        (work / "rm_path.txt").write_text(line["path"])
        return
    results = {}
    rm_tokens = 2 * rm_batch * seq
    results["rm_train"] = measure("rm_train", [*common, "rm", *flags, "--batch-size", str(rm_batch)],
                                  steps, rm_tokens, rm_tokens * flops_per_token(shape, seq, False), device,
                                  work)
    dpo_tokens = 2 * dpo_batch * seq
    results["dpo_train"] = measure(
        "dpo_train", [*common, "po", "--loss", "dpo", *flags, "--batch-size", str(dpo_batch)], steps,
        dpo_tokens, dpo_tokens * flops_per_token(shape, seq, True), device, work)
    for name, line in results.items():
        final = line.pop("final")
        cut = final.get("n_truncated", final.get("truncated"))
        pairs = final.get("n_pairs", final.get("pairs"))
        line |= {"model": "smollm2-135m shape, random weights" if not args.smoke else "tiny (smoke)",
                 "parameters": parameters,
                 "matmul_parameters": matmul_parameters(shape, name == "dpo_train"),
                 "seq_len": seq, "device": device, "peak_flops": PEAK_FLOPS, "smoke": args.smoke,
                 "every_sequence_full": cut is not None and cut >= pairs,
                 "path": final["path"], "final_loss": final.get("train_loss", final.get("final_loss"))}
        (out / f"{name}.json").write_text(json.dumps(line) + "\n")
        print(json.dumps(line), flush=True)
    # the reward model bench/score_load.py serves next (bench/gpu/run.sh)
    (work / "rm_path.txt").write_text(results["rm_train"]["path"])


if __name__ == "__main__":
    main()
