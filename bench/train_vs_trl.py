"""Benchmark: bradley's reward-model training against TRL's RewardTrainer on CPU.

Same Llama-style model built from a config (hidden 256, 4 layers, ~5M parameters), same 256
synthetic pairs of mixed length (about 30 to 256 tokens), batch 8, max length 256, the same number
of optimizer steps, learning rate, warmup + cosine schedule and clipping. TRL runs in a venv of its
own (tests/cached_venv.py: ~/.cache/bradley-tests/trl-<version>/, torch 2.13.0 + trl, built on
first use); it is never a dependency of bradley. Both final accuracies are measured on the same 64 held-out pairs. Both
train in fp32: RewardConfig's `bf16=True` default is turned off (see bench/dpo_vs_trl.py).

Prints one JSON line: rm_steps_per_s, trl_rm_steps_per_s, rm_speedup_vs_trl, rm_val_accuracy,
trl_val_accuracy, and the setup, then the DPO half's `dpo_*` / `trl_dpo_*` keys (bench/dpo_vs_trl.py;
`--skip-dpo` leaves them out). Run: `nice -n 10 .venv/bin/python bench/train_vs_trl.py`.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.common import WORK, ensure_trl_venv, synthetic_pairs  # noqa: E402

TRL_SCRIPT = r'''
import json, sys, time
import torch
from datasets import Dataset
from transformers import AutoModelForSequenceClassification, AutoTokenizer
from trl import RewardConfig, RewardTrainer
a = json.loads(sys.argv[1])
torch.set_num_threads(a["threads"])
tok = AutoTokenizer.from_pretrained(a["model"])
model = AutoModelForSequenceClassification.from_pretrained(a["model"], num_labels=1)
read = lambda p: Dataset.from_list([json.loads(l) for l in open(p)])
cfg = RewardConfig(output_dir=a["out"], per_device_train_batch_size=a["batch"], max_steps=a["steps"],
                   learning_rate=a["lr"], lr_scheduler_type="cosine",
                   warmup_steps=int(a["warmup"] * a["steps"]),
                   max_grad_norm=1.0, weight_decay=0.0, max_length=a["max_length"], seed=0,
                   logging_steps=10_000, save_strategy="no", eval_strategy="no", report_to=[],
                   use_cpu=True, per_device_eval_batch_size=16, disable_tqdm=True, bf16=False)
trainer = RewardTrainer(model=model, args=cfg, train_dataset=read(a["train"]),
                        eval_dataset=read(a["val"]), processing_class=tok)
out = trainer.train()
ev = trainer.evaluate()
print(json.dumps({"steps": out.global_step, "train_runtime": out.metrics["train_runtime"],
                  "val_accuracy": ev.get("eval_accuracy"), "train_rows": len(trainer.train_dataset)}))
'''


def build_model(rows: list[dict], folder: Path) -> int:
    from rm.model.reward_model import build_tiny_reward_model, count_parameters, load_backbone

    texts = [t for r in rows for t in (r["prompt"], r["chosen"], r["rejected"])]
    build_tiny_reward_model(folder, texts, hidden=256, layers=4, vocab_size=1024,
                            chat_template=False)
    return count_parameters(load_backbone(str(folder))[0])


def run_ours(args, folder: Path, train_rows: list[dict], val_rows: list[dict]) -> dict:
    import torch

    from rm.eval.pairs import accuracy
    from rm.model.reward_model import RewardModel, RewardNet, load_backbone
    from rm.train import reward_data as data
    from rm.train.loop import TrainConfig, train_loop
    from rm.train.objectives import bt_objective

    torch.manual_seed(0)
    hf, tok = load_backbone(str(folder))
    pairs = data.tokenize_pairs(tok, train_rows, args.max_length)
    lengths = pairs.lengths()

    def epoch_batches(epoch: int):
        return data.length_grouped_batches(lengths, args.batch, seed=epoch)

    config = TrainConfig(lr=args.lr, steps=args.steps, batch_size=args.batch, warmup_ratio=args.warmup,
                         max_grad_norm=1.0, patience=None)
    started = time.perf_counter()
    result = train_loop(RewardNet(hf, tok.sep_token_id), bt_objective(), epoch_batches, [], config,
                        collate=lambda idx: data.collate_pairs(pairs, idx, tok.pad_token_id))
    seconds = time.perf_counter() - started
    model = RewardModel(hf, tok, max_length=args.max_length)
    n = len(val_rows)
    scores = model.score([r["prompt"] for r in val_rows] * 2,
                         [r["chosen"] for r in val_rows] + [r["rejected"] for r in val_rows])
    import numpy as np

    acc = accuracy(np.array(scores[:n]), np.array(scores[n:]))
    return {"steps": result.steps, "seconds": seconds, "val_accuracy": acc,
            "n_truncated": pairs.n_truncated,
            "padding_share": data.padding_share(epoch_batches(0), lengths)}


def run_trl(args, folder: Path, train_rows: list[dict], val_rows: list[dict]) -> dict:
    python = ensure_trl_venv()
    # the same text our encoder renders without a chat template: prompt, blank line, response
    for name, rows in (("train", train_rows), ("val", val_rows)):
        with open(WORK / f"{name}.jsonl", "w") as f:
            for r in rows:
                f.write(json.dumps({"prompt": r["prompt"] + "\n\n", "chosen": r["chosen"],
                                    "rejected": r["rejected"]}) + "\n")
    (WORK / "trl_rm.py").write_text(TRL_SCRIPT)
    spec = {"model": str(folder), "train": str(WORK / "train.jsonl"), "val": str(WORK / "val.jsonl"),
            "out": str(WORK / "trl-out"), "batch": args.batch, "steps": args.steps, "lr": args.lr,
            "warmup": args.warmup, "max_length": args.max_length, "threads": args.threads}
    done = subprocess.run([str(python), str(WORK / "trl_rm.py"), json.dumps(spec)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"TRL run failed:\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    from bench import dpo_vs_trl

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    dpo_vs_trl.add_arguments(parser)  # the flags both halves read, and the DPO half's
    parser.add_argument("--skip-dpo", action="store_true", help="only the reward-model half")
    args = parser.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    WORK.mkdir(parents=True, exist_ok=True)
    train_rows, val_rows = synthetic_pairs(256, seed=0), synthetic_pairs(64, seed=1)
    folder = WORK / "model"
    n_params = build_model(train_rows + val_rows, folder)
    trl = run_trl(args, folder, train_rows, val_rows)
    ours = run_ours(args, folder, train_rows, val_rows)
    ours_rate, trl_rate = ours["steps"] / ours["seconds"], trl["steps"] / trl["train_runtime"]
    print(json.dumps({
        "benchmark": "train_vs_trl_rm", "n_params": n_params, "pairs": 256, "batch": args.batch,
        "max_length": args.max_length, "steps": args.steps, "threads": args.threads,
        "rm_steps_per_s": round(ours_rate, 4), "trl_rm_steps_per_s": round(trl_rate, 4),
        "rm_speedup_vs_trl": round(ours_rate / trl_rate, 3),
        "rm_val_accuracy": ours["val_accuracy"], "trl_val_accuracy": trl["val_accuracy"],
        "rm_padding_share": round(ours["padding_share"], 4), "rm_truncated_pairs": ours["n_truncated"],
        "trl_train_rows": trl["train_rows"],
        **({} if args.skip_dpo else dpo_vs_trl.run(args, WORK / "dpo", train_rows))}))


if __name__ == "__main__":
    main()
