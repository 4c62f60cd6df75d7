"""`torchrun --nproc_per_node 2` on CPU (gloo): `bradley train rm` and `bradley train po --loss dpo`
run as two processes, each on its own half of the batches; after the last optimizer step both ranks
hold bit-identical weights (DDP all-reduces gradients, so every rank takes the same step), those
weights moved away from where they started, the JSON line reports world_size 2, and only rank 0
writes and registers the model.

The same runs with `--fsdp` (FSDP2 `fully_shard`, each rank holding half of every parameter,
gradient and optimizer state) take the same steps: the same validation loss, and a checkpoint that
plain `from_pretrained` loads with DDP's weights (to float rounding: a reduce-scatter sums in
another order than an all-reduce)."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from annotation.store import Store
from tests.rm.train.test_train import synthetic_pairs, write_pairs
from tests.rm.train.test_train_po import hh_pairs, put_pairs

ROOT = Path(__file__).resolve().parents[3]
RUNNER = Path(__file__).with_name("torchrun_ranks.py")


def torchrun(argv: list[str], weights: Path) -> dict:
    weights.mkdir()
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT), RANK_WEIGHTS=str(weights))
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
               "--master_port", str(29500 + os.getpid() % 1000), str(RUNNER), *argv]
    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    assert len(lines) == 1, done.stdout   # one JSON line, from rank 0 only
    return json.loads(lines[0])


def plain_torchrun(argv: list[str]) -> dict:
    """torchrun -m service.cli.main ARGV on two CPU processes; the JSON line."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
               "--master_port", str(29500 + (os.getpid() + 500) % 1000), "-m", "service.cli", *argv]
    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def assert_same_checkpoints(a: str, b: str, auto_class) -> None:
    first, second = (auto_class.from_pretrained(p).state_dict() for p in (a, b))
    assert first.keys() == second.keys()
    for name in first:
        assert torch.allclose(first[name], second[name], atol=1e-5, rtol=1e-4), name


def assert_ranks_agree(weights: Path) -> None:
    ranks = [load_file(weights / f"rank{r}.safetensors") for r in (0, 1)]
    starts = [load_file(weights / f"rank{r}.start.safetensors") for r in (0, 1)]
    assert ranks[0].keys() == ranks[1].keys() and len(ranks[0]) > 5
    for name in ranks[0]:
        assert torch.equal(ranks[0][name], ranks[1][name]), f"{name} differs between ranks"
        assert torch.equal(starts[0][name], starts[1][name]), f"{name} started differently"
    moved = [n for n in ranks[0] if not torch.equal(ranks[0][n], starts[0][n])]
    assert len(moved) > len(ranks[0]) // 2, "training did not change the weights"


def test_train_rm_two_processes(tmp_path):
    db = str(tmp_path / "store.duckdb")
    with Store(db) as store:
        write_pairs(store, synthetic_pairs(96))
    args = ["--db", db, "train", "rm", "--device", "cpu", "--steps", "6", "--batch-size", "4",
            "--eval-every", "3"]
    metrics = torchrun([*args, "--out", str(tmp_path / "ddp")], tmp_path / "weights")
    assert metrics["world_size"] == 2 and metrics["steps"] == 6
    assert (Path(metrics["path"]) / "model.safetensors").is_file()
    with Store(db, read_only=True) as store:
        assert [m["id"] for m in store.models()] == [metrics["model_id"]]
    assert_ranks_agree(tmp_path / "weights")

    from transformers import AutoModelForSequenceClassification

    sharded = plain_torchrun([*args, "--fsdp", "--out", str(tmp_path / "fsdp")])
    assert sharded["world_size"] == 2 and sharded["best_step"] == metrics["best_step"]
    assert sharded["val_loss"] == pytest.approx(metrics["val_loss"], abs=1e-5)
    assert_same_checkpoints(metrics["path"], sharded["path"], AutoModelForSequenceClassification)


def test_train_dpo_two_processes(tmp_path, shared_data):
    db = str(tmp_path / "po.duckdb")
    with Store(db) as store:
        put_pairs(store, hh_pairs(shared_data / "hh-rlhf/harmless-base-test.jsonl.gz", 16))
    args = ["--db", db, "train", "po", "--loss", "dpo", "--device", "cpu", "--steps", "3",
            "--batch-size", "2", "--max-length", "96"]
    metrics = torchrun([*args, "--out", str(tmp_path / "dpo")], tmp_path / "weights")
    assert metrics["world_size"] == 2 and metrics["steps"] == 3 and math.isfinite(metrics["loss"])
    assert (Path(metrics["path"]) / "model.safetensors").is_file()
    with Store(db, read_only=True) as store:
        assert [(m["id"], m["kind"]) for m in store.models()] == [(metrics["model_id"], "dpo")]
    assert_ranks_agree(tmp_path / "weights")

    from transformers import AutoModelForCausalLM

    sharded = plain_torchrun([*args, "--fsdp", "--out", str(tmp_path / "dpo-fsdp")])
    assert sharded["world_size"] == 2 and sharded["final_loss"] == pytest.approx(metrics["final_loss"],
                                                                                 abs=1e-5)
    assert_same_checkpoints(metrics["path"], sharded["path"], AutoModelForCausalLM)


def assert_ranks_agree_on_adapters(weights: Path) -> None:
    """Both ranks end with the same adapters and head, moved from where they started (B = 0);
    the base weights stay where they started."""
    ranks = [load_file(weights / f"rank{r}.safetensors") for r in (0, 1)]
    starts = [load_file(weights / f"rank{r}.start.safetensors") for r in (0, 1)]
    adapters = [name for name in ranks[0] if "lora_" in name or "modules_to_save" in name]
    assert len(adapters) > 10
    for name in ranks[0]:
        assert torch.equal(ranks[0][name], ranks[1][name]), f"{name} differs between ranks"
        assert torch.equal(starts[0][name], starts[1][name]), f"{name} started differently"
        if name not in adapters and ".original_module." not in name:
            assert torch.equal(ranks[0][name], starts[0][name]), f"frozen {name} moved"
    moved = [n for n in adapters if "lora_B" in n and not torch.equal(ranks[0][n], starts[0][n])]
    assert moved and len(moved) == len([n for n in adapters if "lora_B" in n])


def test_lora_dpo_two_processes_end_with_the_same_adapters(tmp_path, shared_data):
    db = str(tmp_path / "po.duckdb")
    with Store(db) as store:
        put_pairs(store, hh_pairs(shared_data / "hh-rlhf/harmless-base-test.jsonl.gz", 16))
    args = ["--db", db, "train", "po", "--loss", "dpo", "--device", "cpu", "--steps", "3",
            "--batch-size", "2", "--max-length", "96", "--lora-rank", "4"]
    metrics = torchrun([*args, "--out", str(tmp_path / "dpo")], tmp_path / "weights")
    assert metrics["world_size"] == 2 and metrics["first_loss"] == pytest.approx(math.log(2), abs=1e-4)
    assert_ranks_agree_on_adapters(tmp_path / "weights")


def test_lora_rm_under_ddp_and_fsdp_publishes_the_same_merged_model(tmp_path):
    from transformers import AutoModelForSequenceClassification

    db = str(tmp_path / "store.duckdb")
    with Store(db) as store:
        write_pairs(store, synthetic_pairs(96))
    args = ["--db", db, "train", "rm", "--device", "cpu", "--steps", "4", "--batch-size", "4",
            "--eval-every", "2", "--lora-rank", "4"]
    ddp = plain_torchrun([*args, "--out", str(tmp_path / "ddp")])
    sharded = plain_torchrun([*args, "--fsdp", "--out", str(tmp_path / "fsdp")])
    assert ddp["merge_check_max_abs_diff"] < 1e-5 and ddp["best_step"] == sharded["best_step"]
    assert sharded["val_loss"] == pytest.approx(ddp["val_loss"], abs=1e-5)
    assert_same_checkpoints(ddp["path"], sharded["path"], AutoModelForSequenceClassification)
