"""The simulator: deterministic, files written whole, and the planted truth is really in the data."""

import json

import numpy as np
import pytest

from annotation.simulate import (
    BAD_WORDS,
    GOOD_WORDS,
    SimulationConfig,
    load_into,
    simulate,
    simulate_arrays,
    simulate_rows,
)
from service.cli import main as cli


def test_same_seed_same_rows_other_seed_other_rows():
    config = SimulationConfig(prompts=20, seed=3)
    assert simulate_rows(config)[0] == simulate_rows(SimulationConfig(prompts=20, seed=3))[0]
    assert simulate_rows(config)[0] != simulate_rows(SimulationConfig(prompts=20, seed=4))[0]


def test_counts_follow_the_config():
    # 10 prompts x C(4,2) = 6 pairs x 3 raters = 180; with 5 pairs and 2 raters: 10 x 5 x 2 = 100
    assert simulate_arrays(SimulationConfig(prompts=10))[1]["n_judgments"] == 180
    rows, truth = simulate_rows(SimulationConfig(prompts=10, pairs_per_prompt=5, raters_per_pair=2))
    assert len(rows) == truth["n_judgments"] == 100
    assert {r["winner"] for r in rows} <= {"a", "b", "tie"}
    assert all(r["response_a"] != r["response_b"] for r in rows)


def test_simulate_writes_jsonl_and_truth(tmp_path):
    out = tmp_path / "sim.jsonl"
    summary = simulate(out, SimulationConfig(prompts=30, cycle_rate=0.2, seed=1))
    lines = out.read_text().splitlines()
    truth = json.loads((tmp_path / "sim.jsonl.truth.json").read_text())
    assert len(lines) == summary["n_judgments"] == truth["n_judgments"]
    assert json.loads(lines[0]).keys() >= {"prompt", "response_a", "response_b", "winner", "rater"}
    assert truth["length_bias"] == 0.5 and len(truth["raters"]) == 8
    assert summary["n_cyclic_prompts"] == len(truth["cyclic_prompts"]) == len(truth["cyclic_triads"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sim.jsonl", "sim.jsonl.truth.json"]


@pytest.mark.parametrize("change, field", [
    ({"raters_per_pair": 9}, "raters_per_pair"),
    ({"responses": 2}, "cycle_rate"),
    ({"pairs_per_prompt": 7}, "pairs_per_prompt"),
    ({"sources": 3}, "sources"),
    ({"accuracies": (1.0,)}, "accuracies"),
])
def test_bad_config_names_the_field(change, field):
    with pytest.raises(ValueError, match=field):
        simulate_arrays(SimulationConfig(prompts=5, **change))


def test_rater_kinds_show_in_their_verdicts():
    truth = simulate_arrays(SimulationConfig(prompts=400, cycle_rate=0.0, seed=2))[1]
    by_kind = {}
    for rater in truth["raters"].values():
        by_kind.setdefault(rater["kind"], []).append(rater["agrees_with_better"])
    # Honest raters follow σ(2Δθ) (Δθ ≥ 0.6 → at least 77% for the better one); adversarial invert it.
    assert min(by_kind["honest"]) > 0.8
    assert 0.5 < max(by_kind["noisy"]) < min(by_kind["honest"])
    assert max(by_kind["adversarial"]) < 0.3


def test_quality_is_visible_in_the_text_and_length_is_not():
    columns, truth = simulate_arrays(SimulationConfig(prompts=300, cycle_rate=0.0, seed=5))
    theta = np.array([truth["source_quality"][m] for m in columns["model_a"]])
    words = [t.lower().rstrip(".").split() for t in columns["response_a"]]
    good = np.array([sum(w in GOOD_WORDS for w in ws) for ws in words])
    bad = np.array([sum(w in BAD_WORDS for w in ws) for ws in words])
    share_good = good / np.maximum(good + bad, 1)
    lengths = np.array([len(t) for t in columns["response_a"]])
    assert np.corrcoef(theta, share_good)[0, 1] > 0.6
    assert abs(np.corrcoef(theta, lengths)[0, 1]) < 0.1


def test_cyclic_triads_are_judged_by_the_planted_groups():
    from annotation.ids import prompt_id, response_id

    columns, truth = simulate_arrays(SimulationConfig(prompts=200, cycle_rate=0.5, seed=6))
    assert 70 < len(truth["cyclic_prompts"]) < 130
    group = {name: r["group"] for name, r in truth["raters"].items()}
    pid, t0, t1, t2 = truth["cyclic_triads"][0]
    seen = {}
    for prompt, a, b, rater in zip(columns["prompt"], columns["response_a"], columns["response_b"],
                                   columns["rater"], strict=True):
        p = prompt_id(prompt)
        if p == pid:
            pair = frozenset((response_id(p, a), response_id(p, b)))
            seen.setdefault(pair, set()).add(group[rater])
    # t0-t1 and t1-t2 by group 0 only, t0-t2 by group 1 only: the planted majority goes round
    assert seen[frozenset((t0, t1))] == {0} and seen[frozenset((t1, t2))] == {0}
    assert seen[frozenset((t0, t2))] == {1}


def test_load_into_store_matches_the_truth(store):
    truth = load_into(store, SimulationConfig(prompts=25, seed=8))
    counts = store.counts()
    assert counts["judgments"] == truth["n_judgments"] == 25 * 6 * 3
    assert counts["prompts"] == 25 and counts["responses"] == 100
    sources = set(store.verdict_arrays().column("model_a").to_pylist())
    assert sources <= set(truth["source_quality"])
    load_into(store, SimulationConfig(prompts=25, seed=8))  # the same config again: a no-op
    assert store.counts() == counts


def test_ingest_reads_the_simulated_file_like_load_into(tmp_path, store):
    from annotation.ingest.batch import ingest_file

    out = tmp_path / "sim.jsonl"
    config = SimulationConfig(prompts=15, seed=9)
    simulate(out, config)
    ingest_file(store, out)
    with type(store)(tmp_path / "direct.duckdb") as direct:
        load_into(direct, config)
        expected = direct.counts()
    got = store.counts()
    for table in ("prompts", "responses", "judgments", "pairs"):
        assert got[table] == expected[table], table
    assert set(store.verdict_arrays().column("model_b").to_pylist()) <= {f"sim-model-{i}" for i in range(6)}


def test_cli_simulate(tmp_path, capsys):
    out = tmp_path / "cli.jsonl"
    assert cli.main(["simulate", str(out), "--prompts", "12", "--raters", "6", "--seed", "2"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["n_judgments"] == 12 * 6 * 3 and out.exists()
    assert cli.main(["simulate", str(tmp_path / "bad.jsonl"), "--raters", "2"]) == 1
    assert "raters_per_pair" in capsys.readouterr().err
    assert not (tmp_path / "bad.jsonl").exists()
