"""`bradley train po` end to end on real hh-rlhf pairs with a tiny policy: every loss lowers its own
objective, the first step sits at the seed values, the reference cache is hit on a second run, and
the policy is saved (safetensors) and registered with its snapshot."""

import gzip
import json
import math
from pathlib import Path

import pyarrow as pa
import pytest

import rm.train.logps as seqlogps
from annotation.ids import content_id, prompt_id, response_id
from annotation.store import Store
from rm.train import policy as policy_run
from rm.train.loop import TrainConfig
from rm.train.objectives import PoConfig
from rm.train.policy import PolicyRunConfig
from rm.train.run import RunInputs
from service.cli.main import main

N_PAIRS = 8
HH = "hh-rlhf/harmless-base-test.jsonl.gz"


def hh_pairs(path, n):
    """(prompt, chosen, rejected): the prompt is the transcript up to the last Assistant turn."""
    out = []
    with gzip.open(path, "rt") as f:
        for line in f:
            row = json.loads(line)
            cut = row["chosen"].rfind("\n\nAssistant:") + len("\n\nAssistant:")
            prompt = row["chosen"][:cut]
            if row["rejected"][:cut] != prompt or row["chosen"] == row["rejected"]:
                continue
            out.append((prompt, row["chosen"][cut:], row["rejected"][cut:]))
            if len(out) == n:
                return out
    return out


def put_pairs(store, triples, tag="hh"):
    """Write prompts, responses and one judgment per pair through Store.write_batch."""
    prompts, responses, judgments = {}, {}, []
    for i, (prompt, chosen, rejected) in enumerate(triples):
        pid = prompt_id(prompt)
        prompts[pid] = prompt
        ids = [response_id(pid, t) for t in (chosen, rejected)]
        responses.update({rid: (pid, t) for rid, t in zip(ids, (chosen, rejected), strict=True)})
        judgments.append((content_id(tag, str(i)), pid, ids[0], ids[1]))
    tables = {
        "prompts": pa.table({"id": list(prompts), "text": list(prompts.values())}),
        "responses": pa.table({"id": list(responses), "prompt_id": [v[0] for v in responses.values()],
                               "text": [v[1] for v in responses.values()]}),
        "judgments": pa.table({"id": [j[0] for j in judgments], "prompt_id": [j[1] for j in judgments],
                               "response_a": [j[2] for j in judgments],
                               "response_b": [j[3] for j in judgments],
                               "winner": ["a"] * len(judgments), "rater": ["human:test"] * len(judgments),
                               "source": ["trl"] * len(judgments)}),
    }
    store.write_batch(f"test:{tag}", content_id(tag, "sha"), len(judgments), tables)


@pytest.fixture(scope="module")
def hh_triples(shared_data):
    return hh_pairs(shared_data / HH, N_PAIRS)


@pytest.fixture
def filled(store, hh_triples):
    put_pairs(store, hh_triples)
    return store


def po_config(tmp_path, loss, val_fraction=0.1, gradient_checkpointing=0) -> PolicyRunConfig:
    """The run the CLI builds for `train po --loss LOSS --steps 6 --batch-size 8 --max-length 96
    --lr 3e-3`, built directly."""
    loop = TrainConfig(steps=6, batch_size=N_PAIRS, lr=3e-3,
                       gradient_checkpointing=gradient_checkpointing)
    return PolicyRunConfig(base_model="tiny", out=str(tmp_path / f"out-{loss}"), max_length=96,
                           val_fraction=val_fraction, train=loop, objective=PoConfig(loss=loss))


def run(config, store):
    """A snapshot of the test's open store handed to the run, which keeps reference log-probs in it."""
    snapshot_id = store.create_snapshot()
    inputs = RunInputs(pairs=store.pairs(snapshot_id), feedback=store.feedback(snapshot_id),
                       snapshot_id=snapshot_id)
    return policy_run.train_policy(config, inputs, ref_cache=store)


FIRST = {"dpo": math.log(2), "ipo": 1 / (4 * 0.1**2), "kto": 0.5}


@pytest.mark.parametrize("loss", ["dpo", "ipo", "kto", "simpo", "orpo"])
def test_each_loss_lowers_its_objective(filled, tmp_path, loss):
    metrics = run(po_config(tmp_path, loss), filled)
    # one batch holds the whole training split, so first and final losses are on the same pairs
    assert metrics["final_loss"] < metrics["first_loss"]
    if loss in FIRST:
        assert metrics["first_loss"] == pytest.approx(FIRST[loss], abs=1e-4)
    if loss != "kto":
        assert metrics["final_margin"] > metrics["first_margin"]
    assert metrics["steps"] == 6 and metrics["world_size"] == 1


def test_cli_second_run_hits_the_reference_cache_and_both_are_registered(hh_triples, tmp_path,
                                                                         capsys):
    db = tmp_path / "po.duckdb"
    with Store(db) as store:
        put_pairs(store, hh_triples)
    outs = []
    for name in ("first", "second"):
        argv = ["--db", str(db), "train", "po", "--loss", "dpo", "--steps", "3", "--batch-size", "4",
                "--max-length", "96", "--out", str(tmp_path / name)]
        assert main(argv) == 0
        captured = capsys.readouterr()
        outs.append(json.loads(captured.out.strip().splitlines()[-1]))  # the last line is JSON
    first, second = outs
    assert first["ref_computed"] == 2 * N_PAIRS and first["ref_cached"] == 0
    assert second["ref_computed"] == 0 and second["ref_cached"] == 2 * N_PAIRS
    assert second["first_loss"] == pytest.approx(math.log(2), abs=1e-4)
    for key in ("model_id", "path", "loss", "first_loss", "final_loss", "world_size", "train_seconds"):
        assert second[key] is not None
    with Store(db, read_only=True) as store:
        rows = {m["id"]: m for m in store.models()}
    for m in outs:
        assert rows[m["model_id"]]["kind"] == "dpo"
        assert rows[m["model_id"]]["snapshot_id"] == m["snapshot_id"]
    saved = {p.name for p in (tmp_path / "second").iterdir()}
    assert "model.safetensors" in saved and not any(n.endswith((".bin", ".pt")) for n in saved)
    steps = [json.loads(line) for line in captured.err.splitlines() if line.startswith('{"step"')]
    assert len(steps) == 3
    assert {"loss", "reward_chosen", "reward_rejected", "margin", "accuracy", "logp_chosen",
            "kl"} <= set(steps[0])


@pytest.mark.parametrize("flag,value", [("--label-smoothing", "0.5"), ("--beta", "0")])
def test_bad_hyperparameters_exit_cleanly(tmp_path, capsys, flag, value):
    argv = ["--db", str(tmp_path / "x.duckdb"), "train", "po", "--loss", "dpo", flag, value]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert flag.lstrip("-").replace("-", "_") in err and "Traceback" not in err
    assert not list(tmp_path.glob("models*"))


def test_empty_store_is_a_clear_error(store, tmp_path):
    with pytest.raises(ValueError, match="bradley ingest"):
        run(po_config(tmp_path, "dpo"), store)


def test_micro_batches_give_the_whole_batch_training(filled, tmp_path, monkeypatch):
    """Cutting each batch of pairs into equal micro-batches (a forward's token budget) accumulates
    the whole batch's gradient: the same losses and margins as one forward per batch."""
    whole = run(po_config(tmp_path, "dpo", val_fraction=0), filled)
    monkeypatch.setattr(policy_run, "MICRO_BATCH_TOKENS", 2 * N_PAIRS * 96 // 4)
    cut = run(po_config(tmp_path / "cut", "dpo", val_fraction=0), filled)
    assert policy_run.micro_split(N_PAIRS, 96) == 4
    assert cut["first_loss"] == pytest.approx(math.log(2), abs=1e-4)
    for key in ("first_loss", "final_loss", "final_margin"):
        assert cut[key] == pytest.approx(whole[key], rel=1e-4, abs=1e-5)
    assert cut["steps"] == whole["steps"] == 6


def test_reference_pass_forwards_fit_one_training_forward(filled, tmp_path, monkeypatch):
    """The reference pass batches no more padded tokens than a training micro-batch holds, so a
    run's peak memory is its training step's (it was 4096 tokens, whatever the micro-batch)."""
    import torch

    monkeypatch.setattr(policy_run, "MICRO_BATCH_TOKENS", 2 * N_PAIRS * 96 // 4)
    sizes = {True: [], False: []}  # (rows, padded tokens) per forward: reference pass or training
    forward = seqlogps.forward_logps

    def recording(model, batch):
        ids = batch["input_ids"]
        sizes[torch.is_inference_mode_enabled()].append((ids.size(0), ids.numel()))
        return forward(model, batch)

    monkeypatch.setattr(seqlogps, "forward_logps", recording)
    run(po_config(tmp_path, "dpo", val_fraction=0), filled)
    budget = policy_run.forward_tokens(N_PAIRS, 96)
    assert budget == 2 * (N_PAIRS // 4) * 96
    assert sum(rows for rows, _ in sizes[True]) == 2 * N_PAIRS  # each sequence once
    assert max(n for _, n in sizes[True] + sizes[False]) <= budget


def test_gradient_checkpointing_trains_the_same_and_is_recorded(filled, tmp_path, monkeypatch):
    """Recomputing layer activations in the backward pass changes memory, not the arithmetic."""
    plain = run(po_config(tmp_path, "dpo", val_fraction=0), filled)
    lean = run(po_config(tmp_path / "gc", "dpo", val_fraction=0, gradient_checkpointing=1), filled)
    for key in ("first_loss", "final_loss", "final_margin"):
        assert lean[key] == pytest.approx(plain[key], rel=1e-4, abs=1e-5)
    record = json.loads((Path(lean["path"]) / "train_config.json").read_text())
    assert record["gradient_checkpointing"] == 1
    again = PolicyRunConfig.from_record(record)  # the folder's record is the run's config
    assert again.objective == PoConfig(loss="dpo") and again.train.gradient_checkpointing == 1
    assert again.max_length == 96 and again.val_fraction == 0 and again.train.steps == 6
