"""A wrong model is one line and exit 1 before any work: no snapshot recorded, no model folder, no
tokenizer's multi-line error, no retries against a hub this machine cannot reach."""

from __future__ import annotations

import json
import time

import pytest

from service.cli.main import main

PAIRS = [{"prompt": f"wrong-model question {i}?", "chosen": f"good answer {i}",
          "rejected": f"bad {i}"} for i in range(8)]


@pytest.fixture
def db(tmp_path) -> str:
    data = tmp_path / "pairs.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in PAIRS))
    path = str(tmp_path / "store.duckdb")
    assert main(["--db", path, "ingest", str(data)]) == 0
    return path


@pytest.fixture(scope="module")
def encoder_rm(tmp_path_factory) -> str:
    """A BERT reward model folder as `bradley train rm` leaves one (train_config.json beside it)."""
    from rm.model.reward_model import build_tiny_reward_model

    folder = build_tiny_reward_model(tmp_path_factory.mktemp("bert") / "rm",
                                     ["a few words of text"] * 10, vocab_size=200, arch="bert")
    (folder / "train_config.json").write_text(json.dumps({"model_id": "rm-bert", "kind": "rm"}))
    return str(folder)


def _one_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err


def _nothing_done(db: str, tmp_path) -> None:
    from annotation.store import Store

    with Store(db, read_only=True) as store:
        assert store.snapshots() == [] and store.models() == []
    assert not list(tmp_path.glob("models*")) and not list(tmp_path.glob(".out*"))


def test_policy_training_refuses_an_encoder_reward_model(db, encoder_rm, tmp_path, capsys):
    argv = ["--db", db, "train", "po", "--loss", "dpo", "--base-model", encoder_rm,
            "--out", str(tmp_path / "out"), "--steps", "1"]
    assert main(argv) == 1
    err = _one_line(capsys)
    assert "BertForSequenceClassification (a reward model), not a causal LM" in err
    _nothing_done(db, tmp_path)


def test_a_folder_that_is_no_model_is_one_line(db, tmp_path, capsys):
    assert main(["--db", db, "train", "rm", "--base-model", "../../../etc", "--steps", "1",
                 "--out", str(tmp_path / "out")]) == 1
    assert "--base-model ../../../etc is not a model folder (no config.json)" in _one_line(capsys)
    _nothing_done(db, tmp_path)
    assert main(["--db", db, "eval", "/etc"]) == 1
    assert "/etc is not a model folder (no config.json)" in _one_line(capsys)


def test_a_hub_id_offline_is_refused_at_once(db, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    started = time.monotonic()
    assert main(["--db", db, "label", "--judge", "local:HuggingFaceTB/SmolLM2-135M-Instruct"]) == 1
    assert time.monotonic() - started < 5
    err = _one_line(capsys)
    assert "HuggingFaceTB/SmolLM2-135M-Instruct is not a local folder" in err and "offline" in err
    assert main(["--db", db, "train", "po", "--loss", "dpo", "--base-model", "Qwen/Qwen2-0.5B"]) == 1
    assert "hub is offline" in _one_line(capsys)
    _nothing_done(db, tmp_path)


def test_an_unreachable_hub_is_refused_without_retries(db, capsys, monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing listens on the discard port
    started = time.monotonic()
    assert main(["--db", db, "label", "--judge", "local:someone/some-judge"]) == 1
    assert time.monotonic() - started < 5
    assert "the hub cannot be reached (http://127.0.0.1:9" in _one_line(capsys)
