"""Preference optimization of a causal-LM policy: resolved pairs (or KTO feedback) → the reference
pass (cached) → the loop (rm/train/loop.py) with `po_objective` (rm/train/objectives.py) → a policy folder.
`bradley train po` is this with the store's snapshot and reference cache handed in
(service/cli/train.py); from Python:

    >>> from rm.train.policy import PolicyRunConfig, train_policy
    >>> from rm.train.objectives import PoConfig
    >>> from rm.train.loop import TrainConfig
    >>> config = PolicyRunConfig(objective=PoConfig(loss="dpo", beta=0.1), train=TrainConfig(steps=6))
    >>> # metrics = train_policy(config, RunInputs(pairs=rows), ref_cache=store)

Each training step's metrics go to stderr as one JSON object a line (rank 0); the CLI prints the
returned metrics as the last stdout line. The folder is written as rm/train/run.py describes.
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
from dataclasses import dataclass, field, replace

import numpy as np
import torch

from rm.model import device as devices
from rm.model.reward_model import load_causal_lm
from rm.train import lora
from rm.train.logps import PolicyNet, reference_logps, weights_hash
from rm.train.objectives import PoConfig, po_objective
from rm.train.policy_data import PolicyDataError, template_hash
from rm.train.run import (
    Inputs,
    RunConfig,
    RunInputs,
    base_model_folder,
    count_rows,
    new_plan,
    publish,
    read_rows,
    run_planned,
)


@dataclass
class PolicyRunConfig(RunConfig):
    """A policy run: the shared settings (rm/train/run.py: RunConfig, with the loop's TrainConfig as
    `train`) and the objective with its hyper-parameters (`objective`, rm/train/objectives.py: PoConfig).
    Each batch of `train.batch_size` pairs is cut into micro-batches of at most
    `micro_batch_tokens(device)` padded tokens, with accumulated gradients (`micro_split`)."""

    PRETRAINED_LR = 5e-6
    PRETRAINED_LORA_LR = 5e-5  # adapters start at zero and move a low-rank subspace: a larger step

    objective: PoConfig = field(default_factory=PoConfig)

    @classmethod
    def from_record(cls, record: dict):
        names = PoConfig.__dataclass_fields__
        base = super().from_record(record)
        return replace(base, objective=PoConfig(**{k: record[k] for k in names if k in record}))


def train_policy(config: PolicyRunConfig, inputs: Inputs, ref_cache=None) -> dict | None:
    """Train, write the policy folder, return the final metrics (None on the other ranks of a
    torchrun job). `inputs`: a RunInputs (pairs; feedback for KTO) or a callable returning one,
    called on rank 0 only. `ref_cache`: where reference log-probs are looked up and kept
    (rm/train/logps.py: reference_logps; an open annotation Store is one), used on rank 0 only."""
    po_objective(config.objective)  # a bad loss or hyper-parameter fails before any work
    config.lora.check()

    def make_plan(given: RunInputs) -> dict:
        if config.objective.loss != "kto":
            given = replace(given, feedback=())
        if not count_rows(given.pairs) and not count_rows(given.feedback):
            raise PolicyDataError(f"snapshot {given.snapshot_id} has no pairs or feedback; ingest "
                                  "data first (`bradley ingest FILE`) or check --raters")
        return new_plan(config.objective.loss, config.out, given)

    def work(plan, device, info):
        devices.set_threads(device, info)
        policy, tokenizer, data = _prepare(config, plan, device, info)
        ref = _reference(config, policy, tokenizer, data, ref_cache, device, info)
        result, log = _train(config, plan, policy, tokenizer, data, ref, device, info)
        return publish(plan, _metrics(config, plan, result, log, data, info)) if info.is_main else None

    return run_planned(config, inputs, make_plan, work)


@dataclass
class Policy:
    """The model a run trains: `net` (PolicyNet: log-probs padding-free and in chunks), the causal
    LM inside it (`hf`), its LoRA adapters (a PeftModel over `hf`, or None) and `ref_hash`, the
    identity of the reference weights (the base model's, before any adapter)."""

    net: PolicyNet
    hf: torch.nn.Module
    adapters: object | None
    ref_hash: str

    def reference_mode(self):
        """The reference policy: the adapters disabled (the base weights), or the model as it is."""
        return self.adapters.disable_adapter() if self.adapters is not None else contextlib.nullcontext()


def _prepare(config: PolicyRunConfig, plan: dict, device, info):
    """The policy (the tiny one is built on rank 0 from the data's text) and its data."""
    from rm.model.reward_model import build_tiny_causal_lm
    from rm.train import policy_data as po_data

    pairs, feedback = read_rows(plan["pairs"]), read_rows(plan["feedback"])
    model, tokenizer = load_causal_lm(base_model_folder(config, plan, info, build_tiny_causal_lm,
                                                        pairs, feedback))
    if config.objective.loss == "kto":
        data = po_data.kto_data(feedback, pairs, tokenizer, config.max_length)
    else:
        data = po_data.pair_data(pairs, tokenizer, config.max_length)
    ref_hash = weights_hash(model) if info.is_main else ""  # rank 0 alone reads the cache
    net = PolicyNet(model)
    net.go_padding_free(device)
    adapters = lora.add_adapters(model, config.lora, seed=config.train.seed) if config.lora.enabled else None
    return Policy(net.to(device), model, adapters, ref_hash), tokenizer, data


def _reference(config: PolicyRunConfig, policy: Policy, tokenizer, data, cache, device, info) -> dict:
    """Rank 0 fills the cache (the policy is still the reference; with LoRA, its adapters are
    disabled for the pass); every rank gets the values."""
    started = time.perf_counter()
    ref = None
    if info.is_main:
        size, length = config.train.batch_size, config.max_length
        with policy.reference_mode():
            values, computed = reference_logps(
                policy.net, data.sequences, tokenizer.pad_token_id, cache=cache,
                model_hash=policy.ref_hash, template=template_hash(tokenizer, length),
                max_tokens=forward_tokens(size, length, data.paired, micro_batch_tokens(device)),
                device=device, progress=True)
        ref = {"values": values, "computed": computed}
    ref = devices.broadcast_json(ref, info, device)
    data.stats.update(ref_computed=ref["computed"], ref_cached=len(ref["values"]) - ref["computed"],
                      ref_seconds=round(time.perf_counter() - started, 3))
    return ref["values"]


MICRO_BATCH_TOKENS = 2048
# A GPU is launch-bound on small forwards: on the H200, DPO on the 135M shape at 8 pairs × 1024
# tokens cut into 2,048-token micro-batches ran 0.83 s a step (MFU 0.026; bench/gpu/run.sh)
CUDA_MICRO_BATCH_TOKENS = 16384


def micro_batch_tokens(device) -> int:
    """The padded tokens one training forward may hold on `device`: MICRO_BATCH_TOKENS on a CPU
    (memory), at least CUDA_MICRO_BATCH_TOKENS on a GPU (kernel launches).

    >>> micro_batch_tokens(torch.device("cpu")), micro_batch_tokens(torch.device("cuda", 0))
    (2048, 16384)
    """
    if torch.device(device).type == "cuda":
        return max(MICRO_BATCH_TOKENS, CUDA_MICRO_BATCH_TOKENS)
    return MICRO_BATCH_TOKENS


def micro_split(batch_size: int, max_length: int, paired: bool = True,
                budget: int | None = None) -> int:
    """Into how many micro-batches each batch of pairs is cut so that a forward holds at most
    `budget` padded tokens (chosen and rejected rows both count; default MICRO_BATCH_TOKENS).

    Activation memory follows the padded tokens of one forward; the paired losses are means of
    per-pair terms, so the gradient accumulated over equal parts is the whole batch's — the same
    optimizer steps for a fraction of the memory, without recomputing activations. KTO's reference
    point z0 is a batch statistic, so its batches stay whole.

    The count is a divisor of the batch size, so the parts are equal and the mean of their means
    is the batch mean (the smaller last batch of an epoch, if any, is cut as evenly as it goes).

    >>> micro_split(8, 256), micro_split(8, 128), micro_split(8, 400), micro_split(8, 256, False)
    (2, 1, 4, 1)
    """
    need = -(-2 * batch_size * max_length // (budget or MICRO_BATCH_TOKENS))
    if not paired or need <= 1:
        return 1
    return next(d for d in range(need, batch_size + 1) if batch_size % d == 0)


def forward_tokens(batch_size: int, max_length: int, paired: bool = True,
                   budget: int | None = None) -> int:
    """Padded tokens of one training forward at most: a micro-batch's rows (chosen and rejected, or
    completion and KL row) × max_length. The reference pass takes batches of the same size, so it
    never needs more memory than a training step (it keeps no activations) and is no slower for it.

    >>> forward_tokens(8, 256), forward_tokens(1, 256), forward_tokens(8, 256, paired=False)
    (2048, 512, 4096)
    """
    return 2 * batch_size // micro_split(batch_size, max_length, paired, budget) * max_length


def _train(config: PolicyRunConfig, plan, policy: Policy, tokenizer, data, ref, device, info):
    from rm.model.reward_model import save_model
    from rm.train import policy_data as po_data
    from rm.train.loop import train_loop

    user = config.train
    train_idx, val_idx = data.split(config.val_fraction)
    groups = po_data.batches(data, train_idx, user.batch_size, user.seed, info.rank, info.world_size)
    # a ragged last batch is cut into no more parts than it has pairs (sizes repeat every epoch)
    budget = micro_batch_tokens(device)
    split = min([micro_split(user.batch_size, config.max_length, data.paired, budget)] +
                [len(g) for g in groups])
    loop = replace(user, lr=config.lr(), grad_accum=user.grad_accum * split)
    record = {"model_id": plan["model_id"], "kind": config.objective.loss,
              "base_model": config.base_model, "snapshot_id": plan["snapshot_id"],
              "raters": plan["raters"], "max_length": config.max_length,
              "val_fraction": config.val_fraction, "world_size": info.world_size,
              **vars(config.objective), **loop.as_dict(), "grad_accum": user.grad_accum,
              "micro_batches": split, **config.lora.as_record()}
    log = StepLog(po_objective(config.objective), loop.grad_accum, enabled=info.is_main)

    def epoch_batches(epoch: int):
        groups = po_data.batches(data, train_idx, user.batch_size, user.seed + epoch, info.rank,
                                 info.world_size)
        return [list(part) for g in groups for part in np.array_split(g, split)]

    val = po_data.batches(data, val_idx, user.batch_size, 0, info.rank, info.world_size, shuffle=False)
    def save(step: int, metrics: dict) -> None:
        metrics = {"step": step, **metrics}
        if policy.adapters is None:
            save_model(policy.hf, tokenizer, plan["partial"], record, metrics)
        else:
            lora.save_merged(policy.adapters, tokenizer, plan["partial"], record, metrics,
                             config.lora.keep_adapter)

    result = train_loop(
        policy.net, log, epoch_batches, val, loop, device=device, info=info, wrapping=config.wrapping,
        collate=lambda idx: po_data.collate_examples(data, ref, idx, tokenizer.pad_token_id), on_best=save)
    return result, log


def _metrics(config: PolicyRunConfig, plan: dict, result, log: StepLog, data, info) -> dict:
    """The run's final JSON line."""
    first, last = (log.steps[0], log.steps[-1]) if log.steps else ({}, {})
    val = result.best or {}
    return {
        "model_id": plan["model_id"], "path": plan["out"], "snapshot_id": plan["snapshot_id"],
        "kind": config.objective.loss, "base_model": config.base_model,
        "loss": val.get("loss", result.last_train.get("loss")),
        "first_loss": first.get("loss"), "final_loss": last.get("loss"),
        "first_margin": first.get("margin"), "final_margin": last.get("margin"),
        "val_loss": val.get("loss"), "val_accuracy": val.get("accuracy"),
        "val_margin": val.get("margin"), "steps": result.steps, "best_step": result.best_step,
        "stopped": result.stopped, "world_size": info.world_size,
        "train_seconds": round(result.seconds, 3), "chosen_logp_warning": log.watch.warned,
        **data.stats,
    }


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
