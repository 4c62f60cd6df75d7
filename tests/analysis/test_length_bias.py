"""Length bias: hand-computed cases for every definition, planted truth recovered, real MT-Bench data."""

import gzip
import json
import math

import numpy as np
import pyarrow as pa
import pytest

from analysis import length_bias as lb
from annotation.simulate import SimulationConfig, simulate_arrays


def _table(winner, len_a, len_b, rater=None, model_a=None, model_b=None, **extra):
    n = len(winner)
    return pa.table({"winner": winner, "rater": rater or ["human:x"] * n, "len_a": len_a,
                     "len_b": len_b, "model_a": model_a or [None] * n,
                     "model_b": model_b or [None] * n, **extra})


def _simulated(config):
    columns, truth = simulate_arrays(config)
    table = _table(columns["winner"].tolist(), [len(t) for t in columns["response_a"]],
                   [len(t) for t in columns["response_b"]], columns["rater"].tolist(),
                   columns["model_a"].tolist(), columns["model_b"].tolist())
    return table, truth


# --- Wilson and p_longer_wins, by hand --------------------------------------------------------


def test_wilson_matches_hand_computation():
    # 8/10: p = .8, z² = 3.8415, denom 1.38415, center (.8 + .19207)/1.38415 = .71674,
    # half = 1.95996/1.38415 * sqrt(.016 + .009604) = .22658  ->  [.49016, .94332]
    low, high = lb.wilson_interval(8, 10)
    assert low == pytest.approx(0.49016, abs=1e-4) and high == pytest.approx(0.94332, abs=1e-4)
    # 0/10: center = half = .19207/1.38415 = .13877  ->  [0, .27753]
    low, high = lb.wilson_interval(0, 10)
    assert low == 0.0 and high == pytest.approx(0.27753, abs=1e-4)


def test_p_longer_wins_ignores_ties_and_equal_lengths():
    # rows: longer a wins, longer b wins, shorter a wins, tie (skip), equal lengths (skip)
    t = _table(["a", "b", "a", "tie", "b"], [9, 2, 1, 9, 5], [1, 8, 7, 1, 5])
    out = lb.analyze(t)
    assert out["n"] == 3 and out["p_longer_wins"] == pytest.approx(2 / 3, abs=1e-4)
    low, high = lb.wilson_interval(2, 3)
    assert out["p_longer_wins_ci95"] == [round(low, 4), round(high, 4)]


def test_p_longer_wins_in_tokens_with_a_tokenizer():
    # characters: a is longer in both rows; words: b is longer in both rows
    t = _table(["a", "b"], [11, 11], [9, 9], response_a_text=["aaaaa bbbbb", "ccccc ddddd"],
               response_b_text=["x y z w v", "p q r s t"])
    out = lb.analyze(t, tokenizer=str.split)
    assert out["p_longer_wins"] == 0.5
    assert out["tokens"]["p_longer_wins"] == 0.5 and out["tokens"]["n"] == 2
    t2 = _table(["b", "b"], [11, 11], [9, 9], response_a_text=["aaaaa bbbbb"] * 2,
                response_b_text=["x y z w v"] * 2)
    assert lb.analyze(t2, tokenizer=str.split)["tokens"]["p_longer_wins"] == 1.0
    with pytest.raises(ValueError, match="response_a_text"):
        lb.analyze(_table(["a"], [1], [2]), tokenizer=str.split)


# --- the regression, by hand ---------------------------------------------------------------------


def test_logistic_fit_on_a_saturated_design():
    # x = 0: 1 success in 4 -> intercept = ln(1/3); x = 1: 3 in 4 -> intercept + β = ln 3, β = 2 ln 3.
    # Saturated model: var(β) = 1/(n0 p0 q0) + 1/(n1 p1 q1) = 4/3 + 4/3 = 8/3.
    x = np.column_stack([np.ones(8), [0, 0, 0, 0, 1, 1, 1, 1]])
    y = np.array([1, 0, 0, 0, 1, 1, 1, 0], dtype=float)
    beta, cov = lb.fit_logistic(x, y)
    assert beta[0] == pytest.approx(math.log(1 / 3), abs=1e-6)
    assert beta[1] == pytest.approx(2 * math.log(3), abs=1e-6)
    assert cov[1, 1] == pytest.approx(8 / 3, rel=1e-5)


def test_length_slope_with_sources_equals_the_row_by_row_fit():
    # The fast path (binomial cells, per-group sums) must give the plain IRLS answer on the
    # design [tanh(Δ/sd), +1 for a's source, −1 for b's source] with source 0 as the reference.
    rng = np.random.default_rng(3)
    n, sd = 400, 20.0
    sa, sb = rng.integers(0, 3, n), rng.integers(0, 3, n)
    la, lb_ = rng.integers(10, 60, n).astype(float), rng.integers(10, 60, n).astype(float)
    theta = np.array([0.0, 0.7, -0.4])
    p = 1 / (1 + np.exp(-(0.8 * np.tanh((la - lb_) / sd) + theta[sa] - theta[sb])))
    winner = np.where(rng.random(n) < p, "a", "b")
    got = lb.length_slope(winner, la, lb_, sd, sa, sb, 3)
    x = np.column_stack([np.tanh((la - lb_) / sd)] +
                        [(sa == s).astype(float) - (sb == s) for s in (1, 2)])
    beta, cov = lb.fit_logistic(x, (winner == "a").astype(float))
    assert got["slope"] == pytest.approx(beta[0], abs=1e-4)
    assert got["theta"][1:] == pytest.approx(beta[1:], abs=1e-6)
    half = got["slope_ci95"][1] - got["slope"]
    assert half == pytest.approx(1.959964 * np.sqrt(cov[0, 0]), abs=1e-3)


def test_source_win_rates_by_hand():
    # x beats y twice, y beats x once, one tie: x raw = (2 + .5)/4; θ_x − θ_y = 0.5 -> lc = σ(0.5)
    w = np.array(["a", "b", "a", "tie"])
    sa, sb = np.array([0, 1, 1, 0]), np.array([1, 0, 0, 1])
    out = lb.source_win_rates(w, sa, sb, np.array([0.5, 0.0]), ["x", "y"])
    assert out["x"]["win_rate"] == 0.625 and out["y"]["win_rate"] == 0.375
    assert out["x"]["lc_win_rate"] == pytest.approx(1 / (1 + math.exp(-0.5)), abs=1e-4)
    # three sources: lc of the middle one = mean(σ(1), σ(−1)) = 1/2
    three = lb.source_win_rates(np.array(["a"]), np.array([0]), np.array([2]),
                                np.array([-1.0, 0.0, 1.0]), ["lo", "mid", "hi"])
    assert three["mid"]["lc_win_rate"] == 0.5 and three["mid"]["n"] == 0


def test_curve_bins_by_length_difference():
    # |Δ| = 9 four times (and a tie, skipped): one bin; the longer won rows 1, 2 and 3 -> 3/4
    c = lb.win_rate_curve(np.array(["a", "a", "b", "b", "tie"]), np.array([10, 10, 1, 10, 5]),
                          np.array([1, 1, 10, 1, 1]), bins=2)
    assert c == {"abs_delta": [9.0], "p_longer_wins": [0.75], "n": [4]}


def test_empty_or_malformed_tables_are_clear_errors():
    with pytest.raises(ValueError, match="no judgments"):
        lb.analyze(_table([], [], []))
    with pytest.raises(ValueError, match="verdict_arrays"):
        lb.analyze(pa.table({"winner": ["a"]}))


# --- planted truth ------------------------------------------------------------------------------


def test_planted_slope_is_recovered_per_honest_rater_group():
    table, truth = _simulated(SimulationConfig(prompts=1500, cycle_rate=0.0, seed=11))
    honest = [r for r, v in truth["raters"].items() if v["kind"] == "honest"]
    mask = np.isin(np.array(table.column("rater").to_pylist()), honest)
    out = lb.analyze(table.filter(pa.array(mask)))
    low, high = out["slope_ci95"]
    assert low < truth["length_bias"] < high and high - low < 0.4
    everyone = lb.analyze(table)
    adversarial = [r for r, v in truth["raters"].items() if v["kind"] == "adversarial"]
    # an adversarial rater reports the opposite verdict 90% of the time: its slope turns negative;
    # a noisy one (35% flipped) is pulled towards 0, below the honest raters' interval
    assert all(everyone["by_rater"][r]["slope"] < 0 for r in adversarial)
    noisy = [r for r, v in truth["raters"].items() if v["kind"] == "noisy"]
    assert all(everyone["by_rater"][r]["slope"] < low for r in noisy)
    assert set(everyone["by_kind"]) == {"human", "ai"}
    # length-controlled win rates order the sources as their planted qualities do
    lc = [everyone["sources"][s]["lc_win_rate"] for s in sorted(truth["source_quality"],
                                                              key=truth["source_quality"].get)]
    assert lc == sorted(lc)


@pytest.mark.parametrize("bias, direction", [(2.0, 1), (-2.0, -1), (0.0, 0)])
def test_p_longer_wins_direction_follows_the_planted_sign(bias, direction):
    config = SimulationConfig(prompts=400, cycle_rate=0.0, length_bias=bias, noisy_share=0.0,
                              adversarial_share=0.0, quality_scale=1.0, seed=12)
    out = lb.analyze(_simulated(config)[0])
    low, high = out["p_longer_wins_ci95"]
    assert {1: low > 0.5, -1: high < 0.5, 0: low < 0.5 < high}[direction]
    assert {1: out["slope_ci95"][0] > 0, -1: out["slope_ci95"][1] < 0,
            0: out["slope_ci95"][0] < 0 < out["slope_ci95"][1]}[direction]


# --- real data ---------------------------------------------------------------------------------


def test_mtbench_turn1_humans_and_gpt4_prefer_longer_answers(shared_data):
    path = shared_data / "mtbench_human" / "mtbench_turn1_judgments.jsonl.gz"
    rows = [json.loads(line) for line in gzip.open(path, "rt", encoding="utf-8")]
    table = _table([r["winner"] for r in rows], [len(r["response_a"]) for r in rows],
                   [len(r["response_b"]) for r in rows], [r["rater"] for r in rows],
                   [r["model_a"] for r in rows], [r["model_b"] for r in rows])
    out = lb.analyze(table)
    for kind, prefix in (("human", "human:"), ("ai", "ai:gpt-4")):
        # an independent count, row by row
        used = [r for r in rows if r["rater"].startswith(prefix) and r["winner"] != "tie"
                and len(r["response_a"]) != len(r["response_b"])]
        longer = sum((r["winner"] == "a") == (len(r["response_a"]) > len(r["response_b"])) for r in used)
        got = out["by_kind"][kind]
        assert got["n"] == len(used) and got["p_longer_wins"] == pytest.approx(longer / len(used), abs=1e-4)
        assert got["p_longer_wins_ci95"][0] > 0.5  # both prefer the longer answer (Zheng et al. 2023)
    assert out["by_rater"]["ai:gpt-4"] == out["by_kind"]["ai"]
    # figures for the record: humans 0.669 [0.632, 0.704] n=655; gpt-4 0.743 [0.701, 0.781] n=455
    assert out["by_kind"]["human"]["p_longer_wins"] == pytest.approx(0.6687, abs=1e-3)
    assert out["by_kind"]["ai"]["p_longer_wins"] == pytest.approx(0.7429, abs=1e-3)


def test_counted_cells_give_the_analysis_of_the_rows():
    # the report counts verdicts by (rater, winner, length difference, sources) in DuckDB first
    table, _ = _simulated(SimulationConfig(prompts=300, raters=6, seed=12))
    rows = lb._columns(table)
    delta = rows["len_a"] - rows["len_b"]
    keys = np.column_stack([rows["rater"], rows["winner"], delta, rows["source_a"], rows["source_b"]])
    cells, count = np.unique(keys, axis=0, return_counts=True)
    assert len(cells) < table.num_rows
    counted = {**rows, "winner": cells[:, 1].astype(np.int8), "len_a": cells[:, 2],
               "len_b": np.zeros(len(cells)), "count": count, "rater": cells[:, 0].astype(np.int64),
               "source_a": cells[:, 3].astype(np.int64), "source_b": cells[:, 4].astype(np.int64)}
    assert lb.analyze_cells(counted) == lb.analyze(table)
