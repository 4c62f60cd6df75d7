"""Cycles and loss floors against the issue's seed numbers, hand computations and real profiles."""

from __future__ import annotations

import math
from itertools import combinations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from scipy.optimize import minimize
from scipy.special import expit

from analysis import cycles
from tests.analysis.verdict_sources import hh_rlhf, mtbench, preflib_soc, verdict_table


def _votes(prompt: str, x: str, y: str, x_wins: int, y_wins: int, ties: int = 0) -> list[tuple]:
    """Verdicts on one pair by distinct raters, shown in both orders so orientation is exercised."""
    rows = [(prompt, x, y, "a", "human:x") for _ in range(x_wins)]
    rows += [(prompt, y, x, "a", "human:y") for _ in range(y_wins)]
    rows += [(prompt, y, x, "tie", "human:t") for _ in range(ties)]
    return [(p, a, b, w, f"{r}{k}") for k, (p, a, b, w, r) in enumerate(rows)]


def test_seed_seventy_percent_cycle():
    # DESIGN.md's worked example: A beats B, B beats C, C beats A, 70% each -> entropy floor H(0.7) = 0.611,
    # BT floor ln 2 = 0.693 (by symmetry all scores equal), gap 0.082 nats per judgment.
    rows = _votes("p", "A", "B", 7, 3) + _votes("p", "B", "C", 7, 3) + _votes("p", "C", "A", 7, 3)
    result = cycles.analyze(verdict_table(rows))
    assert result["entropy_floor"] == pytest.approx(0.611, abs=5e-4)
    assert result["bt_floor"] == pytest.approx(math.log(2), abs=1e-6)
    assert result["gap"] == pytest.approx(0.082, abs=5e-4)
    assert (result["n_triads"], result["n_cyclic_triads"], result["n_prompts_with_cycles"]) == (1, 1, 1)
    (worst,) = result["worst_cycles"]
    assert worst["prompt_id"] == "p" and worst["responses"] == ["A", "B", "C"]
    assert worst["shares"] == pytest.approx([0.7, 0.7, 0.7]) and worst["n_votes"] == [10, 10, 10]


def test_three_annotator_example_gives_a_two_to_one_majority_cycle():
    rankings = {"human:1": "ABC", "human:2": "BCA", "human:3": "CAB"}
    rows = [("p", r[i], r[j], "a", rater) for rater, r in rankings.items()
            for i, j in combinations(range(3), 2)]
    result = cycles.analyze(verdict_table(rows))
    assert result["n_triads"] == 1 and result["n_cyclic_triads"] == 1
    (worst,) = result["worst_cycles"]
    assert worst["responses"] == ["A", "B", "C"]
    assert worst["shares"] == pytest.approx([2 / 3] * 3) and worst["n_votes"] == [3, 3, 3]
    assert result["n_prompts_complete"] == 1 and result["n_condorcet_winners"] == 0


def test_consistent_preferences_have_no_gap():
    # Scores 0, ln 2, 2 ln 2: P(B>A) = P(C>B) = 2/3 and P(C>A) = 4/5 exactly, so Bradley-Terry
    # reaches the entropy floor: gap 0 and C is a Condorcet winner.
    rows = _votes("p", "B", "A", 10, 5) + _votes("p", "C", "B", 10, 5) + _votes("p", "C", "A", 12, 3)
    result = cycles.analyze(verdict_table(rows))
    expected = (30 * cycles.binary_entropy(np.array(2 / 3)) + 15 * cycles.binary_entropy(np.array(0.8))) / 45
    assert result["entropy_floor"] == pytest.approx(float(expected), abs=1e-9)
    assert result["gap"] == pytest.approx(0.0, abs=1e-6)
    assert result["n_cyclic_triads"] == 0 and result["n_condorcet_winners"] == 1


def test_ties_count_half_and_exact_splits_are_not_strict():
    # (x, y): 1 win for x, 1 tie -> p = 0.75, loss 2 H(0.75). (x, z): 1:1 -> not strict, 2 ln 2.
    # (y, z): 2:0 -> 0. No triad: one pair of the three is not strict.
    rows = _votes("p", "x", "y", 1, 0, ties=1) + _votes("p", "x", "z", 1, 1) + _votes("p", "y", "z", 2, 0)
    result = cycles.analyze(verdict_table(rows))
    h = float(cycles.binary_entropy(np.array(0.75)))
    assert result["entropy_floor"] == pytest.approx((2 * h + 2 * math.log(2)) / 6)
    assert result["n_strict_pairs"] == 2 and result["n_triads"] == 0


def test_cyclic_triads_of_a_regular_tournament():
    # Five responses, i beats i+1 and i+2 (mod 5): all 10 triples are triads; Kendall and
    # Babington Smith (1940): cyclic triads = C(5,3) - sum_i C(s_i, 2) = 10 - 5*1 = 5.
    names = "ABCDE"
    rows = []
    for i in range(5):
        for step in (1, 2):
            rows += _votes("p", names[i], names[(i + step) % 5], 2, 1)
    result = cycles.analyze(verdict_table(rows))
    assert result["n_triads"] == 10 and result["n_cyclic_triads"] == 5
    assert len(result["worst_cycles"]) == 5


def _bt_floor_by_scipy(rows: list[tuple]) -> float:
    """Independent fit: per prompt, minimise the mean log-loss with a general-purpose optimiser."""
    total, count = 0.0, 0
    for prompt in sorted({r[0] for r in rows}):
        mine = [r for r in rows if r[0] == prompt]
        names = sorted({r[1] for r in mine} | {r[2] for r in mine})
        a = np.array([names.index(r[1]) for r in mine])
        b = np.array([names.index(r[2]) for r in mine])
        y = np.array([{"a": 1.0, "b": 0.0, "tie": 0.5}[r[3]] for r in mine])

        def loss(free, a=a, b=b, y=y):
            d = np.concatenate([[0.0], free])[a] - np.concatenate([[0.0], free])[b]
            return -np.sum(y * np.log(expit(d)) + (1 - y) * np.log(expit(-d)))

        fit = minimize(loss, np.zeros(len(names) - 1), method="BFGS", options={"gtol": 1e-10})
        total, count = total + fit.fun, count + len(mine)
    return total / count


def test_bt_floor_matches_a_general_optimiser_on_many_prompts():
    rng = np.random.default_rng(7)
    rows = []
    for p in range(12):
        k = int(rng.integers(3, 6))
        score = rng.normal(0, 1, k)
        for _ in range(60):
            i, j = rng.choice(k, 2, replace=False)
            win = rng.random() < expit(score[i] - score[j])
            tie = rng.random() < 0.15
            rows.append((f"p{p}", f"r{i}", f"r{j}", "tie" if tie else ("a" if win else "b"), "human:1"))
    result = cycles.analyze(verdict_table(rows))
    assert result["bt_floor"] == pytest.approx(_bt_floor_by_scipy(rows), abs=1e-6)


def _simulated(cyclic: bool, prompts: int = 150, votes: int = 30, seed: int = 0) -> list[tuple]:
    """Four responses per prompt, every pair judged `votes` times. Transitive: Bradley-Terry
    scores. Cyclic: r0>r1>r2>r0 at 80% with r3 below all three at 50/50 against each."""
    rng = np.random.default_rng(seed)
    rows = []
    for p in range(prompts):
        score = rng.normal(0, 1, 4)
        for i, j in combinations(range(4), 2):
            if cyclic:
                prob = {(0, 1): 0.8, (1, 2): 0.8, (0, 2): 0.2}.get((i, j), 0.5)
            else:
                prob = expit(score[i] - score[j])
            wins = rng.binomial(votes, prob)
            rows += _votes(f"p{p}", f"r{i}", f"r{j}", int(wins), votes - int(wins))
    return rows


def test_correction_removes_the_gap_of_transitive_data():
    # Under Bradley-Terry, 2N*gap ~ chi2(df): the plug-in gap is about df/2N > 0, the corrected one ~0.
    result = cycles.analyze(verdict_table(_simulated(cyclic=False)))
    n, df = result["n_judgments"], result["transitivity_df"]
    assert df == 150 * (6 - 3)
    sd = math.sqrt(2 * df) / (2 * n)
    assert result["gap"] > 10 * sd
    assert abs(result["gap_corrected"]) < 4 * sd
    assert result["transitivity_p_value"] > 1e-3
    assert result["n_cyclic_triads"] < 0.05 * result["n_triads"]
    assert abs(result["gap_bootstrap_corrected"]) < 4 * sd


def test_planted_cycles_are_found_and_significant():
    # H(0.8) = 0.500 on the cyclic pairs; BT's best scalar fit of an 80% cycle is ln 2 there.
    result = cycles.analyze(verdict_table(_simulated(cyclic=True)))
    assert result["n_cyclic_triads"] >= 140 and result["n_prompts_with_cycles"] >= 140
    assert result["transitivity_p_value"] < 1e-12
    assert result["gap_corrected"] > 0.05


@pytest.mark.parametrize("cyclic", [False, True])
def test_bootstrap_correction_on_sparse_votes(cyclic):
    # Two votes per pair: the asymptotic correction is withheld; the transitive-null bootstrap
    # (scores shrunk by a N(0,1) prior) explains the whole plug-in gap of transitive data and
    # leaves most of the true gap of the planted cycles, (3 H(0.8) + 3 ln 2)/6 vs ln 2: 0.096.
    result = cycles.analyze(verdict_table(_simulated(cyclic=cyclic, votes=2)))
    assert result["gap_corrected"] is None and result["transitivity_p_value"] is None
    assert result["n_boot"] == 100 and result["gap"] > 0.1
    if cyclic:
        assert 0.05 < result["gap_bootstrap_corrected"] < 0.15
        assert result["gap_bootstrap_p_value"] < 0.05
    else:
        assert -0.06 < result["gap_bootstrap_corrected"] < 0.01
        assert result["gap_bootstrap_p_value"] > 0.5


def test_preflib_majority_ties_are_not_cycles(shared_data):
    for name in ("00004-00000163.soc", "00004-00000182.soc"):
        path = shared_data / "preflib_netflix" / name
        table = preflib_soc(path)
        # Independent count of the pairwise majorities straight from the file.
        margin = {}
        for line in path.read_text().splitlines():
            if line and not line.startswith("#"):
                count, order = line.split(":")
                ranking = order.strip().split(",")
                for i, j in combinations(range(len(ranking)), 2):
                    key = tuple(sorted((ranking[i], ranking[j])))
                    margin[key] = margin.get(key, 0) + int(count) * (1 if ranking[i] == key[0] else -1)
        tied = [k for k, m in margin.items() if m == 0]
        assert len(tied) == 1
        result = cycles.analyze(table)
        assert result["n_strict_pairs"] == 5
        assert result["n_prompts_complete"] == 1 and result["n_condorcet_winners"] == 0
        assert result["n_cyclic_triads"] == 0 and result["worst_cycles"] == []
        assert result["entropy_floor"] <= result["bt_floor"] <= math.log(2)


def test_hh_rlhf_single_votes(shared_data):
    result = cycles.analyze(hh_rlhf(shared_data / "hh-rlhf" / "harmless-base-test.jsonl.gz"))
    assert result["n_judgments"] == 2312 and result["n_triads"] == 0
    assert result["entropy_floor"] == 0.0 and result["bt_floor"] < 1e-4
    assert result["transitivity_p_value"] is None and result["entropy_floor_corrected"] is None
    assert result["gap_bootstrap_corrected"] is None  # no cycle degrees of freedom: nothing to test


def test_mtbench_human_floors(shared_data):
    table = mtbench(shared_data / "mtbench_human" / "mtbench_turn1_judgments.jsonl.gz")
    humans = cycles.analyze(table.filter(pc.starts_with(table["rater"], "human:")))
    assert humans["n_judgments"] == 882 and humans["n_prompts"] == 80
    assert 0 < humans["entropy_floor"] < humans["bt_floor"] < math.log(2)
    for cycle in humans["worst_cycles"]:
        assert len(set(cycle["responses"])) == 3 and all(s > 0.5 for s in cycle["shares"])


def test_orientation_and_row_order_do_not_matter():
    rows = _simulated(cyclic=True, prompts=20, votes=5, seed=3)
    flipped = [(p, b, a, {"a": "b", "b": "a", "tie": "tie"}[w], r) for p, a, b, w, r in rows][::-1]
    first, second = cycles.analyze(verdict_table(rows)), cycles.analyze(verdict_table(flipped))
    for key in ("n_triads", "n_cyclic_triads", "entropy_floor", "bt_floor", "gap"):
        assert first[key] == pytest.approx(second[key], abs=1e-9)


def test_empty_table():
    result = cycles.analyze(verdict_table([]))
    assert result["n_judgments"] == 0 and result["n_triads"] == 0 and result["worst_cycles"] == []


def test_reads_the_store_verdict_arrays(store):
    # The three-annotator cycle written through the store and read back with verdict_arrays().
    texts = {"A": "answer A", "B": "answer B", "C": "answer C"}
    rankings = {"human:1": "ABC", "human:2": "BCA", "human:3": "CAB"}
    judgments = [(f"j{rater}{i}{j}", "p", r[i], r[j], "a", rater, "judgments")
                 for rater, r in rankings.items() for i, j in combinations(range(3), 2)]
    names = ("id", "prompt_id", "response_a", "response_b", "winner", "rater", "source")
    store.write_batch("test", "sha-cycles", len(judgments), {
        "prompts": pa.table({"id": ["p"], "text": ["Which answer?"]}),
        "responses": pa.table({"id": list(texts), "prompt_id": ["p"] * 3, "text": list(texts.values())}),
        "judgments": pa.table(dict(zip(names, map(list, zip(*judgments, strict=True)), strict=True)))})
    result = cycles.analyze(store.verdict_arrays())
    assert result["n_judgments"] == 9 and result["n_cyclic_triads"] == 1
    assert result["worst_cycles"][0]["prompt_id"] == "p"


def _triads_by_brute_force(rows: list[tuple]) -> tuple[int, int]:
    """Plain-Python majority and triple enumeration, prompt by prompt (the reference)."""
    margin = {}
    for prompt, a, b, winner, _ in rows:
        x, y = sorted((a, b))
        vote = {"a": 1, "b": -1, "tie": 0}[winner] * (1 if a == x else -1)
        margin[(prompt, x, y)] = margin.get((prompt, x, y), 0) + vote
    n_triads = n_cyclic = 0
    for prompt in {r[0] for r in rows}:
        names = sorted({n for (p, x, y) in margin if p == prompt for n in (x, y)})
        for x, y, z in combinations(names, 3):
            m = [margin.get((prompt, u, v)) for u, v in ((x, y), (y, z), (x, z))]
            if None in m or 0 in m:
                continue
            n_triads += 1
            n_cyclic += (m[0] > 0) == (m[1] > 0) != (m[2] > 0)
    return n_triads, n_cyclic


def test_triads_match_brute_force_enumeration():
    rng = np.random.default_rng(11)
    rows = []
    for p in range(60):
        k = int(rng.integers(3, 7))
        for _ in range(int(rng.integers(5, 40))):
            i, j = rng.choice(k, 2, replace=False)
            rows.append((f"p{p}", f"r{i}", f"r{j}", str(rng.choice(["a", "b", "tie"], p=[.45, .45, .1])),
                         f"human:{rng.integers(9)}"))
    result = cycles.analyze(verdict_table(rows), n_boot=0)
    assert (result["n_triads"], result["n_cyclic_triads"]) == _triads_by_brute_force(rows)
    assert result["n_cyclic_triads"] > 10 and result["n_boot"] == 0
