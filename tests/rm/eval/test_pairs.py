"""Evaluation statistics against hand values; data files (LLMBar, hh-rlhf); `bradley eval`."""

import json
from contextlib import redirect_stdout
from io import StringIO

import numpy as np
import pytest

from annotation.store import Store
from rm.eval.pairs import (
    accuracy,
    expected_calibration_error,
    length_correlation,
    load_pairs_file,
    summarize,
)
from service.cli import main as cli
from tests.rm.train.test_train import synthetic_pairs, write_pairs


def test_accuracy_excludes_tied_votes_and_halves_equal_rewards():
    chosen, rejected = np.array([1.0, 0.0, 2.0, 5.0]), np.array([0.0, 1.0, 2.0, 0.0])
    assert accuracy(chosen, rejected, np.array([1.0, 1.0, 1.0, 0.5])) == pytest.approx(0.5)  # (1+0+½)/3
    assert accuracy(chosen[:1], rejected[:1], np.array([0.5])) is None


def test_calibration_error_is_zero_when_sigma_matches_the_vote_share():
    margin = np.log(np.array([3.0, 1.0 / 3.0]))  # σ = 0.75 and 0.25
    assert expected_calibration_error(margin, np.zeros(2), np.array([0.75, 0.25])) == pytest.approx(0.0)
    # confident and wrong: q = σ(4) = 0.982 against p̂ = 0 (flipped: 0.018 vs 1): ECE = 0.982
    assert expected_calibration_error(np.array([4.0]), np.zeros(1), np.zeros(1)) == pytest.approx(0.982, abs=1e-3)


def test_length_correlation_hand_values():
    assert length_correlation(np.array([1.0, 2.0, 3.0, 4.0]), np.array([1, 2, 3, 4])) == pytest.approx(1.0)
    assert length_correlation(np.array([1.0, 2.0]), np.array([5, 5])) is None


def test_summarize_reports_per_subset():
    out = summarize([1.0, 0.0, 3.0], [0.0, 1.0, 1.0], [1.0, 1.0, 1.0], ["a", "a", "b"], [5, 9, 7], [3, 2, 8])
    assert out["per_subset"] == {"a": {"n": 2, "accuracy": 0.5}, "b": {"n": 1, "accuracy": 1.0}}
    assert out["accuracy"] == pytest.approx(2 / 3) and out["n_pairs"] == 3
    assert out["chosen_longer_share"] == pytest.approx(2 / 3)


def test_llmbar_files_and_folder(shared_data):
    natural = json.loads((shared_data / "llmbar" / "LLMBar_Natural.json").read_text())
    rows = load_pairs_file(shared_data / "llmbar" / "LLMBar_Natural.json")
    assert len(rows) == 100
    for raw, row in zip(natural, rows, strict=True):
        better = raw["output_1"] if str(raw["label"]) == "1" else raw["output_2"]
        assert row["chosen"] == better and row["prompt"] == raw["input"]
    everything = load_pairs_file(shared_data / "llmbar")
    subsets = {r["subset"] for r in everything}
    assert len(everything) == 619 and "LLMBar_Adversarial_Neighbor" in subsets and len(subsets) == 6


def test_hh_rlhf_transcripts_split_at_the_last_assistant_turn(shared_data):
    rows = load_pairs_file(shared_data / "hh-rlhf" / "harmless-base-test.jsonl.gz")
    assert len(rows) == 2312
    first = rows[0]
    assert first["prompt"].startswith("Human: what are some pranks with a pen")
    assert first["prompt"].endswith("Assistant:")
    assert not first["chosen"].startswith("Assistant:") and first["chosen"] != first["rejected"]


def test_unknown_rows_are_rejected_with_a_message(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "q", "answer": "a"}\n')
    with pytest.raises(ValueError, match="expected prompt/chosen/rejected"):
        load_pairs_file(bad)


def _run(argv) -> tuple[int, dict]:
    buf = StringIO()
    with redirect_stdout(buf):
        status = cli.main(argv)
    out = buf.getvalue().strip().splitlines()
    return status, (json.loads(out[-1]) if out else {})


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    root = tmp_path_factory.mktemp("eval")
    db = str(root / "store.duckdb")
    with Store(db) as store:
        write_pairs(store, synthetic_pairs(80, seed=5))
    status, metrics = _run(["--db", db, "train", "rm", "--steps", "20", "--device", "cpu",
                            "--val-fraction", "0.25", "--out", str(root / "rm")])
    assert status == 0
    return db, metrics


def test_eval_on_the_validation_split_by_id_and_by_folder(trained):
    db, metrics = trained
    status, by_id = _run(["--db", db, "eval", metrics["model_id"], "--device", "cpu"])
    assert status == 0 and by_id["data"] == "validation"
    assert by_id["n_pairs"] == metrics["n_val"]
    assert by_id["accuracy"] == pytest.approx(metrics["val_accuracy"], abs=1e-6)
    status, by_path = _run(["--db", db, "eval", metrics["path"], "--device", "cpu"])
    assert by_path["accuracy"] == by_id["accuracy"]
    for key in ("ece", "length_spearman", "per_subset"):
        assert key in by_id


def test_eval_on_an_llmbar_file(trained, shared_data):
    db, metrics = trained
    data = shared_data / "llmbar" / "LLMBar_Adversarial_GPTOut.json"
    status, out = _run(["--db", db, "eval", metrics["path"], "--data", str(data), "--device", "cpu"])
    assert status == 0 and out["n_pairs"] == 47
    assert list(out["per_subset"]) == ["LLMBar_Adversarial_GPTOut"]
    assert 0.0 <= out["accuracy"] <= 1.0


def test_eval_errors_name_the_problem(trained, tmp_path, capsys):
    db, metrics = trained
    assert _run(["--db", db, "eval", "rm-missing"])[0] == 1
    assert "not found" in capsys.readouterr().err
    assert _run(["--db", db, "eval", metrics["path"], "--data", str(tmp_path / "nope.json")])[0] == 1
    assert "no such file" in capsys.readouterr().err
