"""`bradley train po`: a store snapshot → the reference pass (cached) → rm/train.py's loop with the
objective of rm/policy.py → a saved policy registered in `models` with its snapshot.

As `bradley train rm` does: only rank 0 of a torchrun job opens the DuckDB file, briefly (snapshot,
reference cache, registration); the policy is written to a hidden partial folder that is moved
into place only when training succeeded, so a failed run leaves nothing half-written. Each
training step's metrics go to stderr as one JSON object a line; the last stdout line (printed by
the CLI) is the run's metrics.
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path

import numpy as np
import torch

from rm import device as devices
from rm.model import import_modeling
from rm.po_data import PolicyDataError, template_hash
from rm.policy import PoConfig, po_objective, reference_logps, weights_hash
from rm.train import new_model_folder, run_planned


class ChosenLogpWatch:
    """Warns once when the chosen responses' log-prob falls while the margin grows: DPO can widen
    the margin by pushing both answers down (Pal et al. 2024, "Smaug", §3). Compares the mean of
    the last `window` steps with the first `window` (per-token log-probs: batches of other lengths
    stay comparable).

    >>> w = ChosenLogpWatch(window=2)
    >>> [w.update({"logp_chosen": -1.0 - 0.1 * i, "margin": 0.1 * i}) for i in range(6)]
    [False, False, False, True, False, False]
    """

    def __init__(self, window: int = 5, min_drop: float = 0.05):
        self.window, self.min_drop = window, min_drop
        self.history: list[tuple[float, float]] = []
        self.warned = False

    def update(self, metrics: dict) -> bool:
        self.history.append((metrics["logp_chosen"], metrics["margin"]))
        if self.warned or len(self.history) < 2 * self.window:
            return False
        (early_lp, early_m), (late_lp, late_m) = (
            [sum(v) / self.window for v in zip(*part, strict=True)]
            for part in (self.history[: self.window], self.history[-self.window:]))
        self.warned = late_lp < early_lp - self.min_drop and late_m > early_m
        return self.warned


WATCH_MESSAGE = ("warning: the mean log-prob of chosen responses is falling while the margin grows; "
                 "the policy is pushing both answers down (consider a lower lr, fewer steps, or "
                 "--loss ipo)")


class StepLog:
    """Wraps an objective: per optimizer step (the mean over its `accum` micro-batches), prints
    the metrics (rank 0, stderr, one JSON object a line), keeps them, and runs the watch."""

    def __init__(self, objective, accum: int = 1, enabled: bool = True, stream=None):
        self.objective, self.accum, self.enabled = objective, accum, enabled
        self.stream = stream or sys.stderr
        self.steps: list[dict] = []
        self.micro: list[dict] = []
        self.watch = ChosenLogpWatch()

    def __call__(self, model, batch):
        loss, metrics = self.objective(model, batch)
        if torch.is_grad_enabled():  # validation runs under no_grad and is not a step
            self.micro.append(metrics)
            if len(self.micro) == self.accum:
                self._step({k: sum(m[k] for m in self.micro) / self.accum for k in metrics})
                self.micro = []
        return loss, metrics

    def _step(self, metrics: dict) -> None:
        self.steps.append(metrics)
        if self.enabled:
            line = {"step": len(self.steps), **{k: round(v, 6) for k, v in metrics.items()}}
            print(json.dumps(line), file=self.stream, flush=True)
            if self.watch.update(metrics):
                print(WATCH_MESSAGE, file=self.stream, flush=True)


def load_causal_lm(name_or_path: str):
    """(AutoModelForCausalLM, tokenizer) from a folder or hub id; safetensors only, pad = eos if unset."""
    import_modeling()
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(name_or_path)
        model = AutoModelForCausalLM.from_pretrained(name_or_path, use_safetensors=True)
    except (OSError, ValueError) as exc:
        raise ValueError(f"cannot load base model {name_or_path!r} as a causal LM: {exc}. Use a local "
                         "folder, `--base-model tiny`, or `bradley models prepare smollm2`") from None
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model, tokenizer


def run(args) -> dict | None:
    """`bradley train po`: snapshot → reference pass (cached) → the shared loop → a saved, registered
    policy. The metrics on rank 0, None on the other ranks of a torchrun job.

    As `bradley train rm` does: only rank 0 opens the DuckDB file, briefly (snapshot, reference
    cache, registration), and the policy is written to a hidden partial folder that is moved into
    place only when training succeeded, so a failed run leaves nothing half-written.
    """
    po_objective(_po_config(args))  # a bad --loss fails before any work

    def work(plan, device, info):
        devices.set_threads(device, info)
        model, tokenizer, data = _prepare(args, plan, device, info)
        ref = _reference(args, model, tokenizer, data, device, info)
        result, log = _train(args, plan, model, tokenizer, data, ref, device, info)
        return _publish(args, plan, result, log, data, info) if info.is_main else None

    return run_planned(args, _plan, work)


def _open_store(path):
    from annotation.store import Store

    return Store(path)


def _po_config(args) -> PoConfig:
    return PoConfig(args.loss, args.beta, args.gamma, args.lam, args.label_smoothing,
                    getattr(args, "robust", False), getattr(args, "desirable_weight", 1.0),
                    getattr(args, "undesirable_weight", 1.0))


def _plan(args) -> dict:
    """Rank 0: the snapshot's rows (every rank needs them), ids and folders."""
    model_id, out = new_model_folder(args.loss, args.out)
    with _open_store(args.db) as store:
        snapshot_id = args.snapshot or store.create_snapshot(args.raters)
        pairs = store.pairs(snapshot_id).to_pylist()
        feedback = store.feedback(snapshot_id).to_pylist() if args.loss == "kto" else []
    if not pairs and not feedback:
        raise PolicyDataError(f"snapshot {snapshot_id} has no pairs or feedback; ingest data first "
                              "(`bradley ingest FILE`) or check --raters")
    partial = out.parent / f".{out.name}.partial-{model_id}"
    (partial / "_work").mkdir(parents=True)
    return {"model_id": model_id, "out": str(out), "partial": str(partial),
            "snapshot_id": snapshot_id, "pairs": pairs, "feedback": feedback}


def _prepare(args, plan: dict, device, info):
    """The policy (the tiny one is built on rank 0 from the snapshot's text) and its data."""
    from rm import po_data
    from rm.model import build_tiny_causal_lm

    base = args.base_model
    if base == "tiny":
        base = str(Path(plan["partial"]) / "_work" / "tiny-base")
        if info.is_main:
            build_tiny_causal_lm(base, _texts(plan), seed=args.seed)
        devices.barrier(info)
    model, tokenizer = load_causal_lm(base)
    if args.loss == "kto":
        data = po_data.kto_data(plan["feedback"], plan["pairs"], tokenizer, args.max_length)
    else:
        data = po_data.pair_data(plan["pairs"], tokenizer, args.max_length)
    return model.to(device), tokenizer, data


def _texts(plan: dict) -> list[str]:
    """The tiny tokenizer's corpus: the snapshot's prompts and responses (as `train rm` builds it)."""
    from rm.data import row_prompt
    from rm.tokenizer import as_text

    texts = [t for r in plan["pairs"] for t in (as_text(row_prompt(r)), r["chosen"], r["rejected"])]
    return texts + [t for r in plan["feedback"] for t in (as_text(row_prompt(r)), r["completion"])]


def _reference(args, model, tokenizer, data, device, info) -> dict:
    """Rank 0 fills the cache (the policy is still the reference); every rank gets the values."""
    started = time.perf_counter()
    ref = None
    if info.is_main:
        with _open_store(args.db) as store:
            values, computed = reference_logps(
                model, data.sequences, tokenizer.pad_token_id, store=store,
                model_hash=weights_hash(model), template=template_hash(tokenizer, args.max_length),
                max_tokens=forward_tokens(args.batch_size, args.max_length, data.paired), device=device,
                progress=True)
        ref = {"values": values, "computed": computed}
    ref = devices.broadcast_json(ref, info, device)
    data.stats.update(ref_computed=ref["computed"], ref_cached=len(ref["values"]) - ref["computed"],
                      ref_seconds=round(time.perf_counter() - started, 3))
    return ref["values"]


MICRO_BATCH_TOKENS = 2048


def micro_split(batch_size: int, max_length: int, paired: bool = True) -> int:
    """Into how many micro-batches each batch of pairs is cut so that a forward holds at most
    MICRO_BATCH_TOKENS padded tokens (chosen and rejected rows both count).

    Activation memory follows the padded tokens of one forward; the paired losses are means of
    per-pair terms, so the gradient accumulated over equal parts is the whole batch's — the same
    optimizer steps for a fraction of the memory, without recomputing activations. KTO's reference
    point z0 is a batch statistic, so its batches stay whole.

    The count is a divisor of the batch size, so the parts are equal and the mean of their means
    is the batch mean (the smaller last batch of an epoch, if any, is cut as evenly as it goes).

    >>> micro_split(8, 256), micro_split(8, 128), micro_split(8, 400), micro_split(8, 256, False)
    (2, 1, 4, 1)
    """
    need = -(-2 * batch_size * max_length // MICRO_BATCH_TOKENS)
    if not paired or need <= 1:
        return 1
    return next(d for d in range(need, batch_size + 1) if batch_size % d == 0)


def forward_tokens(batch_size: int, max_length: int, paired: bool = True) -> int:
    """Padded tokens of one training forward at most: a micro-batch's rows (chosen and rejected, or
    completion and KL row) × max_length. The reference pass takes batches of the same size, so it
    never needs more memory than a training step (it keeps no activations) and is no slower for it.

    >>> forward_tokens(8, 256), forward_tokens(1, 256), forward_tokens(8, 256, paired=False)
    (2048, 512, 4096)
    """
    return 2 * batch_size // micro_split(batch_size, max_length, paired) * max_length


def _train(args, plan, model, tokenizer, data, ref, device, info):
    from rm import po_data
    from rm.model import save_model
    from rm.train import TrainConfig, train_loop

    train_idx, val_idx = data.split(args.val_fraction)
    groups = po_data.batches(data, train_idx, args.batch_size, args.seed, info.rank, info.world_size)
    # a ragged last batch is cut into no more parts than it has pairs (sizes repeat every epoch)
    split = min([micro_split(args.batch_size, args.max_length, data.paired)] + [len(g) for g in groups])
    config = TrainConfig(lr=args.lr or (1e-3 if args.base_model == "tiny" else 5e-6),
                         epochs=args.epochs, steps=args.steps, batch_size=args.batch_size,
                         grad_accum=args.grad_accum * split, warmup_ratio=args.warmup_ratio,
                         eval_every=args.eval_every, patience=args.patience,
                         max_seconds=args.max_seconds, seed=args.seed,
                         gradient_checkpointing=args.gradient_checkpointing)
    plan["record"] = {"model_id": plan["model_id"], "kind": args.loss, "base_model": args.base_model,
                      "snapshot_id": plan["snapshot_id"], "raters": args.raters,
                      "max_length": args.max_length, "val_fraction": args.val_fraction,
                      "world_size": info.world_size, **vars(_po_config(args)), **config.as_dict(),
                      "grad_accum": args.grad_accum, "micro_batches": split}
    log = StepLog(po_objective(_po_config(args)), args.grad_accum * split, enabled=info.is_main)

    def epoch_batches(epoch: int):
        groups = po_data.batches(data, train_idx, args.batch_size, args.seed + epoch, info.rank,
                                 info.world_size)
        return [list(part) for g in groups for part in np.array_split(g, split)]

    val = po_data.batches(data, val_idx, args.batch_size, 0, info.rank, info.world_size, shuffle=False)
    result = train_loop(
        model, log, epoch_batches, val, config, device=device, info=info,
        collate=lambda idx: po_data.collate_examples(data, ref, idx, tokenizer.pad_token_id),
        on_best=lambda step, m: save_model(model, tokenizer, plan["partial"], plan["record"],
                                           {"step": step, **m}))
    return result, log


def _publish(args, plan: dict, result, log: StepLog, data, info) -> dict:
    """Rank 0: move the best checkpoint into place, register it, and build the final JSON line."""
    partial, out = Path(plan["partial"]), Path(plan["out"])
    shutil.rmtree(partial / "_work", ignore_errors=True)
    first, last = (log.steps[0], log.steps[-1]) if log.steps else ({}, {})
    val = result.best or {}
    metrics = {
        "model_id": plan["model_id"], "path": str(out), "snapshot_id": plan["snapshot_id"],
        "kind": args.loss, "base_model": args.base_model,
        "loss": val.get("loss", result.last_train.get("loss")),
        "first_loss": first.get("loss"), "final_loss": last.get("loss"),
        "first_margin": first.get("margin"), "final_margin": last.get("margin"),
        "val_loss": val.get("loss"), "val_accuracy": val.get("accuracy"),
        "val_margin": val.get("margin"), "steps": result.steps, "best_step": result.best_step,
        "stopped": result.stopped, "world_size": info.world_size,
        "train_seconds": round(result.seconds, 3), "chosen_logp_warning": log.watch.warned,
        **data.stats,
    }
    (partial / "metrics.json").write_text(json.dumps(metrics, indent=2))
    if out.exists():
        shutil.rmtree(out)  # a previous bradley model in the same --out (checked in _plan)
    partial.rename(out)
    with _open_store(args.db) as store:
        store.register_model(args.loss, args.base_model, str(out), plan["snapshot_id"],
                             plan["record"], metrics, model_id=plan["model_id"])
    return metrics
