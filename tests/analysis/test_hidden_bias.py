"""The report's verdict names length biases that the pooled figure hides: on hh-rlhf and MT-Bench in
one store the pooled share of longer wins is a mild 53%, while GPT-4 prefers the longer answer (74%)
and the hh crowdworkers the shorter one."""

from __future__ import annotations

import pytest

from analysis import hidden_bias
from analysis.report import build_report, summary_text
from annotation.ingest.batch import ingest_file


def group(p, low, high, n=500):
    return {"p_longer_wins": p, "p_longer_wins_ci95": [low, high], "n": n}


@pytest.fixture(scope="module")
def hh_and_mtbench(tmp_path_factory, shared_data):
    from annotation.store import Store

    with Store(tmp_path_factory.mktemp("hidden") / "s.duckdb") as store:
        ingest_file(store, shared_data / "hh-rlhf/harmless-base-test.jsonl.gz", on_error="skip")
        ingest_file(store, shared_data / "mtbench_human/mtbench_turn1_judgments.jsonl.gz")
        yield build_report(store)


def test_opposite_biases_in_the_pool_are_named_in_the_verdict(hh_and_mtbench):
    report = hh_and_mtbench
    lb, findings = report["length_bias"], report["verdict"]["findings"]
    assert 0.5 < lb["p_longer_wins"] < 0.55  # the pooled figure: a mild preference
    kinds = next(f for f in findings if f.startswith("The overall length figure hides"))
    assert "ai raters prefer the longer answer (the longer wins 74%, CI 70%–78%, n=455)" in kinds
    raters = next(f for f in findings if "rater(s) have a length preference" in f)
    assert "human:anonymous prefers the shorter answer (the longer wins 44%" in raters
    problem = dict(zip(findings, report["verdict"]["problem"], strict=True))
    assert problem[kinds] is True  # GPT-4's 74% is strong, as a pooled 74% would be
    assert kinds in summary_text(report)


def test_groups_that_agree_with_the_pool_or_are_unclear_are_not_flagged():
    lb = {**group(0.70, 0.67, 0.73),
          "by_kind": {"ai": group(0.74, 0.70, 0.78), "human": group(0.66, 0.62, 0.70)},
          "by_rater": {"human:a": group(0.55, 0.40, 0.70, 40)}}
    assert hidden_biases_of(lb) == ([], [])
    assert hidden_bias.findings(lb) == []


def test_a_strong_group_under_a_mild_pool_and_an_opposite_rater_are_flagged():
    lb = {**group(0.53, 0.51, 0.55),
          "by_kind": {"ai": group(0.74, 0.70, 0.78), "human": group(0.52, 0.50, 0.54)},
          "by_rater": {"human:x": group(0.30, 0.26, 0.34, 500), "ai:judge": group(0.74, 0.70, 0.78)}}
    kinds, raters = hidden_biases_of(lb)
    assert kinds == [("ai", "longer")]
    assert raters == [("human:x", "shorter")]  # ai:judge: its kind's finding already says it


def test_rater_intervals_are_corrected_for_how_many_raters_are_tested():
    # 33 of 50 longer wins: the 95% interval excludes 0.5, the one corrected for 40 raters does not
    alone = {**group(0.5, 0.45, 0.55), "by_kind": {}, "by_rater": {"human:r0": group(0.66, 0.52, 0.77, 50)}}
    many = {**alone, "by_rater": {f"human:r{i}": group(0.66 if i == 0 else 0.5, 0.52, 0.77, 50)
                                   for i in range(40)}}
    assert hidden_biases_of(alone)[1] == [("human:r0", "longer")]
    assert hidden_biases_of(many)[1] == []


def hidden_biases_of(lb):
    found = hidden_bias.hidden_biases(lb)
    return ([(g["name"], g["direction"]) for g in found["kinds"]],
            [(g["name"], g["direction"]) for g in found["raters"]])
