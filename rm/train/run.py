"""The frame every training run shares (rm/train/reward.py, rm/train/policy.py), under torchrun or not:
the settings both take (`RunConfig`), what the caller hands in (`RunInputs`), planning on rank 0
and its broadcast, the hidden partial folder, and one `publish`.

A run never opens the store: the caller hands it rows (or a Parquet or Arrow IPC file of them) with
the snapshot id they came from and the loss floors as numbers, and registers the published model afterwards
(the CLI does both: service/cli/train.py). A run's life:

1. every rank: `devices.setup`, `torch.manual_seed(config.train.seed)`;
2. rank 0 alone: the inputs (a `RunInputs`, or a callable returning one, so a torchrun job reads
   its store once), a new model id, the partial folder `.NAME.partial-ID` beside `--out` with the
   rows frozen as Arrow IPC files under `_work/`; the plan (ids and paths, JSON) is broadcast, and an
   error there reaches every rank as the same ValueError instead of leaving them waiting;
3. every rank: the run's work, reading the rows from `_work/`;
4. rank 0: `publish` — `_work/` removed, metrics.json written with the weights' sha256, the partial
   folder renamed into place. On failure the partial folder is removed: nothing half-written remains.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from rm.model import device as devices
from rm.model.weights import share_weights, weights_sha256
from rm.train.loop import TrainConfig
from rm.train.lora import LoraSettings

NO_FLOORS = {"entropy_floor": None, "bt_floor": None}


@dataclass
class RunConfig:
    """What every run takes. `out` None: models/<model id>. `device`: auto | cpu | cuda | cuda:N.
    `max_length` is cut to the base model's position limit. `val_fraction` of the prompts (split by
    prompt hash, rm/train/reward_data.py) is held out for validation. `wrapping` names how the loop wraps the
    model for several processes (rm/train/loop.py: WRAPPERS). `lora`: low-rank adapters instead of
    full fine-tuning (rm/train/lora.py; rank 0: off). Each kind of run sets its default learning
    rates for a pretrained base, PRETRAINED_LR and PRETRAINED_LORA_LR (`lr`)."""

    TINY_LR = 1e-3  # random init takes a larger step than fine-tuning

    base_model: str = "tiny"
    out: str | None = None
    device: str = "auto"
    max_length: int = 512
    val_fraction: float = 0.1
    train: TrainConfig = field(default_factory=TrainConfig)
    wrapping: str = "ddp"
    lora: LoraSettings = field(default_factory=LoraSettings)

    @classmethod
    def from_record(cls, record: dict):
        """The config a model folder's train_config.json was trained with (flat keys; the loop's
        among them). Keys the record lacks keep their defaults; `out` and `device` are not recorded.

        >>> RunConfig.from_record({"base_model": "tiny", "max_length": 64, "steps": 3}).train.steps
        3
        """
        own = {f.name for f in dataclasses.fields(cls)} - {"train", "objective", "lora"}
        loop = {f.name for f in dataclasses.fields(TrainConfig)}
        return cls(**{k: record[k] for k in own if k in record},
                   train=TrainConfig(**{k: record[k] for k in loop if k in record}),
                   lora=LoraSettings.from_record(record))

    def lr(self) -> float:
        """The peak learning rate: `train.lr`, or the default for the base model."""
        if self.train.lr is not None:
            return self.train.lr
        if self.base_model == "tiny":
            return self.TINY_LR
        return self.PRETRAINED_LORA_LR if self.lora.enabled else self.PRETRAINED_LR


@dataclass
class RunInputs:
    """What the caller hands a run: resolved pairs (prompt, chosen, rejected, p_chosen, prompt_id,
    ...: rows as `Store.pairs()` gives them, an Arrow table, or a Parquet or Arrow IPC file of them), unpaired
    feedback rows for KTO, the snapshot id they were read from and its rater filter (recorded in
    the model folder), and the loss floors of the same data (analysis.cycles.loss_floors)."""

    pairs: list | object = ()
    feedback: list | object = ()
    snapshot_id: str | None = None
    raters: str | None = None
    floors: dict = field(default_factory=lambda: dict(NO_FLOORS))


Inputs = RunInputs | Callable[[], RunInputs]


def run_planned(config: RunConfig, inputs: Inputs, make_plan: Callable, work: Callable) -> dict | None:
    """Rank 0 runs `make_plan(inputs)` (the caller's `inputs()` first when it is a callable) and
    broadcasts the plan; every rank then runs `work(plan, device, info)`. The caller's torch
    thread count is restored either way; on failure the partial folder is removed."""
    device, info = devices.setup(config.device)
    plan, threads = None, torch.get_num_threads()
    try:
        torch.manual_seed(config.train.seed)
        plan = devices.broadcast_json(_plan_or_error(make_plan, inputs) if info.is_main else None,
                                      info, device)
        if "error" in plan:
            message, plan = plan["error"], None
            raise ValueError(message)
        return work(plan, device, info)
    except BaseException:
        if info.is_main and plan is not None:
            shutil.rmtree(plan["partial"], ignore_errors=True)
        raise
    finally:
        torch.set_num_threads(threads)
        devices.teardown()


def _plan_or_error(make_plan: Callable, inputs: Inputs) -> dict:
    try:
        return make_plan(inputs() if callable(inputs) else inputs)
    except ValueError as exc:
        return {"error": str(exc)}


def base_model_folder(config: RunConfig, plan: dict, info, build: Callable, pairs: list[dict],
                      feedback: list[dict] = ()) -> str:
    """`config.base_model`, or for `tiny` a model that `build` (rm/model/reward_model.py:
    build_tiny_reward_model or build_tiny_causal_lm) writes on rank 0 under the partial folder, its
    tokenizer trained on the run's prompts and responses."""
    if config.base_model != "tiny":
        return config.base_model
    from rm.model.tokenizer import as_text
    from rm.train.reward_data import row_prompt

    base = str(Path(plan["partial"]) / "_work" / "tiny-base")
    if info.is_main:
        texts = [t for r in pairs for t in (as_text(row_prompt(r)), r["chosen"], r["rejected"])]
        texts += [t for r in feedback for t in (as_text(row_prompt(r)), r["completion"])]
        build(base, texts, seed=config.train.seed)
    devices.barrier(info)
    return base


def check_out_folder(folder: str | Path) -> Path:
    """The resolved output folder; refuses one that exists, is not empty and is not a model folder.
    (Whether a model folder may be replaced is the caller's decision: the CLI refuses a folder
    registered in the store unless told `--overwrite`.)"""
    folder = Path(folder).resolve()
    if folder.exists() and any(folder.iterdir()) and not (folder / "train_config.json").is_file():
        raise ValueError(f"--out {folder} exists and is not a bradley model folder; choose another")
    return folder


def new_model_folder(kind: str, out: str | None) -> tuple[str, Path]:
    """A fresh model id and its output folder (default models/<id>)."""
    model_id = f"{kind}-{uuid.uuid4().hex[:12]}"
    return model_id, check_out_folder(out or Path("models") / model_id)


def new_plan(kind: str, out: str | None, given: RunInputs) -> dict:
    """Rank 0: ids, the partial folder, and the inputs frozen as Arrow IPC files under its `_work/`
    (IPC rather than Parquet: reading a Parquet file loads Arrow's dataset libraries, resident
    memory a training process would carry to its end)."""
    model_id, folder = new_model_folder(kind, out)
    partial = folder.parent / f".{folder.name}.partial-{model_id}"
    (partial / "_work").mkdir(parents=True)
    plan = {"model_id": model_id, "out": str(folder), "partial": str(partial),
            "snapshot_id": given.snapshot_id, "raters": given.raters,
            "floors": {**NO_FLOORS, **(given.floors or {})}}
    for name in ("pairs", "feedback"):
        plan[name] = _freeze(getattr(given, name), partial / "_work" / f"{name}.arrow")
    return plan


def count_rows(rows) -> int:
    """Rows in a list, an Arrow table, or a Parquet or Arrow IPC file (a Parquet file's footer
    only; an IPC file is memory-mapped, so reading it whole copies nothing)."""
    if isinstance(rows, str | Path):
        if str(rows).endswith(".parquet"):
            import pyarrow.parquet as pq

            return pq.ParquetFile(rows).metadata.num_rows
        return _read_table(rows).num_rows
    return len(rows)


def _freeze(rows, path: Path) -> str | None:
    """A file every rank can read: the caller's own Parquet or IPC file, or `rows` written to
    `path` as Arrow IPC."""
    if isinstance(rows, str | Path):
        if not Path(rows).is_file():
            raise ValueError(f"{rows}: no such Parquet or Arrow file of rows")
        return str(Path(rows).resolve())
    if not len(rows):
        return None
    import pyarrow as pa

    table = rows if isinstance(rows, pa.Table) else pa.Table.from_pylist(list(rows))
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)
    return str(path)


def _read_table(path: str | Path):
    """A Parquet file (by its suffix) or an Arrow IPC file, whole."""
    import pyarrow as pa

    if str(path).endswith(".parquet"):
        import pyarrow.parquet as pq

        return pq.ParquetFile(path).read()  # not pq.read_table: that loads the dataset libraries
    with pa.memory_map(str(path)) as source:
        return pa.ipc.open_file(source).read_all()


def read_rows(path: str | None) -> list[dict]:
    """The rows a plan froze (none for None)."""
    if path is None:
        return []
    return _read_table(path).to_pylist()


def publish(plan: dict, metrics: dict) -> dict:
    """Rank 0: drop `_work/`, write metrics.json (with the weights' sha256, which a registered model
    id is checked against when it is loaded) and move the partial folder into place."""
    partial, out = Path(plan["partial"]), Path(plan["out"])
    shutil.rmtree(partial / "_work", ignore_errors=True)
    metrics = {**metrics, "weights_sha256": weights_sha256(partial)}
    (partial / "metrics.json").write_text(json.dumps(metrics, indent=2))
    share_weights(partial)
    if out.exists():
        shutil.rmtree(out)  # a previous bradley model in the same --out (checked in new_model_folder)
    partial.rename(out)
    return metrics
