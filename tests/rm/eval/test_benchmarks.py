"""Benchmark files read as published (Parquet and JSONL, built from LLMBar and MT-Bench) and scored
with simple scorers whose scores the test computes by hand; bad rows name their row and field."""

import json

import pytest

from rm.eval.benchmarks import (
    BenchmarkFileError,
    evaluate_benchmark,
    read_benchmark,
    read_rewardbench2_row,
    read_rewardbench_row,
)
from tests.rm.eval.benchmark_files import (
    TIES_QUESTIONS,
    rewardbench2_rows,
    rewardbench_rows,
    write_jsonl,
    write_parquet,
)


def shorter_wins(prompts, responses):
    return [-float(len(r)) for r in responses]


def constant(prompts, responses):
    return [0.0] * len(responses)


@pytest.fixture(scope="module")
def rb_rows(shared_data):
    return rewardbench_rows(shared_data)


@pytest.fixture(scope="module")
def rb2_rows(shared_data):
    return rewardbench2_rows(shared_data)


def test_rewardbench_parquet_and_jsonl_read_the_same_rows(rb_rows, tmp_path):
    from_jsonl = read_benchmark(write_jsonl(rb_rows, tmp_path / "rb.jsonl"), "rewardbench")
    from_parquet = read_benchmark(write_parquet(rb_rows, tmp_path / "rb.parquet"), "rewardbench")
    assert from_jsonl == from_parquet and len(from_jsonl) == 8 * 6
    assert {r["subset"] for r in from_jsonl} >= {"llmbar-natural", "mt-bench-hard"}


def test_rewardbench_scores_of_a_shorter_wins_scorer(rb_rows):
    rows = [read_rewardbench_row(r, f"row {i}") for i, r in enumerate(rb_rows)]
    out = evaluate_benchmark(shorter_wins, rows, "rewardbench")
    accuracy = {}
    for subset in {r["subset"] for r in rb_rows}:
        pairs = [r for r in rb_rows if r["subset"] == subset]
        accuracy[subset] = sum(len(r["chosen"]) < len(r["rejected"]) for r in pairs) / len(pairs)
    assert {s: v["score"] for s, v in out["per_subset"].items()} == pytest.approx(accuracy)
    chat_hard = (37 * accuracy["mt-bench-hard"] + 100 * accuracy["llmbar-natural"]
                 + 134 * accuracy["llmbar-adver-neighbor"] + 92 * accuracy["llmbar-adver-GPTInst"]
                 + 47 * accuracy["llmbar-adver-GPTOut"] + 46 * accuracy["llmbar-adver-manual"]) / 456
    chat = (28 * accuracy["mt-bench-easy"] + 40 * accuracy["mt-bench-med"]) / 68
    assert out["sections"]["Chat Hard"] == pytest.approx(chat_hard)
    assert out["sections"]["Chat"] == pytest.approx(chat)
    assert out["sections"]["Safety"] is None and out["score"] is None
    assert out["n_rows"] == 48 and out["n_responses"] == 96
    assert "hep-go" in out["missing_subsets"] and "llmbar-natural" not in out["missing_subsets"]


def test_rewardbench2_parquet_with_a_constant_scorer_gets_the_tie_credit(rb2_rows, tmp_path):
    rows = read_benchmark(write_parquet(rb2_rows, tmp_path / "rb2.parquet"), "rewardbench2")
    assert rows == read_benchmark(write_jsonl(rb2_rows, tmp_path / "rb2.jsonl"), "rewardbench2")
    out = evaluate_benchmark(constant, rows, "rewardbench2")
    for subset in ("Factuality", "Precise IF", "Math", "Safety", "Focus"):
        assert out["per_subset"][subset] == {"n": 3, "score": 0.25}  # four-way ties: ¼ each
    assert out["per_subset"]["Ties"]["score"] == 0.0 and out["per_subset"]["Ties"]["n"] == 6
    assert out["score"] == pytest.approx(5 * 0.25 / 6) and out["missing_subsets"] == []


def test_rewardbench2_with_a_scorer_that_knows_the_answers(rb2_rows):
    """Right answers 1, wrong 0: every best-of-4 row is won outright; in Ties every gap is 1 and every
    spread 0, so all four shares are 1 and the tanh term is tanh(+inf) = 1: 1.01."""
    right = {r["chosen"][0] for r in rb2_rows if r["subset"] != "Ties"}
    right |= {answer for _, answers, _ in TIES_QUESTIONS for answer in answers}
    checked = [read_rewardbench2_row(r, f"row {i}") for i, r in enumerate(rb2_rows)]
    out = evaluate_benchmark(lambda p, rs: [float(r in right) for r in rs], checked, "rewardbench2")
    assert [out["per_subset"][s]["score"] for s in ("Factuality", "Math", "Focus")] == [1.0] * 3
    assert out["per_subset"]["Ties"]["score"] == pytest.approx(1.01)
    assert out["score"] == pytest.approx((5 + 1.01) / 6)


def _write_lines(path, rows):
    path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n")
    return path


GOOD = {"prompt": "2+2?", "chosen": "4", "chosen_model": "m", "rejected": "5", "rejected_model": "m",
        "subset": "math-prm", "id": 1}


@pytest.mark.parametrize("bad, message", [
    ({k: v for k, v in GOOD.items() if k != "rejected"}, ":2: missing column 'rejected'"),
    ({**GOOD, "chosen": ["4"]}, ":2: field 'chosen' must be text, got a list"),
    ({**GOOD, "subset": "chat"}, ":2: field 'subset': 'chat' is not a RewardBench subset"),
    ("{not json", ":2: not a JSON object"),
    ([1, 2], ":2: a row must be an object"),
])
def test_a_bad_rewardbench_row_names_its_line_and_field(tmp_path, bad, message):
    path = _write_lines(tmp_path / "rb.jsonl", [GOOD, bad, GOOD])
    with pytest.raises(BenchmarkFileError, match=message) as caught:
        read_benchmark(path, "rewardbench")
    assert str(caught.value).startswith(str(path)) and "\n" not in str(caught.value)


def test_a_bad_parquet_row_names_its_index(tmp_path):
    path = write_parquet([GOOD, GOOD, {**GOOD, "subset": "Chat"}], tmp_path / "rb.parquet")
    with pytest.raises(BenchmarkFileError, match=r"rb.parquet row 2: field 'subset': 'Chat'"):
        read_benchmark(path, "rewardbench")


RB2 = {"id": "9", "prompt": "p", "chosen": ["a"], "rejected": ["b", "c", "d"], "num_correct": 1,
       "num_incorrect": 3, "total_completions": 4, "models": [], "subset": "Focus",
       "additional_metadata": {}}


@pytest.mark.parametrize("bad, message", [
    ({**RB2, "chosen": "a"}, "field 'chosen' must be a list of texts, got text"),
    ({**RB2, "rejected": ["b", None]}, "field 'rejected' item 1 must be text, got null"),
    ({**RB2, "prompt": ["p"]}, "field 'prompt' must be text, got a list"),
    ({**RB2, "subset": "Coding"}, "field 'subset': 'Coding' is not a RewardBench 2 subset"),
    ({k: v for k, v in RB2.items() if k != "num_correct"}, "missing column 'num_correct'"),
    ({**RB2, "total_completions": 5}, "field 'total_completions' is 5 but the row holds 4"),
    ({**RB2, "num_correct": 2}, "field 'num_correct' is 2 but the row holds 1"),
    ({**RB2, "subset": "Ties"}, "field 'id': a Ties row needs an id 'ref:N' or 'tied:N'"),
    ({**RB2, "chosen": [], "num_correct": 0, "total_completions": 3}, "field 'chosen' is empty"),
])
def test_a_bad_rewardbench2_row_names_its_line_and_field(tmp_path, bad, message):
    path = _write_lines(tmp_path / "rb2.jsonl", [RB2, RB2, bad])
    with pytest.raises(BenchmarkFileError, match=f"rb2.jsonl:3: {message}"):
        read_benchmark(path, "rewardbench2")


def test_rewardbench2_subset_names_match_across_spellings(tmp_path):
    path = _write_lines(tmp_path / "rb2.jsonl", [{**RB2, "subset": "precise_if"},
                                                 {**RB2, "subset": "FACTUALITY"}])
    assert [r["subset"] for r in read_benchmark(path, "rewardbench2")] == ["Precise IF", "Factuality"]


def test_missing_and_empty_files(tmp_path):
    with pytest.raises(BenchmarkFileError, match="no such file"):
        read_benchmark(tmp_path / "nope.parquet", "rewardbench")
    with pytest.raises(BenchmarkFileError, match="no rows"):
        read_benchmark(_write_lines(tmp_path / "empty.jsonl", []), "rewardbench")
    (tmp_path / "bad.parquet").write_bytes(b"not parquet")
    with pytest.raises(BenchmarkFileError, match="not a Parquet file"):
        read_benchmark(tmp_path / "bad.parquet", "rewardbench")
