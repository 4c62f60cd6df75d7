"""One training loop for every objective (reward models, DPO and friends), and nothing else: the
runs that feed it are rm/train/reward.py and rm/train/policy.py (through rm/train/run.py).

The loop: AdamW, linear warmup then cosine decay, gradient accumulation, optional gradient
checkpointing, gradient clipping, evaluation every N optimizer steps, early stopping on validation
loss, a checkpoint of the best model, a progress bar on stderr, and DDP when launched by `torchrun`
(rm/model/device.py). How the model is wrapped for several processes is chosen once, by name, from
WRAPPERS (`train_loop(..., wrapping=)`): a sharded wrapper (FSDP) plugs in there.

Plugging in an objective (the hook): `objective(model, batch) -> (loss, metrics)` where `batch` is
what `collate(item)` returned, already moved to the device, `loss` a scalar tensor (the batch mean)
and `metrics` a dict of floats (batch means, weighted by `metrics["n"]` when given, else 1) or of
`(sum, count)` pairs for ratios with their own denominator. Validation runs the same objective under
`torch.no_grad` on the unwrapped model (no DDP collectives), and `metrics["loss"]` drives early
stopping. rm/train/objectives.py holds the objectives of both runs.

    >>> round(lr_factor(5, warmup=10, total=100), 2), lr_factor(10, 10, 100), lr_factor(100, 10, 100)
    (0.55, 1.0, 0.0)
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field

import torch

from rm.model import device as devices

EVALS_PER_RUN = 5
FUSED_ADAMW = ("cpu", "cuda")  # devices with torch's fused AdamW kernel (torch >= 2.4)
DEFAULT_LR = 1e-3
# how the model is wrapped for the processes of a torchrun job: name -> wrap(model, device, info)
WRAPPERS: dict[str, Callable] = {"ddp": devices.wrap, "fsdp": devices.shard}


@dataclass
class TrainConfig:
    """The loop's hyper-parameters (`bradley train` flags of the same names). `lr` None: the run
    picks its default for the base model (rm/train/reward.py, rm/train/policy.py); the loop alone uses
    DEFAULT_LR."""

    lr: float | None = None
    epochs: float = 1.0
    steps: int | None = None
    batch_size: int = 8
    grad_accum: int = 1
    warmup_ratio: float = 0.1
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    eval_every: int | None = None      # optimizer steps; None: EVALS_PER_RUN times per run
    patience: int | None = 3           # evaluations without improvement; None: never stop early
    max_seconds: float | None = None
    seed: int = 0
    gradient_checkpointing: int = 0    # recompute every N-th layer's activations; 0: keep them all

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass
class LoopResult:
    steps: int = 0
    seconds: float = 0.0
    best_step: int | None = None
    best: dict = field(default_factory=dict)     # validation metrics of the best checkpoint
    last_train: dict = field(default_factory=dict)
    stopped: str = "steps"                       # steps | early_stopping | time
    history: list = field(default_factory=list)  # (step, validation metrics)


def enable_checkpointing(model: torch.nn.Module, every_n_layers: int = 1) -> None:
    """Keep only the inputs of every `every_n_layers`-th transformer layer of the Hugging Face model
    inside `model` and recompute the rest of its activations in the backward pass (Chen et al. 2016,
    "Training Deep Nets with Sublinear Memory Cost"): activation memory falls to those inputs plus
    one layer's worth, for about one more forward per step. Non-reentrant, so it works under DDP."""
    if every_n_layers < 1:
        raise ValueError(f"--gradient-checkpointing N needs N >= 1 (every N-th layer), got {every_n_layers}")
    hf_model = next(m for m in model.modules() if hasattr(m, "gradient_checkpointing_enable"))
    kwargs = {"use_reentrant": False}
    if hasattr(hf_model, "activation_checkpointing_enable"):  # newer transformers
        hf_model.activation_checkpointing_enable(kwargs, every_n_layers=every_n_layers)
    elif every_n_layers == 1:
        hf_model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    else:
        raise ValueError("checkpointing every n-th layer needs a newer transformers; use every layer")


def lr_factor(step: int, warmup: int, total: int) -> float:
    """Multiplier of the peak learning rate: linear warmup over `warmup` steps, then cosine to 0."""
    if step < warmup:
        return (step + 1) / (warmup + 1)
    progress = (step - warmup) / max(1, total - warmup)
    return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))


def total_steps(config: TrainConfig, batches_per_epoch: int) -> int:
    """Optimizer steps of a run: --steps when given, else epochs × batches / accumulation.

    >>> total_steps(TrainConfig(epochs=1.5, grad_accum=2), batches_per_epoch=40)
    30
    """
    if config.steps is not None:
        return max(1, config.steps)
    return max(1, math.ceil(config.epochs * batches_per_epoch / config.grad_accum))


def to_device(batch, device: torch.device):
    if isinstance(batch, dict):
        return {k: to_device(v, device) for k, v in batch.items()}
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    return batch


class _Meter:
    """Sums of (value × weight, weight) per metric, reducible across ranks."""

    def __init__(self):
        self.sums: dict[str, list[float]] = {}

    def add(self, metrics: dict) -> None:
        weight = float(metrics.get("n", 1.0))
        for key, value in metrics.items():
            if key == "n":
                continue
            total, count = value if isinstance(value, tuple) else (float(value) * weight, weight)
            acc = self.sums.setdefault(key, [0.0, 0.0])
            acc[0] += float(total)
            acc[1] += float(count)

    def means(self, device=None, info: devices.Dist | None = None) -> dict:
        keys = sorted(self.sums)
        if info is not None and info.active:
            keys = devices.broadcast_json(keys, info, device)
            flat = [v for k in keys for v in self.sums.get(k, [0.0, 0.0])]
            flat = devices.all_reduce_sum(flat, device, info)
            self.sums = {k: flat[2 * i:2 * i + 2] for i, k in enumerate(keys)}
        return {k: (s / c if c else None) for k, (s, c) in self.sums.items()}


def evaluate_loop(model, objective, batches: Sequence, collate: Callable, device, info) -> dict:
    """Mean validation metrics over this rank's batches, reduced over all ranks."""
    net = devices.unwrap(model)
    if devices.is_sharded(net):  # every rank must run the same forwards: cut to the shortest share
        batches = batches[:devices.all_reduce_min(len(batches), device, info)]
    was_training = net.training
    net.eval()
    meter = _Meter()
    with torch.no_grad(), devices.autocast(device):
        for item in batches:
            meter.add(objective(net, to_device(collate(item), device))[1])
    net.train(was_training)
    return meter.means(device, info)


def _progress(total: int, info: devices.Dist):
    from tqdm import tqdm

    # disable=None hides the bar when stderr is not a terminal (logs, CI)
    return tqdm(total=total, file=sys.stderr, disable=None if info.is_main else True,
                dynamic_ncols=True, desc="train")


def _micro_steps(train_batches, total: int, accum: int):
    """(epoch, item, is_last_micro_step_of_an_optimizer_step) until `total` optimizer steps."""
    needed, epoch = total * accum, 0
    while needed > 0:
        items = train_batches(epoch) if callable(train_batches) else train_batches
        if not items:
            raise ValueError("no training batches: the training split is empty or smaller than one "
                             "batch per rank; add data, lower --batch-size or use fewer processes")
        for item in items:
            if needed == 0:
                return
            needed -= 1
            yield epoch, item, needed % accum == 0
        epoch += 1


def train_loop(model: torch.nn.Module, objective: Callable, train_batches, val_batches: Sequence,
               config: TrainConfig, *, collate: Callable = lambda item: item,
               device: torch.device | None = None, info: devices.Dist | None = None,
               on_best: Callable[[int, dict], None] | None = None,
               wrapping: str = "ddp") -> LoopResult:
    """Train `model` (a plain module; wrapped by WRAPPERS[wrapping] under torchrun) and return what
    happened.

    `train_batches` is this rank's list of items or `epoch -> list` (reshuffled per epoch);
    `val_batches` this rank's validation items (may be empty). `on_best(step, val_metrics)` runs on
    rank 0 whenever validation loss improves (and once at the end when there is no validation).
    """
    device = device or torch.device("cpu")
    info = info or devices.Dist()
    if wrapping not in WRAPPERS:
        raise ValueError(f"unknown wrapping {wrapping!r}; choose one of {sorted(WRAPPERS)}")
    if config.gradient_checkpointing:
        enable_checkpointing(model, config.gradient_checkpointing)
    first = train_batches(0) if callable(train_batches) else train_batches
    total = total_steps(config, len(first))
    every = config.eval_every or max(1, total // EVALS_PER_RUN)
    net = WRAPPERS[wrapping](model.to(device).train(), device, info)
    params = [p for p in net.parameters() if p.requires_grad]
    lr = DEFAULT_LR if config.lr is None else config.lr
    # one fused kernel instead of a Python loop over the parameters
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=config.weight_decay,
                            fused=device.type in FUSED_ADAMW and not devices.is_sharded(net))
    warmup = int(config.warmup_ratio * total)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_factor(s, warmup, total))
    state = _State(LoopResult(), time.perf_counter(), _Meter(), net, objective, val_batches,
                   collate, device, info, on_best, config)
    bar = _progress(total, info)
    for _epoch, item, sync in _micro_steps(train_batches, total, config.grad_accum):
        _backward(state, to_device(collate(item), device), sync)
        if not sync:
            continue
        torch.nn.utils.clip_grad_norm_(params, config.max_grad_norm)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        state.result.steps += 1
        bar.update(1)
        if state.result.steps % every == 0 or state.result.steps == total:
            _validate(state)
            bar.set_postfix(_short(state))
        if _should_stop(state, total):
            break
    bar.close()
    return _finish(state)


@dataclass
class _State:
    """One run of the loop: what it produced so far and what every step needs."""

    result: LoopResult
    started: float
    meter: _Meter
    net: torch.nn.Module
    objective: Callable
    val_batches: Sequence
    collate: Callable
    device: torch.device
    info: devices.Dist
    on_best: Callable[[int, dict], None] | None
    config: TrainConfig
    best_loss: float = math.inf
    bad_evals: int = 0
    last_eval_step: int = -1


def _backward(state: _State, batch, sync: bool) -> None:
    # under DDP or FSDP, skip the gradient reduction on micro-steps that do not end an optimizer step
    with devices.gradient_sync(state.net, sync):
        with devices.autocast(state.device):
            loss, metrics = state.objective(state.net, batch)
        (loss / state.config.grad_accum).backward()
    state.meter.add(metrics)


def _validate(state: _State) -> None:
    result = state.result
    state.last_eval_step = result.steps
    result.last_train = state.meter.means()
    state.meter = _Meter()
    if not _has_validation(state.val_batches, state.device, state.info):
        return
    metrics = evaluate_loop(state.net, state.objective, state.val_batches, state.collate,
                            state.device, state.info)
    result.history.append((result.steps, metrics))
    loss = metrics.get("loss")
    if loss is not None and loss < state.best_loss:
        state.best_loss, state.bad_evals = loss, 0
        result.best_step, result.best = result.steps, metrics
        if state.on_best is not None and _saves_here(state):
            state.on_best(result.steps, metrics)
        devices.barrier(state.info)
    else:
        state.bad_evals += 1
        if state.config.patience is not None and state.bad_evals >= state.config.patience:
            result.stopped = "early_stopping"


def _saves_here(state: _State) -> bool:
    # a sharded model is gathered by every rank to be saved (rm/model/reward_model.py: save_model writes on rank 0)
    return state.info.is_main or devices.is_sharded(state.net)


def _has_validation(val_batches, device, info) -> bool:
    return devices.all_reduce_sum([float(len(val_batches))], device, info)[0] > 0 and \
        devices.all_reduce_min(len(val_batches), device, info) > 0


def _should_stop(state: _State, total: int) -> bool:
    result, limit = state.result, state.config.max_seconds
    result.seconds = time.perf_counter() - state.started
    if result.stopped == "early_stopping":
        return True
    if limit is not None and _any_rank(result.seconds >= limit, state):
        result.stopped = "time"
        return True
    return result.steps >= total


def _any_rank(flag: bool, state: _State) -> bool:
    # every rank must stop at the same step, or one would wait forever in the next all-reduce
    return devices.all_reduce_sum([float(flag)], state.device, state.info)[0] > 0


def _finish(state: _State) -> LoopResult:
    result = state.result
    if state.last_eval_step != result.steps:
        _validate(state)
    if result.best_step is None and state.on_best is not None and _saves_here(state):
        state.on_best(result.steps, {})  # nothing to validate on: keep the final weights
    devices.barrier(state.info)
    result.seconds = time.perf_counter() - state.started
    return result


def _short(state) -> dict:
    best = state.result.best
    return {k: f"{v:.3f}" for k, v in (("val_loss", best.get("loss")),
                                        ("val_acc", best.get("accuracy"))) if v is not None}
