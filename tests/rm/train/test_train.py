"""The shared training loop and `bradley train rm`, on tiny models built from a config."""

import json
import math
import random
from pathlib import Path

import pyarrow as pa
import pytest
import torch

from annotation.ids import content_id, prompt_id, response_id
from annotation.store import Store
from rm.model.reward_model import (
    RewardNet,
    build_tiny_causal_lm,
    build_tiny_reward_model,
    load_backbone,
)
from rm.train import reward_data as data
from rm.train.loop import TrainConfig, enable_checkpointing, lr_factor, train_loop
from rm.train.objectives import bt_objective
from service.cli import main as cli

ROOT = Path(__file__).resolve().parents[3]
GOOD = ("correct", "clear", "helpful", "precise")
BAD = ("wrong", "vague", "useless", "sloppy")




def synthetic_pairs(n: int, seed: int = 0) -> list[tuple[str, str, str]]:
    """(prompt, chosen, rejected): chosen answers use good words, rejected ones bad words."""
    rng = random.Random(seed)
    pairs = []
    for i in range(n):
        words = rng.randint(2, 12)
        chosen = " ".join(rng.choice(GOOD + ("the", "answer")) for _ in range(words))
        rejected = " ".join(rng.choice(BAD + ("the", "answer")) for _ in range(words))
        pairs.append((f"question {i} on topic {rng.randint(0, 9)}", chosen, rejected))
    return pairs


def write_pairs(store: Store, pairs, rater: str = "human:1", strength=None) -> None:
    """Write one judgment per (prompt, chosen, rejected) straight into the store."""
    prompts, responses, judgments = {}, {}, []
    for k, (p, c, r) in enumerate(pairs):
        pid = prompt_id(p)
        prompts[pid] = {"id": pid, "text": p}
        a, b = response_id(pid, c), response_id(pid, r)
        responses[a] = {"id": a, "prompt_id": pid, "text": c}
        responses[b] = {"id": b, "prompt_id": pid, "text": r}
        judgments.append({"id": content_id(rater, str(k), p), "prompt_id": pid, "response_a": a,
                          "response_b": b, "winner": "a", "rater": rater, "source": "test",
                          "strength": strength})
    tables = {"prompts": pa.Table.from_pylist(list(prompts.values())),
              "responses": pa.Table.from_pylist(list(responses.values())),
              "judgments": pa.Table.from_pylist(judgments)}
    store.write_batch("test", content_id(rater, str(len(pairs)), pairs[0][0]), len(pairs), tables)


@pytest.fixture
def db(tmp_path):
    path = tmp_path / "store.duckdb"
    with Store(path) as store:
        write_pairs(store, synthetic_pairs(96))
    return str(path)


def _tiny_setup(tmp_path, pairs, arch="llama"):
    texts = [t for p in pairs for t in p]
    hf, tok = load_backbone(str(build_tiny_reward_model(tmp_path / arch, texts, arch=arch)))
    rows = [{"prompt": p, "chosen": c, "rejected": r} for p, c, r in pairs]
    return RewardNet(hf, tok.sep_token_id), tok, data.tokenize_pairs(tok, rows, 128)


def _batches(pairs, tok, batch_size=8):
    idx = data.length_grouped_batches(pairs.lengths(), batch_size, 0, shuffle=False)
    return [data.collate_pairs(pairs, b, tok.pad_token_id) for b in idx]


class FixedRewards(torch.nn.Module):
    """A 'model' that returns given rewards, to check the objective against hand values."""

    def __init__(self, rewards):
        super().__init__()
        self.rewards = torch.tensor(rewards)

    def forward(self, input_ids, attention_mask):
        return self.rewards


def test_bt_objective_matches_hand_computed_losses():
    batch = {"input_ids": None, "attention_mask": None, "p_chosen": torch.tensor([1.0]),
             "margin": torch.tensor([1.0])}
    model = FixedRewards([2.0, 1.0])  # r_c = 2, r_r = 1: P = σ(1) = 0.731, loss −log 0.731 = 0.313
    loss, metrics = bt_objective()(model, batch)
    assert loss.item() == pytest.approx(0.3133, abs=1e-4)
    assert metrics["accuracy"] == (1.0, 1.0) and metrics["n"] == 1
    assert bt_objective(use_margin=True)(model, batch)[0].item() == pytest.approx(math.log(2), abs=1e-6)
    centered = bt_objective(center=0.01)(model, batch)[0].item()  # + 0.01 · (2 + 1)² = 0.09
    assert centered == pytest.approx(0.3133 + 0.09, abs=1e-4)
    soft = dict(batch, p_chosen=torch.tensor([0.5]))  # −½ log σ(1) − ½ log σ(−1) = 0.8133
    loss, metrics = bt_objective(soft_labels=True)(model, soft)
    assert loss.item() == pytest.approx(0.8133, abs=1e-4)
    assert metrics["accuracy"] == (0.0, 0.0)  # a tie has no right answer


def test_warmup_then_cosine_schedule():
    assert [round(lr_factor(s, 4, 14), 3) for s in (0, 3, 4, 9, 14)] == [0.2, 0.8, 1.0, 0.5, 0.0]


def test_one_step_changes_every_trainable_parameter(tmp_path):
    pairs = synthetic_pairs(8)
    net, tok, tp = _tiny_setup(tmp_path, pairs)
    before = {n: p.detach().clone() for n, p in net.named_parameters()}
    result = train_loop(net, bt_objective(), _batches(tp, tok), [], TrainConfig(steps=1, lr=1e-3,
                        warmup_ratio=0.0))
    assert result.steps == 1
    unchanged = [n for n, p in net.named_parameters() if torch.equal(before[n], p.detach())]
    assert unchanged == []


def test_overfits_16_pairs_to_full_accuracy(tmp_path):
    pairs = synthetic_pairs(16, seed=1)
    net, tok, tp = _tiny_setup(tmp_path, pairs)
    batches = _batches(tp, tok)
    config = TrainConfig(steps=60, lr=3e-3, warmup_ratio=0.0, eval_every=20, patience=None)
    result = train_loop(net, bt_objective(), batches, batches, config)
    assert result.best["accuracy"] == 1.0
    assert result.best["loss"] < 0.1


@pytest.mark.parametrize("arch", ["llama", "bert"])
def test_decoder_and_encoder_bases_both_train(tmp_path, arch):
    pairs = synthetic_pairs(32, seed=2)
    net, tok, tp = _tiny_setup(tmp_path, pairs, arch=arch)
    batches = _batches(tp, tok)
    config = TrainConfig(steps=40, lr=3e-3, warmup_ratio=0.0, eval_every=40, patience=None)
    start = train_loop(net, bt_objective(), batches, batches, TrainConfig(steps=1, lr=1e-9)).best
    result = train_loop(net, bt_objective(), batches, batches, config)
    assert result.best["loss"] < 0.5 * start["loss"]
    assert result.best["accuracy"] >= 0.9


def test_early_stopping_and_time_limit(tmp_path):
    pairs = synthetic_pairs(8)
    net, tok, tp = _tiny_setup(tmp_path, pairs)
    batches = _batches(tp, tok)
    frozen = TrainConfig(steps=50, lr=0.0, eval_every=1, patience=2)  # lr 0: never improves
    assert train_loop(net, bt_objective(), batches, batches, frozen).stopped == "early_stopping"
    timed = TrainConfig(steps=10_000, max_seconds=0.0)
    result = train_loop(net, bt_objective(), batches, [], timed)
    assert result.stopped == "time" and result.steps == 1


def _train_cli(db, out, *extra) -> tuple[int, dict]:
    from contextlib import redirect_stdout
    from io import StringIO

    buf = StringIO()
    with redirect_stdout(buf):
        status = cli.main(["--db", db, "train", "rm", "--out", str(out), "--device", "cpu", *extra])
    lines = buf.getvalue().strip().splitlines()
    return status, (json.loads(lines[-1]) if lines else {})


def test_train_rm_cli_registers_the_model_and_ends_with_a_json_line(db, tmp_path):
    status, metrics = _train_cli(db, tmp_path / "rm", "--steps", "12", "--batch-size", "8")
    assert status == 0
    for key in ("model_id", "path", "snapshot_id", "world_size", "train_seconds", "val_accuracy",
                "val_loss", "entropy_floor", "bt_floor"):
        assert key in metrics
    assert metrics["world_size"] == 1 and metrics["n_pairs"] == 96 and metrics["steps"] == 12
    assert metrics["n_train"] + metrics["n_val"] == 96
    folder = Path(metrics["path"])
    assert (folder / "model.safetensors").is_file() and (folder / "tokenizer.json").is_file()
    config = json.loads((folder / "train_config.json").read_text())
    assert config["snapshot_id"] == metrics["snapshot_id"] and config["model_id"] == metrics["model_id"]
    assert not list(tmp_path.glob(".rm.partial-*")) and not (folder / "_work").exists()
    with Store(db, read_only=True) as store:
        row = store.model(metrics["model_id"])
    assert row["snapshot_id"] == metrics["snapshot_id"] and row["kind"] == "rm"
    assert row["metrics"]["val_loss"] == metrics["val_loss"]


def test_train_rm_on_an_empty_store_fails_cleanly(tmp_path, capsys):
    empty = str(tmp_path / "empty.duckdb")
    Store(empty).close()
    status, _ = _train_cli(empty, tmp_path / "out")
    assert status == 1
    assert "no pairs" in capsys.readouterr().err
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".out.partial-*"))


def _saved_bytes_and_grads(model, ids):
    """Bytes autograd keeps for the backward pass of one forward, and the resulting gradients."""
    saved = {}

    def pack(t):
        saved[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = model(input_ids=ids, use_cache=False).logits.logsumexp(-1).mean()
    loss.backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    return sum(saved.values()), grads


def test_checkpointing_keeps_less_for_the_backward_and_gives_the_same_gradients(tmp_path):
    from transformers import AutoModelForCausalLM

    texts = [f"the answer to question {i} is clear and correct, not vague {i * 7}" for i in range(40)]
    path = build_tiny_causal_lm(tmp_path, texts, hidden=64, layers=4, vocab_size=300)
    model = AutoModelForCausalLM.from_pretrained(path).train()
    ids = torch.randint(0, model.config.vocab_size, (4, 48), generator=torch.Generator().manual_seed(0))
    plain_bytes, plain_grads = _saved_bytes_and_grads(model, ids)
    enable_checkpointing(model)
    lean_bytes, lean_grads = _saved_bytes_and_grads(model, ids)
    # four layers' activations (~19 tensors each) against their four inputs plus the head
    assert lean_bytes < plain_bytes / 3
    for a, b in zip(plain_grads, lean_grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
