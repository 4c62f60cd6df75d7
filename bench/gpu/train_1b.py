"""Benchmark: training on a Llama-3.2-1B-shaped model (random weights from its config, bf16 autocast,
1,024-token rows): `bradley train rm` in full and with LoRA r=16, `bradley train po --loss dpo` in
full and with LoRA r=16, and TRL's RewardTrainer and DPOTrainer on the same model, data, batch,
sequence length, learning rate and steps in the same call, as the baseline. One JSON line per phase
in OUT/<phase>.json and on stdout: tokens/s, MFU (bench/gpu/train_mfu.py's formula and peak) and
peak GPU memory; the TRL lines add `rm_speedup_vs_trl` / `dpo_speedup_vs_trl` and
`*_peak_memory_ratio_vs_trl`, the LoRA lines `peak_memory_ratio_vs_full`.

Every text is longer than the sequence length, so every row is exactly --max-length tokens. Ours:
n and 3n optimizer steps through the CLI in this process, the step time the difference of their
train_seconds over 2n (the first phase is preceded by a discarded 2-step run that takes CUDA's
one-time costs). TRL: 3n steps in a child process, the step time the wall time from the end of
step n to the end of step 3n over 2n (a callback, CUDA synchronised); both sides without gradient
checkpointing. DPO's reference log-probs are outside the timed steps on both sides (ours: cached
before training; TRL: precompute_ref_log_probs).

    python3 bench/gpu/train_1b.py --out OUT            (GPU: the 1B shape)
    python3 bench/gpu/train_1b.py --out OUT --smoke    (CPU: a tiny shape, TRL from the tests' venv)
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import train_mfu as mfu  # noqa: E402

# meta-llama/Llama-3.2-1B config.json (1,235,814,400 parameters with tied embeddings)
LLAMA_1B = {"hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16,
            "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256,
            "max_position_embeddings": 131072, "rope_theta": 500000.0, "rms_norm_eps": 1e-5,
            "tie_word_embeddings": True, "hidden_act": "silu"}
PLANS = {  # shape, pairs, max_length, (rm batch, dpo batch), n, device
    "gpu": (LLAMA_1B, 320, 1024, (8, 4), 3, "cuda"),
    "smoke": (mfu.TINY, 48, 48, (4, 4), 1, "cpu"),
}
LORA_RANK = 16

TRL_SCRIPT = r'''
import json, sys, time
import torch
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer, TrainerCallback
a = json.loads(sys.argv[1])
cuda = a["device"] == "cuda"
tok = AutoTokenizer.from_pretrained(a["model"])
rows = [json.loads(l) for l in open(a["data"])]
common = dict(output_dir=a["out"], per_device_train_batch_size=a["batch"], max_steps=a["steps"],
              learning_rate=a["lr"], max_length=a["max_length"], logging_steps=1, save_strategy="no",
              eval_strategy="no", report_to=[], disable_tqdm=True, bf16=cuda, use_cpu=not cuda,
              gradient_checkpointing=False, seed=0)
stamps = []
class Clock(TrainerCallback):
    def on_step_end(self, args, state, control, **kw):
        if cuda:
            torch.cuda.synchronize()
        stamps.append(time.perf_counter())
if a["kind"] == "rm":
    from trl import RewardConfig, RewardTrainer
    model = AutoModelForSequenceClassification.from_pretrained(a["model"], num_labels=1)
    model.config.pad_token_id = tok.pad_token_id
    trainer = RewardTrainer(model=model, args=RewardConfig(**common), processing_class=tok,
                            train_dataset=Dataset.from_list(rows), callbacks=[Clock()])
else:
    from trl import DPOConfig, DPOTrainer
    model = AutoModelForCausalLM.from_pretrained(a["model"])
    trainer = DPOTrainer(model=model, args=DPOConfig(**common, beta=0.1, loss_type=["sigmoid"],
                                                     precompute_ref_log_probs=True),
                         processing_class=tok, train_dataset=Dataset.from_list(rows), callbacks=[Clock()])
if cuda:
    torch.cuda.reset_peak_memory_stats()
trainer.train()
n = a["steps"] // 3
print(json.dumps({"step_seconds": (stamps[-1] - stamps[n - 1]) / (len(stamps) - n),
                  "peak_memory_gb": torch.cuda.max_memory_allocated() / 2**30 if cuda else None}))
'''


def trl_python(smoke: bool) -> str:
    """TRL's interpreter: the tests' TRL venv on a CPU, this one on the GPU machine (TRL carried as
    wheels, bench/gpu/wheels.sh)."""
    if not smoke:
        return sys.executable
    from bench.common import ensure_trl_venv

    return str(ensure_trl_venv())


def fitted_rows(work: Path, base: str, seq: int) -> list[dict]:
    """The pairs cut to fit `seq` tokens (TRL's RewardTrainer drops longer rows where bradley cuts
    the prompt): the prompt's last 16 tokens and as much of each response as leaves 8 tokens for
    the template's own, so each row is within a few tokens of `seq` (TRL's tokens/s is counted
    as if it were exactly `seq`)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(base)
    cut = lambda text, a, b: tok.decode(tok(text, add_special_tokens=False)["input_ids"][a:b])  # noqa: E731
    rows = []
    for r in map(json.loads, (work / "pairs.jsonl").open()):
        rows.append({"prompt": cut(r["prompt"], -16, None) + "\n\n",
                     "chosen": cut(r["chosen"], 0, seq - 24), "rejected": cut(r["rejected"], 0, seq - 24)})
    return rows


def run_trl(kind: str, base: str, work: Path, seq: int, batch: int, steps: int, device: str,
            smoke: bool) -> dict:
    data = work / f"trl_{kind}.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in fitted_rows(work, base, seq)))
    (work / "trl_train.py").write_text(TRL_SCRIPT)
    spec = {"kind": kind, "model": base, "data": str(data), "out": str(work / f"trl-{kind}"),
            "batch": batch, "steps": 3 * steps, "lr": 1e-5, "max_length": seq, "device": device}
    done = subprocess.run([trl_python(smoke), str(work / "trl_train.py"), json.dumps(spec)],
                          capture_output=True, text=True, cwd=work)
    if done.returncode != 0:
        raise SystemExit(f"TRL {kind} failed:\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def phase_line(name: str, measured: dict, shape: dict, seq: int, device: str, smoke: bool) -> dict:
    final = measured.pop("final")
    return measured | {"bench": f"gpu_{name}", "model": "tiny (smoke)" if smoke else
                       "llama-3.2-1b shape, random weights", "seq_len": seq, "device": device,
                       "smoke": smoke, "lora_rank": LORA_RANK if "lora" in name else 0,
                       "peak_flops": mfu.PEAK_FLOPS, "final_loss": final.get("train_loss",
                                                                             final.get("final_loss"))}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--work", default=None)
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args()
    shape, n_pairs, seq, (rm_batch, dpo_batch), steps, device = PLANS["smoke" if args.smoke else "gpu"]
    out = Path(args.out)
    work = Path(args.work or out / "work-1b")
    db, base, _ = mfu.prepare(work, shape, n_pairs, seq)
    flags = mfu.train_flags(base, device, seq)
    lora = ["--lora-rank", str(LORA_RANK)]
    rm = ["--db", db, "train", "rm", *flags, "--batch-size", str(rm_batch)]
    dpo = ["--db", db, "train", "po", "--loss", "dpo", *flags, "--batch-size", str(dpo_batch)]
    rm_tokens, dpo_tokens = 2 * rm_batch * seq, 2 * dpo_batch * seq
    mfu.cli([*rm, "--steps", "2", "--out", str(work / "warmup")])   # CUDA's one-time costs
    plan = {"rm_full": (rm, rm_tokens, False), "rm_lora": (rm + lora, rm_tokens, False),
            "dpo_full": (dpo, dpo_tokens, True), "dpo_lora": (dpo + lora, dpo_tokens, True)}
    lines = {}
    for name, (argv, tokens, causal) in plan.items():
        flops = tokens * mfu.flops_per_token(shape, seq, causal)
        measured = mfu.measure(name, argv, steps, tokens, flops, device, work, warmup=False)
        lines[name] = phase_line(name, measured, shape, seq, device, args.smoke)
    for kind, ours, batch, tokens in (("rm", "rm_full", rm_batch, rm_tokens),
                                      ("dpo", "dpo_full", dpo_batch, dpo_tokens)):
        trl = run_trl(kind, base, work, seq, batch, steps, device, args.smoke)
        mine = lines[ours]
        lines[f"trl_{kind}"] = {"bench": f"gpu_trl_{kind}", "seq_len": seq, "device": device,
                                "smoke": args.smoke, "step_seconds": round(trl["step_seconds"], 5),
                                "tokens_per_s": round(tokens / trl["step_seconds"], 1),
                                "peak_memory_gb": trl["peak_memory_gb"],
                                f"{kind}_speedup_vs_trl": round(mine["tokens_per_s"] * trl["step_seconds"] / tokens, 3)}
        if trl["peak_memory_gb"] and mine.get("peak_memory_gb"):
            lines[f"trl_{kind}"][f"{kind}_peak_memory_ratio_vs_trl"] = round(
                mine["peak_memory_gb"] / trl["peak_memory_gb"], 3)
    for kind in ("rm", "dpo"):
        full, low = lines[f"{kind}_full"].get("peak_memory_gb"), lines[f"{kind}_lora"].get("peak_memory_gb")
        lines[f"{kind}_lora"]["peak_memory_ratio_vs_full"] = round(low / full, 3) if full and low else None
    for name, line in lines.items():
        (out / f"train_1b_{name}.json").write_text(json.dumps(line) + "\n")
        print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()
