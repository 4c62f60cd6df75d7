"""Benchmark: bradley's DPO (`bradley train po --loss dpo`) against TRL's DPOTrainer (sigmoid loss).

The DPO half of bench/train_vs_trl.py (which imports `run` from here); alone it prints its own JSON
line. Same ~5M-parameter Llama-style causal LM built from a config (hidden 256, 4 layers), the
same 256 synthetic pairs, batch 8, max length 256, the same optimizer steps, learning rate, warmup
+ cosine schedule and clipping, CPU, 2 threads. Each side runs as its own process, so its peak RSS
(VmHWM, bench/peak_rss.py) is its own.

Ours runs end to end through the CLI on a fresh store, each optimizer step over a batch of 8 pairs
taken as micro-batches of `--micro-batch` pairs (default 1: `--batch-size 1 --grad-accum 8`) with
accumulated gradients: the same optimizer steps as TRL's, with the activations of one pair at a
time. The first run includes the one-time reference pass in its time (`dpo_steps_per_s`); a second
run on the same store finds every reference log-prob cached (`dpo_cached_steps_per_s`). Both give
`dpo_peak_rss_mb`. A third run takes the CLI's defaults (`--batch-size 8`, cut by rm/train/policy.py's
token budget per forward into `dpo_default_micro_batches` micro-batches of 4 pairs): `dpo_default_*`,
faster and larger. One more child per side stops where training would begin (imports, model,
tokenized data, reference log-probs cached; TRL's trainer built): their peaks (`*_floor_rss_mb`)
split each peak into what the process holds anyway and what training adds (`*_train_rss_mb`).
TRL's DPOConfig turns gradient checkpointing on by default; that is left as it is. Its `bf16=True`
default is turned off: both sides train in fp32, the precision whose first losses are compared; on
CPUs without native bf16 (AVX2-only, as the development machine of 2026-12-02) TRL's bf16 autocast
is emulated and about 60x slower, which would measure the CPU, not the trainer. The transformers
import in our process leaves scipy out (rm/model/reward_model.py: import_modeling); TRL's venv has no scipy.

`--lora` measures something else: the peak RSS of our DPO in full and with `--lora-rank`
(default 16) on one larger policy (hidden 768, 8 layers, ~60M parameters, 2 steps of 2 pairs at
64 tokens), where weights, gradients and AdamW's moments outweigh the imports; a LoRA run holds
the frozen weights once and the optimizer state of the adapters only.

Run: `nice -n 10 .venv/bin/python bench/dpo_vs_trl.py` (TRL's venv is created on first use), or
`... bench/dpo_vs_trl.py --lora`.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.common import ROOT, WORK, ensure_trl_venv, run_measured, synthetic_pairs  # noqa: E402

TRL_DPO_SCRIPT = r'''
import json, sys
import torch
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import DPOConfig, DPOTrainer
a = json.loads(sys.argv[1])
torch.set_num_threads(a["threads"])
tok = AutoTokenizer.from_pretrained(a["model"])
model = AutoModelForCausalLM.from_pretrained(a["model"])
rows = [json.loads(l) for l in open(a["train"])]
cfg = DPOConfig(output_dir=a["out"], per_device_train_batch_size=a["batch"], max_steps=a["steps"],
                learning_rate=a["lr"], lr_scheduler_type="cosine", warmup_steps=a["warmup_steps"],
                max_grad_norm=1.0, weight_decay=0.0, beta=a["beta"], loss_type=["sigmoid"],
                max_length=a["max_length"], seed=0, logging_steps=1, save_strategy="no",
                eval_strategy="no", report_to=[], use_cpu=True, disable_tqdm=True, bf16=False)
trainer = DPOTrainer(model=model, args=cfg, train_dataset=Dataset.from_list(rows), processing_class=tok)
if a.get("floor"):  # everything up to the first step: imports, model, tokenized dataset
    print("{}")
    sys.exit()
out = trainer.train()
losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
print(json.dumps({"steps": out.global_step, "train_runtime": out.metrics["train_runtime"],
                  "first_loss": losses[0], "final_loss": losses[-1]}))
'''


# `bradley train po` up to its first step, through its own stages (rm/train/policy.py), with the run's
# config built directly: the snapshot's rows, the policy, the tokenized pairs and the reference
# log-probs (cached by the measured runs).
OUR_FLOOR_SCRIPT = r'''
import json, sys
import shutil
import torch
from annotation.store import Store
from rm.model import device as devices
from rm.train import policy as policy_run
from rm.train.loop import TrainConfig
from rm.train.run import RunInputs, new_plan
from rm.train.objectives import PoConfig
a = json.loads(sys.argv[1])
config = policy_run.PolicyRunConfig(base_model=a["model"], max_length=a["max_length"], val_fraction=0,
                                    train=TrainConfig(batch_size=a["batch_size"]),
                                    objective=PoConfig(loss="dpo", beta=a["beta"]))
device, info = torch.device("cpu"), devices.Dist()
devices.set_threads(device, info)
shutil.rmtree("floor_model", ignore_errors=True)
with Store(a["db"]) as store:
    plan = new_plan("po", "floor_model", RunInputs(pairs=store.pairs(a["snapshot"])))
model, tokenizer, data = policy_run._prepare(config, plan, device, info)
with Store(a["db"]) as store:
    policy_run._reference(config, model, tokenizer, data, store, device, info)
shutil.rmtree(plan["partial"])
print(json.dumps(data.stats))
'''


def build_policy(rows: list[dict], folder: Path) -> int:
    """The tiny causal LM, without a chat template so both sides render `prompt\\n\\nresponse`."""
    from rm.model.reward_model import build_tiny_causal_lm, count_parameters, load_causal_lm

    texts = [t for r in rows for t in (r["prompt"], r["chosen"], r["rejected"])]
    build_tiny_causal_lm(folder, texts, hidden=256, layers=4, vocab_size=1024)
    model, tok = load_causal_lm(str(folder))
    tok.chat_template = None
    (folder / "chat_template.jinja").unlink(missing_ok=True)
    tok.save_pretrained(folder)
    return count_parameters(model)


def run_ours(args, work: Path, folder: Path, rows: list[dict]) -> dict:
    """Two CLI runs on one fresh store: the first fills the reference cache, the second hits it."""
    db = work / "dpo.duckdb"
    db.unlink(missing_ok=True)
    data = work / "dpo_pairs.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    bradley = [sys.executable, "-m", "service.cli", "--db", str(db)]
    subprocess.run(bradley + ["ingest", str(data), "--format", "trl"], check=True, cwd=ROOT,
                   capture_output=True)
    train = bradley + ["train", "po", "--loss", "dpo", "--base-model", str(folder), "--steps",
                       str(args.steps), "--max-length", str(args.max_length), "--lr", str(args.lr),
                       "--warmup-ratio", str(args.warmup), "--val-fraction", "0", "--beta", str(args.beta)]
    env = {"PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": str(args.threads)}
    # batches of 8 pairs as micro-batches of --micro-batch pairs with accumulated gradients: the
    # same optimizer steps, the activations of one micro-batch at a time
    micro = ["--batch-size", str(args.micro_batch), "--grad-accum", str(args.batch // args.micro_batch)]
    runs = {}
    for name, shape in (("first", micro), ("cached", micro), ("default_cached", ["--batch-size", str(args.batch)])):
        shutil.rmtree(work / name, ignore_errors=True)
        out, rss = run_measured(train + shape + ["--out", str(work / name)], work, name, env)
        runs[name] = {**json.loads(out.strip().splitlines()[-1]), "peak_rss_mb": rss}
    (work / "our_floor.py").write_text(OUR_FLOOR_SCRIPT)
    spec = {"db": str(db), "snapshot": runs["first"]["snapshot_id"], "model": str(folder),
            "max_length": args.max_length, "batch_size": args.micro_batch, "beta": args.beta}
    floor = [sys.executable, str(work / "our_floor.py"), json.dumps(spec)]
    out, runs["floor_rss_mb"] = run_measured(floor, work, "our_floor", env)
    assert json.loads(out)["ref_computed"] == 0, "the floor probe must find the cache filled"
    return runs


def run_trl(args, work: Path, folder: Path, rows: list[dict]) -> dict:
    python = ensure_trl_venv()
    data = work / "trl_dpo.jsonl"
    # the text our encoder renders without a chat template: prompt, blank line, response, eos
    data.write_text("".join(json.dumps({"prompt": r["prompt"] + "\n\n", "chosen": r["chosen"],
                                        "rejected": r["rejected"]}) + "\n" for r in rows))
    (work / "trl_dpo.py").write_text(TRL_DPO_SCRIPT)
    spec = {"model": str(folder), "train": str(data), "out": str(work / "trl-dpo-out"),
            "batch": args.batch, "steps": args.steps, "lr": args.lr,
            "warmup_steps": int(args.warmup * args.steps),  # as rm/train/loop.py rounds it
            "max_length": args.max_length, "threads": args.threads, "beta": args.beta}
    out, rss = run_measured([str(python), str(work / "trl_dpo.py"), json.dumps(spec)], work, "trl_dpo")
    _, floor = run_measured([str(python), str(work / "trl_dpo.py"), json.dumps({**spec, "floor": True})],
                            work, "trl_dpo_floor")
    return {**json.loads(out.strip().splitlines()[-1]), "peak_rss_mb": rss, "floor_rss_mb": floor}


def run(args, work: Path, rows: list[dict]) -> dict:
    """The DPO figures, as keys of the shared JSON line."""
    from rm.train.policy import micro_split

    work.mkdir(parents=True, exist_ok=True)
    folder = work / "policy"
    n_params = build_policy(rows, folder)
    trl = run_trl(args, work, folder, rows)
    ours = run_ours(args, work, folder, rows)
    first, cached, default = ours["first"], ours["cached"], ours["default_cached"]
    rate, cached_rate, default_rate = (r["steps"] / (r["ref_seconds"] + r["train_seconds"])
                                       for r in (first, cached, default))
    trl_rate = trl["steps"] / trl["train_runtime"]
    trl_peak = trl["peak_rss_mb"]
    peak = max(first["peak_rss_mb"], cached["peak_rss_mb"])
    return {
        "dpo_n_params": n_params, "dpo_steps": args.steps, "dpo_micro_batch": args.micro_batch,
        "dpo_steps_per_s": round(rate, 4), "dpo_cached_steps_per_s": round(cached_rate, 4),
        "trl_dpo_steps_per_s": round(trl_rate, 4),
        "dpo_speedup_vs_trl": round(rate / trl_rate, 3),
        "dpo_cached_speedup_vs_trl": round(cached_rate / trl_rate, 3),
        "dpo_ref_seconds": first["ref_seconds"], "dpo_ref_computed": first["ref_computed"],
        "dpo_cached_ref_computed": cached["ref_computed"],
        "dpo_peak_rss_mb": round(peak, 1), "trl_dpo_peak_rss_mb": round(trl_peak, 1),
        "dpo_peak_rss_ratio": round(peak / trl_peak, 3),
        # the CLI's defaults: micro-batches of 4 pairs, reference log-probs cached
        "dpo_default_micro_batches": micro_split(args.batch, args.max_length),
        "dpo_default_cached_steps_per_s": round(default_rate, 4),
        "dpo_default_cached_speedup_vs_trl": round(default_rate / trl_rate, 3),
        "dpo_default_peak_rss_mb": round(default["peak_rss_mb"], 1),
        "dpo_default_peak_rss_ratio": round(default["peak_rss_mb"] / trl_peak, 3),
        # what each process holds before its first step (imports, model, tokenized data), and what
        # training adds on top: at 5M parameters the fixed part is most of either peak
        "dpo_floor_rss_mb": round(ours["floor_rss_mb"], 1),
        "trl_dpo_floor_rss_mb": round(trl["floor_rss_mb"], 1),
        "dpo_floor_share_of_trl_peak": round(ours["floor_rss_mb"] / trl_peak, 3),
        "dpo_train_rss_mb": round(peak - ours["floor_rss_mb"], 1),
        "dpo_default_train_rss_mb": round(default["peak_rss_mb"] - ours["floor_rss_mb"], 1),
        "trl_dpo_train_rss_mb": round(trl_peak - trl["floor_rss_mb"], 1),
        "trl_dpo_gradient_checkpointing": True,  # DPOConfig's default in TRL 1.16
        "trl_dpo_bf16": False,  # both sides fp32 (module docstring)
        "dpo_first_loss": round(first["first_loss"], 6), "trl_dpo_first_loss": round(trl["first_loss"], 6),
        "dpo_final_loss": round(first["final_loss"], 6), "trl_dpo_final_loss": round(trl["final_loss"], 6),
        "dpo_truncated": first["truncated"],
    }


def run_lora(args, work: Path, rows: list[dict]) -> dict:
    """Peak RSS of `bradley train po --loss dpo` in full and with `--lora-rank`, on one larger
    policy (hidden --lora-hidden, --lora-layers layers: there the weights, their gradients and
    AdamW's two moments outweigh the imports), each run in its own process on its own store."""
    from rm.model.reward_model import build_tiny_causal_lm, count_parameters, load_causal_lm

    work.mkdir(parents=True, exist_ok=True)
    folder = work / "policy"
    texts = [t for r in rows for t in (r["prompt"], r["chosen"], r["rejected"])]
    build_tiny_causal_lm(folder, texts, hidden=args.lora_hidden, layers=args.lora_layers, vocab_size=1024)
    n_params = count_parameters(load_causal_lm(str(folder))[0])
    data = work / "pairs.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    env = {"PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": str(args.threads)}
    runs = {}
    for name, extra in (("full", []), ("lora", ["--lora-rank", str(args.lora_rank)])):
        db = work / f"{name}.duckdb"
        db.unlink(missing_ok=True)
        bradley = [sys.executable, "-m", "service.cli", "--db", str(db)]
        subprocess.run(bradley + ["ingest", str(data), "--format", "trl"], check=True, cwd=ROOT,
                       capture_output=True)
        shutil.rmtree(work / name, ignore_errors=True)
        train = bradley + ["train", "po", "--loss", "dpo", "--base-model", str(folder), "--steps",
                           str(args.lora_steps), "--batch-size", "2", "--max-length", "64",
                           "--val-fraction", "0", "--out", str(work / name), *extra]
        out, rss = run_measured(train, work, f"dpo_{name}", env)
        runs[name] = {**json.loads(out.strip().splitlines()[-1]), "peak_rss_mb": rss}
    full, low = runs["full"], runs["lora"]
    return {"dpo_lora_n_params": n_params, "dpo_lora_rank": args.lora_rank,
            "dpo_lora_steps": args.lora_steps, "dpo_full_peak_rss_mb": round(full["peak_rss_mb"], 1),
            "dpo_lora_peak_rss_mb": round(low["peak_rss_mb"], 1),
            "dpo_lora_peak_rss_ratio_vs_full": round(low["peak_rss_mb"] / full["peak_rss_mb"], 3),
            "dpo_lora_first_loss": round(low["first_loss"], 6), "dpo_lora_final_loss": round(low["final_loss"], 6),
            "dpo_full_final_loss": round(full["final_loss"], 6)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(parser)
    parser.add_argument("--lora", action="store_true",
                        help="only the LoRA comparison: peak RSS of full and LoRA DPO on a larger policy")
    args = parser.parse_args()
    started = time.perf_counter()
    if args.lora:
        figures = run_lora(args, WORK / "dpo-lora", synthetic_pairs(32, seed=0))
    else:
        figures = run(args, WORK / "dpo", synthetic_pairs(256, seed=0))
    print(json.dumps({"benchmark": "dpo_vs_trl", **figures,
                      "wall_seconds": round(time.perf_counter() - started, 1)}))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    for flag, kind, default in (("--steps", int, 32), ("--batch", int, 8), ("--max-length", int, 256),
                                ("--lr", float, 1e-3), ("--warmup", float, 0.1), ("--threads", int, 2),
                                ("--beta", float, 0.1), ("--micro-batch", int, 1),
                                ("--lora-rank", int, 16), ("--lora-hidden", int, 768),
                                ("--lora-layers", int, 8), ("--lora-steps", int, 2)):
        parser.add_argument(flag, type=kind, default=default)


if __name__ == "__main__":
    main()
