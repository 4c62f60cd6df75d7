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

from rm.model import device as devices
from rm.train import lora
from rm.train.loop import LoopResult, train_loop
from rm.train.objectives import bt_objective
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

# reference statistics in metrics.json (the files beside the weights hold all of them)
HEADLINE_STATS = ("score_mean", "score_std", "length_correlation", "mahalanobis_p99", "covariance")


@dataclass
class RewardRunConfig(RunConfig):
    """A reward-model run: the shared settings (rm/train/run.py: RunConfig, with the loop's TrainConfig
    as `train`) and the objective's: `soft_labels` (BCE against the vote share p̂ instead of the
    majority), `margin` (each pair's strength as a Bradley–Terry margin; the rows carry a `margin`
    column), `center` (reward-centering coefficient λ)."""

    PRETRAINED_LR = 5e-5
    PRETRAINED_LORA_LR = 2e-4  # adapters start at zero and move a low-rank subspace: a larger step

    soft_labels: bool = False
    margin: bool = False
    center: float = 0.0

    def objective(self):
        return bt_objective(self.soft_labels, self.margin, self.center)


def train_reward_model(config: RewardRunConfig, inputs: Inputs) -> dict | None:
    """Train, write the model folder, return the final metrics (None on the other ranks of a
    torchrun job). `inputs`: a RunInputs, or a callable returning one (called on rank 0 only)."""
    config.objective()  # refuse bad options before any work
    config.lora.check()

    def make_plan(given: RunInputs) -> dict:
        if not count_rows(given.pairs):
            raise ValueError(f"snapshot {given.snapshot_id} has no pairs; ingest judgments first "
                             "(`bradley ingest FILE`) or check --raters")
        return new_plan("rm", config.out, given)

    def work(plan, device, info):
        result, counts = _train(config, plan, device, info)
        if not info.is_main:
            return None
        metrics = _metrics(config, plan, result, counts, info)
        return publish(plan, {**metrics, "reference_stats": _reference_stats(config, plan, device)})

    return run_planned(config, inputs, make_plan, work)


def _reference_stats(config: RewardRunConfig, plan: dict, device) -> dict | None:
    """Rank 0: rm/model/reference_stats.py's statistics of the saved (best) model, written beside
    it: hidden states of the training pairs' responses, scores and distances of the validation
    pairs', split as training split them. Returns their headline numbers; None without
    validation pairs."""
    from rm.model.reference_stats import compute_reference_stats, write_reference_stats
    from rm.model.reward_model import RewardModel
    from rm.train.reward_data import row_prompt, split_of

    sides: dict[str, list] = {"train": [], "val": []}
    for i, row in enumerate(read_rows(plan["pairs"])):
        prompt = row_prompt(row)
        sides[split_of(str(row.get("prompt_id") or i), config.val_fraction)] += [
            (prompt, row["chosen"]), (prompt, row["rejected"])]
    if len(sides["val"]) < 2 or len(sides["train"]) < 2:
        return None
    model = RewardModel.load(plan["partial"], device=device)
    stats = compute_reference_stats(model, sides["train"], sides["val"],
                                    source=f"snapshot {plan['snapshot_id']}")
    write_reference_stats(plan["partial"], stats)
    return {k: v for k, v in stats.as_json().items() if k in HEADLINE_STATS}


def _train(config: RewardRunConfig, plan: dict, device, info):
    from dataclasses import replace

    from rm.model.reward_model import (
        RewardNet,
        build_tiny_reward_model,
        count_parameters,
        fit_max_length,
        load_backbone,
    )
    from rm.train import reward_data as data

    rows = read_rows(plan["pairs"])
    if config.margin and any("margin" not in r for r in rows):
        raise ValueError("margin=True needs a `margin` value in every row (rm.train.reward_data.pair_margins)")
    hf_model, tokenizer = load_backbone(
        base_model_folder(config, plan, info, build_tiny_reward_model, rows))
    devices.set_threads(device, info, count_parameters(hf_model))
    max_length = fit_max_length(config.max_length, hf_model)
    pairs = data.tokenize_pairs(tokenizer, rows, max_length)
    train, val = data.split_pairs(pairs, config.val_fraction)
    net = RewardNet(hf_model, tokenizer.sep_token_id)
    net.go_padding_free(device)  # CUDA: rows end to end, no padded token computed
    adapters = lora.add_adapters(hf_model, config.lora, lora.head_name(hf_model), config.train.seed) \
        if config.lora.enabled else None
    side = tokenizer.padding_side if net.is_decoder else "right"
    loop = replace(config.train, lr=config.lr())
    lengths, size, seed = train.lengths(), loop.batch_size, loop.seed

    def epoch_batches(epoch: int):
        batches = data.length_grouped_batches(lengths, size, seed + epoch)
        return [(train, b) for b in data.shard(batches, info.rank, info.world_size)]

    val_all = data.length_grouped_batches(val.lengths(), size, 0, shuffle=False)
    collate = lambda item: data.collate_pairs(*item, tokenizer.pad_token_id, side)  # noqa: E731
    saver = _Saver(config, hf_model, adapters, tokenizer, plan, _record(config, loop, plan, max_length, info))
    result = train_loop(net, config.objective(), epoch_batches,
                        [(val, b) for b in val_all[info.rank::info.world_size]], loop, device=device,
                        info=info, on_best=saver, wrapping=config.wrapping, collate=collate)
    counts = {"n_pairs": len(pairs), "n_train": len(train), "n_val": len(val),
              "n_truncated": pairs.n_truncated}
    if adapters is not None and info.is_main:
        probe = val if len(val) else train
        counts |= saver.check(net, collate((probe, list(range(min(4, len(probe)))))), device)
    return result, counts


class _Saver:
    """`on_best`: the model folder at the best step; with LoRA, merged weights (and the adapter
    with keep_adapter), and a copy of the adapters and head at that step for `check`."""

    def __init__(self, config: RewardRunConfig, hf_model, adapters, tokenizer, plan: dict, record: dict):
        self.config, self.hf_model, self.adapters, self.tokenizer = config, hf_model, adapters, tokenizer
        self.folder, self.record = plan["partial"], record
        self.best: dict | None = None

    def __call__(self, step: int, metrics: dict) -> None:
        from rm.model.reward_model import save_model

        metrics = {"step": step, **metrics}
        if self.adapters is None:
            save_model(self.hf_model, self.tokenizer, self.folder, self.record, metrics)
            return
        lora.save_merged(self.adapters, self.tokenizer, self.folder, self.record, metrics,
                         self.config.lora.keep_adapter)
        if not devices.is_sharded(self.hf_model):
            self.best = lora.trainable_state(self.hf_model)

    def check(self, net, batch: dict, device) -> dict:
        """The published weights against the adapter model at the saved step (rank 0; a sharded
        model is not checked: its forward needs every rank)."""
        if self.best is None:
            return {"merge_check_max_abs_diff": None}
        lora.load_trainable_state(self.hf_model, self.best)
        return {"merge_check_max_abs_diff": lora.check_merged(net, self.folder, batch, device)}


def _record(config: RewardRunConfig, loop, plan: dict, max_length, info) -> dict:
    """train_config.json: everything needed to trace and reproduce the model."""
    return {"model_id": plan["model_id"], "kind": "rm", "base_model": config.base_model,
            "snapshot_id": plan["snapshot_id"], "raters": plan["raters"], "max_length": max_length,
            "val_fraction": config.val_fraction, "soft_labels": config.soft_labels,
            "margin": config.margin, "center": config.center, "world_size": info.world_size,
            **loop.as_dict(), **config.lora.as_record()}


def _metrics(config: RewardRunConfig, plan: dict, result: LoopResult, counts: dict, info) -> dict:
    """The run's final JSON line."""
    return {"model_id": plan["model_id"], "path": plan["out"], "snapshot_id": plan["snapshot_id"],
            "base_model": config.base_model, "world_size": info.world_size,
            "train_seconds": round(result.seconds, 2), "steps": result.steps,
            "best_step": result.best_step, "stopped": result.stopped,
            "val_accuracy": result.best.get("accuracy"), "val_loss": result.best.get("loss"),
            "train_loss": result.last_train.get("loss"), **plan["floors"], **counts}
