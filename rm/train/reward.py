"""Train a Bradley–Terry reward model: resolved pairs → tokenized pairs → the loop (rm/train/loop.py) with
`bt_objective` (rm/train/objectives.py) → a model folder. `bradley train rm` is this with the store's
snapshot handed in (service/cli/train.py); from Python:

    >>> from rm.train.reward import RewardRunConfig, train_reward_model
    >>> from rm.train.run import RunInputs
    >>> from rm.train.loop import TrainConfig
    >>> config = RewardRunConfig(base_model="tiny", train=TrainConfig(steps=20), max_length=64)
    >>> # metrics = train_reward_model(config, RunInputs(pairs=rows))   # rows: prompt/chosen/rejected

The folder holds the weights (safetensors), the tokenizer, `train_config.json` (this config, flat,
with the model id, snapshot id and world size: `RewardRunConfig.from_record` reads it back) and
`metrics.json` (the returned metrics, the weights' sha256 among them).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rm.model import device as devices
from rm.train.loop import LoopResult, train_loop
from rm.train.objectives import bt_objective
from rm.train.run import (
    Inputs,
    RunConfig,
    RunInputs,
    count_rows,
    new_plan,
    publish,
    read_rows,
    run_planned,
)

TINY_LR, PRETRAINED_LR = 1e-3, 5e-5  # random init takes a larger step


@dataclass
class RewardRunConfig(RunConfig):
    """A reward-model run: the shared settings (rm/train/run.py: RunConfig, with the loop's TrainConfig
    as `train`) and the objective's: `soft_labels` (BCE against the vote share p̂ instead of the
    majority), `margin` (each pair's strength as a Bradley–Terry margin; the rows carry a `margin`
    column), `center` (reward-centering coefficient λ)."""

    soft_labels: bool = False
    margin: bool = False
    center: float = 0.0

    def objective(self):
        return bt_objective(self.soft_labels, self.margin, self.center)

    def lr(self) -> float:
        if self.train.lr is not None:
            return self.train.lr
        return TINY_LR if self.base_model == "tiny" else PRETRAINED_LR


def train_reward_model(config: RewardRunConfig, inputs: Inputs) -> dict | None:
    """Train, write the model folder, return the final metrics (None on the other ranks of a
    torchrun job). `inputs`: a RunInputs, or a callable returning one (called on rank 0 only)."""
    config.objective()  # refuse bad options before any work

    def make_plan(given: RunInputs) -> dict:
        if not count_rows(given.pairs):
            raise ValueError(f"snapshot {given.snapshot_id} has no pairs; ingest judgments first "
                             "(`bradley ingest FILE`) or check --raters")
        return new_plan("rm", config.out, given)

    def work(plan, device, info):
        result, counts = _train(config, plan, device, info)
        return publish(plan, _metrics(config, plan, result, counts, info)) if info.is_main else None

    return run_planned(config, inputs, make_plan, work)


def _base_model(config: RewardRunConfig, plan: dict, rows: list[dict], info) -> str:
    if config.base_model != "tiny":
        return config.base_model
    from rm.model.reward_model import build_tiny_reward_model
    from rm.model.tokenizer import as_text
    from rm.train.reward_data import row_prompt

    base = str(Path(plan["partial"]) / "_work" / "tiny-base")
    if info.is_main:
        texts = [t for r in rows for t in (as_text(row_prompt(r)), r["chosen"], r["rejected"])]
        build_tiny_reward_model(base, texts, seed=config.train.seed)
    devices.barrier(info)
    return base


def _train(config: RewardRunConfig, plan: dict, device, info):
    from dataclasses import replace

    from rm.model.reward_model import (
        RewardNet,
        count_parameters,
        fit_max_length,
        load_backbone,
        save_model,
    )
    from rm.train import reward_data as data

    rows = read_rows(plan["pairs"])
    if config.margin and any("margin" not in r for r in rows):
        raise ValueError("margin=True needs a `margin` value in every row (rm.train.reward_data.pair_margins)")
    hf_model, tokenizer = load_backbone(_base_model(config, plan, rows, info))
    devices.set_threads(device, info, count_parameters(hf_model))
    max_length = fit_max_length(config.max_length, hf_model)
    pairs = data.tokenize_pairs(tokenizer, rows, max_length)
    train, val = data.split_pairs(pairs, config.val_fraction)
    net = RewardNet(hf_model, tokenizer.sep_token_id)
    side = tokenizer.padding_side if net.is_decoder else "right"
    loop = replace(config.train, lr=config.lr())
    lengths, size, seed = train.lengths(), loop.batch_size, loop.seed

    def epoch_batches(epoch: int):
        batches = data.length_grouped_batches(lengths, size, seed + epoch)
        return [(train, b) for b in data.shard(batches, info.rank, info.world_size)]

    val_all = data.length_grouped_batches(val.lengths(), size, 0, shuffle=False)
    record = _record(config, loop, plan, max_length, info)

    def save(step: int, metrics: dict) -> None:
        save_model(hf_model, tokenizer, plan["partial"], record, {"step": step, **metrics})

    result = train_loop(net, config.objective(), epoch_batches,
                        [(val, b) for b in val_all[info.rank::info.world_size]], loop, device=device,
                        info=info, on_best=save, wrapping=config.wrapping,
                        collate=lambda item: data.collate_pairs(*item, tokenizer.pad_token_id, side))
    counts = {"n_pairs": len(pairs), "n_train": len(train), "n_val": len(val),
              "n_truncated": pairs.n_truncated}
    return result, counts


def _record(config: RewardRunConfig, loop, plan: dict, max_length, info) -> dict:
    """train_config.json: everything needed to trace and reproduce the model."""
    return {"model_id": plan["model_id"], "kind": "rm", "base_model": config.base_model,
            "snapshot_id": plan["snapshot_id"], "raters": plan["raters"], "max_length": max_length,
            "val_fraction": config.val_fraction, "soft_labels": config.soft_labels,
            "margin": config.margin, "center": config.center, "world_size": info.world_size,
            **loop.as_dict()}


def _metrics(config: RewardRunConfig, plan: dict, result: LoopResult, counts: dict, info) -> dict:
    """The run's final JSON line."""
    return {"model_id": plan["model_id"], "path": plan["out"], "snapshot_id": plan["snapshot_id"],
            "base_model": config.base_model, "world_size": info.world_size,
            "train_seconds": round(result.seconds, 2), "steps": result.steps,
            "best_step": result.best_step, "stopped": result.stopped,
            "val_accuracy": result.best.get("accuracy"), "val_loss": result.best.get("loss"),
            "train_loss": result.last_train.get("loss"), **plan["floors"], **counts}
