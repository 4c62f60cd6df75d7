"""Agreement statistics against hand computations and published examples."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from analysis import agreement, verdicts
from tests.analysis.verdict_sources import hh_rlhf, mtbench, verdict_table


def test_orientation_and_pairwise_agreement_by_hand():
    # item (x, y): r1 says x ('a' on x,y), r2 says x ('b' on y,x), r3 tie -> pairs 1/3 agree;
    # item (x, z): r1 says x, r2 says z -> 0/1. With ties 1/4; without ties 1/2.
    table = verdict_table([
        ("p", "x", "y", "a", "human:1"), ("p", "y", "x", "b", "human:2"),
        ("p", "x", "y", "tie", "human:3"), ("p", "x", "z", "a", "human:1"),
        ("p", "z", "x", "a", "human:2")])
    result = agreement.analyze(table)
    assert result["n_items"] == 2
    assert result["pairwise_with_ties"] == pytest.approx(1 / 4)
    assert result["n_pairs"] == 4
    assert result["pairwise_without_ties"] == pytest.approx(1 / 2)
    assert result["n_pairs_without_ties"] == 2


def test_a_rater_judging_twice_is_one_voice_and_inconsistency_is_a_tie():
    table = verdict_table([
        ("p", "x", "y", "a", "ai:judge"), ("p", "y", "x", "a", "ai:judge"),  # x then y: a tie
        ("p", "x", "y", "a", "human:1")])
    result = agreement.analyze(table)
    assert result["n_pairs"] == 1
    assert result["pairwise_with_ties"] == 0.0
    assert result["n_pairs_without_ties"] == 0 and result["pairwise_without_ties"] is None
    assert result["human_ai"]["ai:judge"] == {"with_ties": 0.0, "without_ties": None, "n": 1,
                                              "n_without_ties": 0}


def test_cohen_kappa_per_rater_pair_by_hand():
    # 20 items: both say x 8 times, both y 6 times, r1 x / r2 y 4 times, r1 y / r2 x 2 times.
    # p_o = 0.7, p_e = 0.6*0.5 + 0.4*0.5 = 0.5, kappa = 0.4.
    plan = [("a", "a")] * 8 + [("b", "b")] * 6 + [("a", "b")] * 4 + [("b", "a")] * 2
    rows = []
    for k, (w1, w2) in enumerate(plan):
        rows += [(f"p{k}", "x", "y", w1, "human:1"), (f"p{k}", "x", "y", w2, "human:2")]
    kappas = agreement.analyze(verdict_table(rows))["cohen_kappa"]
    assert len(kappas) == 1
    assert kappas[0]["rater_1"] == "human:1" and kappas[0]["n"] == 20
    assert kappas[0]["agreement"] == pytest.approx(0.7)
    assert kappas[0]["kappa"] == pytest.approx(0.4)
    assert agreement.analyze(verdict_table(rows), min_overlap=21)["cohen_kappa"] == []


def test_cohen_kappa_is_limited_to_the_busiest_raters():
    # 60 raters on the same 10 items (the first 55 also on an 11th): kappa for C(50, 2) pairs.
    rows = [(f"p{k}", "x", "y", "a", f"human:{r:02d}") for k in range(10) for r in range(60)]
    rows += [("p10", "x", "y", "b", f"human:{r:02d}") for r in range(55)]
    kappas = agreement.analyze(verdict_table(rows))["cohen_kappa"]
    assert len(kappas) == 50 * 49 // 2
    assert max(int(k["rater_2"][-2:]) for k in kappas) < 55


def test_cohen_kappa_three_categories_by_hand():
    # rows r1, columns r2 (first, second, tie): [[5,1,0],[0,3,1],[1,0,1]], n=12.
    # p_o = 9/12; row marginals 6,4,2; column marginals 6,4,2; p_e = (36+16+4)/144.
    confusion = np.array([[5, 1, 0], [0, 3, 1], [1, 0, 1]])
    p_o, p_e = 9 / 12, 56 / 144
    assert float(agreement.cohen_kappa(confusion)) == pytest.approx((p_o - p_e) / (1 - p_e))


def test_fleiss_kappa_published_example():
    # Fleiss' kappa worked example (Wikipedia, "Fleiss' kappa"): 10 subjects, 14 raters, 5
    # categories; P-bar = 0.378, P-bar_e = 0.213, kappa = 0.210.
    counts = np.array([[0, 0, 0, 0, 14], [0, 2, 6, 4, 2], [0, 0, 3, 5, 6], [0, 3, 9, 2, 0],
                       [2, 2, 8, 1, 1], [7, 7, 0, 0, 0], [3, 2, 6, 3, 0], [2, 5, 3, 2, 2],
                       [6, 5, 2, 1, 0], [0, 2, 2, 3, 7]])
    assert agreement.fleiss_kappa(counts) == pytest.approx(0.210, abs=5e-4)
    with pytest.raises(ValueError, match="same number"):
        agreement.fleiss_kappa(np.array([[2, 0], [1, 2]]))


def test_fleiss_applies_to_the_most_common_number_of_verdicts():
    # Three items with 3 verdicts (x,x,x), (x,x,y), (x,y,tie) and one with 2: Fleiss uses the three.
    # P_i = 1, 1/3, 0 -> P-bar = 4/9; p = (6/9, 2/9, 1/9) -> P-bar_e = 41/81; kappa = (36-41)/40.
    rows = [("p1", "x", "y", w, f"human:{k}") for k, w in enumerate("aaa")]
    rows += [("p2", "x", "y", w, f"human:{k}") for k, w in enumerate("aab")]
    rows += [("p3", "x", "y", w, f"human:{k}") for k, w in enumerate(["a", "b", "tie"])]
    rows += [("p4", "x", "y", w, f"human:{k}") for k, w in enumerate("ab")]
    fleiss = agreement.analyze(verdict_table(rows))["fleiss_kappa"]
    assert fleiss["raters_per_item"] == 3 and fleiss["n_items"] == 3
    assert fleiss["kappa"] == pytest.approx(-5 / 40)


def _alpha_by_coincidences(counts: np.ndarray) -> float:
    """Krippendorff's nominal alpha written out from the coincidence matrix (Krippendorff 2011,
    section C): an independent check of the reference value below."""
    counts = counts[counts.sum(axis=1) >= 2].astype(float)
    m = counts.sum(axis=1)
    coincidence = sum((np.outer(c, c) - np.diag(c)) / (mu - 1) for c, mu in zip(counts, m, strict=True))
    n_c = coincidence.sum(axis=0)
    n = n_c.sum()
    observed = coincidence.sum() - np.trace(coincidence)
    expected = (n_c.sum() ** 2 - np.sum(n_c**2)) / (n - 1)
    return 1 - observed / expected


def test_krippendorff_alpha_published_nominal_example():
    # Krippendorff (2011), "Computing Krippendorff's alpha-reliability", C.: 4 observers, 12 units,
    # values 1..5 with missing data; nominal alpha = 0.743.
    nan = np.nan
    data = np.array([[1, 2, 3, 3, 2, 1, 4, 1, 2, nan, nan, nan],
                     [1, 2, 3, 3, 2, 2, 4, 1, 2, 5, nan, 3],
                     [nan, 3, 3, 3, 2, 3, 4, 2, 2, 5, 1, nan],
                     [1, 2, 3, 3, 2, 4, 4, 1, 2, 5, 1, nan]])
    counts = np.stack([np.sum(data == value, axis=0) for value in range(1, 6)], axis=1)
    assert _alpha_by_coincidences(counts) == pytest.approx(0.743, abs=5e-4)
    assert agreement.krippendorff_alpha(counts) == pytest.approx(0.743, abs=5e-4)


def test_counted_rows_give_the_statistics_of_the_rows_repeated():
    # items with the same counts come as one row and a weight (the report's form): alpha (against
    # the krippendorff package too), Fleiss and pairwise agreement are those of the rows repeated
    import krippendorff

    rng = np.random.default_rng(7)
    rows = rng.integers(0, 4, (400, 3))
    rows[:50, :] = [[3, 0, 0]]  # a constant block
    profiles, weights = verdicts.distinct_rows(rows)
    assert len(profiles) < len(rows) and weights.sum() == len(rows)
    pairable = rows[rows.sum(axis=1) >= 2]
    package = float(krippendorff.alpha(value_counts=pairable, level_of_measurement="nominal"))
    assert agreement.krippendorff_alpha(rows) == pytest.approx(package, abs=1e-12)
    assert agreement.krippendorff_alpha(profiles, weights) == pytest.approx(package, abs=1e-12)
    for ties in (True, False):
        assert agreement.pairwise_agreement(profiles, ties, weights) == \
            agreement.pairwise_agreement(rows, ties)
    three = rows[rows.sum(axis=1) == 3]
    profiles, weights = verdicts.distinct_rows(three)
    assert agreement.fleiss_kappa(profiles, weights) == pytest.approx(agreement.fleiss_kappa(three),
                                                                      abs=1e-12)


def test_krippendorff_alpha_on_verdicts_matches_coincidences():
    rows = [("p1", "x", "y", w, f"human:{k}") for k, w in enumerate(["a", "a", "tie"])]
    rows += [("p2", "x", "y", w, f"human:{k}") for k, w in enumerate(["b", "b"])]
    rows += [("p3", "y", "x", w, f"human:{k}") for k, w in enumerate(["a", "b", "a"])]
    rows += [("p4", "x", "y", "a", "human:0")]  # one verdict: not pairable
    counts = np.array([[2, 0, 1], [0, 2, 0], [1, 2, 0]])
    alpha = agreement.analyze(verdict_table(rows))["krippendorff_alpha"]
    assert alpha == pytest.approx(_alpha_by_coincidences(counts))


def test_leave_one_out_majority_flags_the_adversary():
    # 30 items, 4 raters always prefer x, one always prefers y: the good raters see a unanimous
    # majority of 3 others plus the adversary (x by 3:1): agreement 1; the adversary 0.
    rows = [(f"p{k}", "x", "y", "a", f"human:good{r}") for k in range(30) for r in range(4)]
    rows += [(f"p{k}", "x", "y", "b", "human:adversary") for k in range(30)]
    result = agreement.analyze(verdict_table(rows))
    assert result["flagged_raters"] == ["human:adversary"]
    assert result["per_rater"]["human:adversary"]["agreement"] == 0.0
    assert result["per_rater"]["human:adversary"]["n"] == 30
    assert result["per_rater"]["human:good0"]["agreement"] == 1.0
    assert not result["per_rater"]["human:good0"]["flagged"]


def test_noisy_rater_is_flagged_and_a_slightly_worse_one_is_not():
    # Four good raters prefer x on all 30 items; "noisy" flips half, "fair" flips 2, the adversary
    # all. Each one's others keep an x majority, so LOO agreement = 1/2, 28/30 and 0; the good
    # raters match every majority their others form (agreement 1). Median rater 1: noisy (Wilson upper 0.67)
    # and the adversary are flagged, "fair" (0.93, within 0.10 of the median) is not.
    rows = [(f"p{k}", "x", "y", "a", f"human:good{r}") for k in range(30) for r in range(4)]
    rows += [(f"p{k}", "x", "y", "ab"[k % 2], "human:noisy") for k in range(30)]
    rows += [(f"p{k}", "x", "y", "b" if k < 2 else "a", "human:fair") for k in range(30)]
    rows += [(f"p{k}", "x", "y", "b", "human:adversary") for k in range(30)]
    result = agreement.analyze(verdict_table(rows))
    assert result["flagged_raters"] == ["human:adversary", "human:noisy"]
    assert result["per_rater"]["human:noisy"]["agreement"] == 0.5
    assert result["per_rater"]["human:fair"]["agreement"] == pytest.approx(28 / 30)


def test_leave_one_out_without_a_majority_is_not_counted():
    # Two raters who disagree: each one's "others" is a single opposite verdict (a majority of one).
    # Three raters x, y, tie: the others split 1:1, so no verdict has a majority to compare with.
    two = agreement.analyze(verdict_table([("p", "x", "y", "a", "human:1"),
                                           ("p", "x", "y", "b", "human:2")]))
    assert two["per_rater"]["human:1"] == pytest.approx(
        {"n": 1, "agreement": 0.0, "low": 0.0, "high": 0.7935, "flagged": False}, abs=1e-4)
    three = agreement.analyze(verdict_table([("p", "x", "y", w, f"human:{w}")
                                             for w in ("a", "b", "tie")]))
    assert three["per_rater"] == {} and three["loo_agreement"] is None


def test_human_ai_by_hand():
    # item 1: humans x, x; AI x -> 2 matches. item 2: human y, tie; AI y -> 1 of 2.
    # item 3: human x; AI tie -> 0 of 1. item 4: only the AI. with ties 3/5; without ties 3/3.
    rows = [("p1", "x", "y", "a", "human:1"), ("p1", "y", "x", "b", "human:2"),
            ("p1", "x", "y", "a", "ai:judge:c"),
            ("p2", "x", "y", "b", "human:1"), ("p2", "x", "y", "tie", "human:2"),
            ("p2", "x", "y", "b", "ai:judge:c"),
            ("p3", "x", "y", "a", "human:1"), ("p3", "x", "y", "tie", "ai:judge:c"),
            ("p4", "x", "y", "a", "ai:judge:c")]
    assert agreement.analyze(verdict_table(rows))["human_ai"] == {
        "ai:judge:c": {"with_ties": 0.6, "without_ties": 1.0, "n": 5, "n_without_ties": 3}}


def test_position_consistency_by_hand():
    # Four items judged in both orders. Items 1-3: the same response wins both times (consistent);
    # item 4: the response shown first wins both times (inconsistent). Consistency 3/4; the shown-
    # first response wins 1 + 1 + 1 + 2 = 5 of 8 decided verdicts. Item 5 only in one order.
    rows = []
    for k in range(1, 4):
        rows += [(f"p{k}", "x", "y", "a", "ai:judge"), (f"p{k}", "y", "x", "b", "ai:judge")]
    rows += [("p4", "x", "y", "a", "ai:judge"), ("p4", "y", "x", "a", "ai:judge"),
             ("p5", "x", "y", "a", "ai:judge"), ("p1", "x", "y", "a", "human:1"),
             ("p1", "y", "x", "a", "human:1")]
    result = agreement.analyze(verdict_table(rows))["position_consistency"]
    assert result == {"ai:judge": {"consistency": 0.75, "n": 4, "first_shown_win_rate": 0.625}}


def test_orientation_does_not_change_any_statistic():
    rng = np.random.default_rng(3)
    rows = [(f"p{rng.integers(5)}", *rng.choice(["r1", "r2", "r3"], 2, replace=False),
             rng.choice(["a", "b", "tie"]), f"human:{rng.integers(4)}") for _ in range(300)]
    flipped = [(p, b, a, {"a": "b", "b": "a", "tie": "tie"}[w], r) for p, a, b, w, r in rows]
    assert agreement.analyze(verdict_table(rows)) == agreement.analyze(verdict_table(flipped))


@pytest.mark.parametrize("change, message", [
    (lambda t: t.drop_columns(["rater"]), "lacks columns"),
    (lambda t: t.set_column(3, "winner", pa.array(["a", "left"])), "winner must be"),
    (lambda t: t.set_column(2, "response_b", pa.array(["x", "x"])), "with itself"),
    (lambda t: t.set_column(0, "prompt_id", pa.array(["p", None])), "nulls"),
])
def test_bad_tables_are_refused_with_the_fix(change, message):
    table = verdict_table([("p", "x", "y", "a", "human:1"), ("p", "y", "x", "b", "human:2")])
    with pytest.raises(verdicts.VerdictTableError, match=message):
        agreement.analyze(change(table))


def test_empty_table():
    result = agreement.analyze(verdict_table([]))
    assert result["n_judgments"] == 0 and result["pairwise_with_ties"] is None
    assert result["krippendorff_alpha"] is None and result["fleiss_kappa"] is None


def test_hh_rlhf_has_one_rater_per_item(shared_data):
    result = agreement.analyze(hh_rlhf(shared_data / "hh-rlhf" / "harmless-base-test.jsonl.gz"))
    assert result["n_judgments"] == 2312
    assert result["n_pairs"] == 0 and result["pairwise_with_ties"] is None
    assert result["krippendorff_alpha"] is None and result["cohen_kappa"] == []
    assert result["per_rater"] == {} and result["human_ai"] == {}


def test_mtbench_human_vs_gpt4_matches_the_paper(shared_data):
    # Zheng et al. 2023 ("Judging LLM-as-a-judge", Table 2, first turn): GPT-4 vs human agreement
    # 66% with ties and 85% without; human vs human 63% and 81%.
    table = mtbench(shared_data / "mtbench_human" / "mtbench_turn1_judgments.jsonl.gz")
    result = agreement.analyze(table)
    gpt4 = result["human_ai"]["ai:gpt-4"]
    assert gpt4["n"] == 882
    assert gpt4["with_ties"] == pytest.approx(0.66, abs=0.02)
    assert gpt4["without_ties"] == pytest.approx(0.85, abs=0.02)
    humans = agreement.analyze(table.filter(pa.compute.starts_with(table["rater"], "human:")))
    assert humans["pairwise_with_ties"] == pytest.approx(0.63, abs=0.03)
    assert humans["pairwise_without_ties"] == pytest.approx(0.81, abs=0.03)
    assert 0.3 < humans["krippendorff_alpha"] < 0.7
