"""`bradley train rm`: a store snapshot → tokenized pairs → rm/train.py's loop → a registered model.

The objective is Bradley–Terry, −log σ(r_c − r_r − m) (Bradley & Terry 1952; Ouyang et al. 2022,
eq. 1), or with `--soft-labels` the binary cross-entropy against the vote share p̂, plus optional
reward centering λ·(r_c + r_r)² (rm/losses.py). Chosen and rejected go through one forward.

    >>> import torch
    >>> class Fixed(torch.nn.Module):
    ...     def forward(self, input_ids, attention_mask):
    ...         return torch.tensor([2.0, 1.0])
    >>> batch = {"input_ids": None, "attention_mask": None, "p_chosen": torch.ones(1)}
    >>> round(bt_objective()(Fixed(), batch)[0].item(), 3)  # σ(1) = 0.731 → −log 0.731
    0.313
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from rm import device as devices
from rm.train import LoopResult, TrainConfig, new_model_folder, run_planned, train_loop


def bt_objective(soft_labels: bool = False, use_margin: bool = False, center: float = 0.0):
    """objective(model, batch) for reward models: Bradley–Terry (or soft-label BCE against p̂),
    optional margin and reward centering (rm/losses.py); chosen and rejected in one forward."""
    from rm.losses import LOSSES

    if soft_labels and use_margin:
        raise ValueError("--soft-labels and --margin do not combine: the soft target p̂ already "
                         "carries how clear the preference was; pick one")

    def objective(model, batch):
        rewards = model(batch["input_ids"], batch["attention_mask"])
        b = rewards.shape[0] // 2
        chosen, rejected = rewards[:b], rewards[b:]
        if soft_labels:
            per_pair = LOSSES["soft"](chosen, rejected, batch["p_chosen"])
        else:
            per_pair = LOSSES["bt"](chosen, rejected, batch["margin"] if use_margin else None)
        if center:
            per_pair = per_pair + LOSSES["center"](chosen, rejected, center)
        loss = per_pair.mean()
        return loss, _bt_metrics(loss, chosen.detach(), rejected.detach(), batch["p_chosen"])

    return objective


def _bt_metrics(loss, chosen, rejected, p_chosen) -> dict:
    decided = p_chosen != 0.5  # a tied vote has no right answer: out of the accuracy
    right = (chosen > rejected).float() + 0.5 * (chosen == rejected).float()
    return {"n": chosen.numel(), "loss": float(loss.detach()),
            "accuracy": (float(right[decided].sum()), float(decided.sum())),
            "margin": float((chosen - rejected).mean())}


def run_rm(args) -> dict | None:
    """Train a reward model from a store snapshot; register it; return the final metrics.

    Under torchrun only rank 0 opens the DuckDB file: it freezes the snapshot's pairs into a Parquet
    file and closes the store; every rank reads that file; rank 0 registers the model at the end.
    The model is written to a hidden `.NAME.partial-ID` folder and moved into place only when
    training succeeded, so a failed run leaves nothing half-written.
    """
    bt_objective(args.soft_labels, args.margin, args.center)  # refuse bad options before any work

    def work(plan, device, info):
        result, counts, config = _train_rm(args, plan, device, info)
        return _publish(args, plan, result, counts, config, info) if info.is_main else None

    return run_planned(args, _plan, work)


def _plan(args) -> dict:
    """Rank 0: snapshot → Parquet, loss floors, output folders."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from annotation.store import Store

    model_id, out = new_model_folder("rm", args.out)
    with Store(args.db) as store:
        snapshot_id = args.snapshot or store.create_snapshot(args.raters)
        table = store.pairs(snapshot_id)
        if table.num_rows == 0:
            raise ValueError(f"snapshot {snapshot_id} has no pairs; ingest judgments first "
                             "(`bradley ingest FILE`) or check --raters")
        if args.margin:
            from rm.data import pair_margins

            margins = pair_margins(store.judgments(snapshot_id), table)
            table = table.append_column("margin", pa.array(margins, pa.float64()))
        floors = _floors(store, snapshot_id)
    partial = out.parent / f".{out.name}.partial-{model_id}"
    (partial / "_work").mkdir(parents=True)
    pq.write_table(table, partial / "_work" / "pairs.parquet")
    return {"model_id": model_id, "out": str(out), "partial": str(partial), "floors": floors,
            "snapshot_id": snapshot_id, "pairs": str(partial / "_work" / "pairs.parquet")}


def _floors(store, snapshot_id: str) -> dict:
    """entropy_floor / bt_floor of the same snapshot from the cycles analysis (None if absent)."""
    try:
        from analysis.cycles import analyze

        found = analyze(store.verdict_arrays(snapshot_id))
        return {k: found.get(k) for k in ("entropy_floor", "bt_floor")}
    except (ImportError, AttributeError, KeyError, ValueError):
        return {"entropy_floor": None, "bt_floor": None}


def _base_model(args, plan: dict, rows: list[dict], info) -> str:
    if args.base_model != "tiny":
        return args.base_model
    from rm.data import row_prompt
    from rm.model import build_tiny_reward_model
    from rm.tokenizer import as_text

    base = str(Path(plan["partial"]) / "_work" / "tiny-base")
    if info.is_main:
        texts = [t for r in rows for t in (as_text(row_prompt(r)), r["chosen"], r["rejected"])]
        build_tiny_reward_model(base, texts, seed=args.seed)
    devices.barrier(info)
    return base


def _train_rm(args, plan, device, info):
    import pyarrow.parquet as pq

    from rm import data
    from rm.model import RewardNet, count_parameters, fit_max_length, load_backbone, save_model

    rows = pq.read_table(plan["pairs"]).to_pylist()
    hf_model, tokenizer = load_backbone(_base_model(args, plan, rows, info))
    devices.set_threads(device, info, count_parameters(hf_model))
    args.max_length = fit_max_length(args.max_length, hf_model)
    pairs = data.tokenize_pairs(tokenizer, rows, args.max_length)
    train, val = data.split_pairs(pairs, args.val_fraction)
    net = RewardNet(hf_model, tokenizer.sep_token_id)
    side = tokenizer.padding_side if net.is_decoder else "right"
    config = _train_config(args)
    lengths = train.lengths()

    def epoch_batches(epoch: int):
        batches = data.length_grouped_batches(lengths, args.batch_size, args.seed + epoch)
        return [(train, b) for b in data.shard(batches, info.rank, info.world_size)]

    val_all = data.length_grouped_batches(val.lengths(), args.batch_size, 0, shuffle=False)
    record = _record(args, plan, config, info)

    def save(step: int, metrics: dict) -> None:
        save_model(hf_model, tokenizer, plan["partial"], record, {"step": step, **metrics})

    result = train_loop(net, bt_objective(args.soft_labels, args.margin, args.center),
                        epoch_batches, [(val, b) for b in val_all[info.rank::info.world_size]],
                        config, device=device, info=info, on_best=save,
                        collate=lambda item: data.collate_pairs(*item, tokenizer.pad_token_id, side))
    counts = {"n_pairs": len(pairs), "n_train": len(train), "n_val": len(val),
              "n_truncated": pairs.n_truncated}
    return result, counts, config


def _train_config(args) -> TrainConfig:
    lr = args.lr or (1e-3 if args.base_model == "tiny" else 5e-5)  # random init takes a larger step
    return TrainConfig(lr=lr, epochs=args.epochs, steps=args.steps, batch_size=args.batch_size,
                       grad_accum=args.grad_accum, warmup_ratio=args.warmup_ratio,
                       eval_every=args.eval_every, patience=args.patience,
                       max_seconds=args.max_seconds, seed=args.seed,
                       gradient_checkpointing=args.gradient_checkpointing)


def _record(args, plan: dict, config: TrainConfig, info) -> dict:
    """train_config.json: everything needed to trace and reproduce the model."""
    return {"model_id": plan["model_id"], "kind": "rm", "base_model": args.base_model,
            "snapshot_id": plan["snapshot_id"], "raters": args.raters, "max_length": args.max_length,
            "val_fraction": args.val_fraction, "soft_labels": args.soft_labels,
            "margin": args.margin, "center": args.center, "world_size": info.world_size,
            **config.as_dict()}


def _publish(args, plan: dict, result: LoopResult, counts: dict, config, info) -> dict:
    """Rank 0: move the best checkpoint into place, register it, and build the final JSON line."""
    from annotation.store import Store

    partial, out = Path(plan["partial"]), Path(plan["out"])
    shutil.rmtree(partial / "_work", ignore_errors=True)
    metrics = {"model_id": plan["model_id"], "path": str(out), "snapshot_id": plan["snapshot_id"],
               "base_model": args.base_model, "world_size": info.world_size,
               "train_seconds": round(result.seconds, 2), "steps": result.steps,
               "best_step": result.best_step, "stopped": result.stopped,
               "val_accuracy": result.best.get("accuracy"), "val_loss": result.best.get("loss"),
               "train_loss": result.last_train.get("loss"), **plan["floors"], **counts}
    (partial / "metrics.json").write_text(json.dumps(metrics, indent=2))
    if out.exists():
        shutil.rmtree(out)  # a previous bradley model in the same --out (checked in _plan)
    partial.rename(out)
    with Store(args.db) as store:
        store.register_model("rm", args.base_model, str(out), plan["snapshot_id"],
                             _record(args, plan, config, info), metrics, model_id=plan["model_id"])
    return metrics


