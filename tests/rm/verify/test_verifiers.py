"""Rule rewards (rm/verify/rules.py): the issue's worked numbers, acceptance 1 and 3."""

from __future__ import annotations

import importlib.util
import threading

import pytest

from rm.verify.rules import (
    DATA_SOURCES,
    VerifierError,
    available,
    exact,
    gsm8k,
    numeric,
    regex,
    resolve,
    run_verifier,
)

WORKED = "3×4=12, 12−2=10\n#### 10"


@pytest.mark.parametrize(("response", "gold", "reward"), [
    (WORKED, 10, 1.1),
    ("#### 7", 10, 0.1),
    ("So 10 apples are left.", 10, 0.0),
    ("#### 10.0", 10, 1.1),
    ("#### 1,000", 1000, 1.1),
    ("#### 7\n#### 10", 10, 1.0),
])
def test_gsm8k_worked_numbers(response, gold, reward):
    assert gsm8k(response, gold).reward == pytest.approx(reward, abs=1e-12)


def test_gsm8k_statuses_and_extraction():
    v = gsm8k("#### 7\n#### 10", 10)
    assert (v.correct, v.format_ok, v.status, v.extracted) == (True, False, "ok", "10")
    assert gsm8k("So 10 apples are left.", 10).status == "no_answer"
    assert gsm8k("#### ten", 10).status == "no_answer"  # a marker without a number: no bonus
    assert gsm8k("#### ten", 10).reward == 0.0
    bad = gsm8k("#### 10", "the answer is ten")
    assert (bad.status, bad.correct, bad.reward) == ("unparseable_gold", None, 0.0)


def test_gsm8k_reads_a_whole_solution_as_ground_truth():
    solution = "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n48+24 = <<48+24=72>>72\n#### 72"
    assert gsm8k("so #### 72", solution).reward == pytest.approx(1.1)
    assert gsm8k("#### 24", solution).reward == pytest.approx(0.1)
    assert gsm8k("#### $1,000", "$1,000").correct


def test_gsm8k_partial_credit_is_opt_in_and_hackable():
    assert gsm8k("So 10 apples are left.", 10).reward == 0.0
    assert gsm8k("So 10 apples are left.", 10, partial=0.5).reward == 0.5
    counting = " ".join(str(i) for i in range(1, 101))
    assert gsm8k(counting, 57, partial=0.5).reward == 0.5   # the hack
    assert gsm8k(counting, 101, partial=0.5).reward == 0.0
    assert gsm8k(counting, 57).reward == 0.0


def test_numeric_exact_regex():
    assert numeric("about 3.14159", 3.1416, atol=1e-3).reward == 1.0
    assert numeric("about 3.14159", 3.1416).reward == 0.0
    assert numeric("it costs $1,250 and 7 cents: 7", 7).correct  # the last number is read
    assert numeric("no digits", 3).status == "no_answer"
    assert exact(" Paris\n", "Paris").reward == 1.0
    assert exact("paris", "Paris").reward == 0.0
    assert exact("paris", "Paris", casefold=True).reward == 1.0
    assert regex("<think>a\nb</think> 4", pattern=r"^<think>.*?</think>").reward == 1.0
    assert regex("4 <think>x</think>", pattern=r"^<think>.*?</think>").reward == 0.0
    assert regex("x", pattern="(").status == "unparseable_gold"


def test_names_data_sources_and_errors():
    assert resolve(None, "openai/gsm8k") == "gsm8k"
    assert resolve(None, "HuggingFaceH4/MATH-500") == "math"
    assert set(DATA_SOURCES.values()) <= {"gsm8k", "math", "code"}
    with pytest.raises(VerifierError, match="data_source"):
        resolve(None, "my/unknown")
    with pytest.raises(VerifierError, match="unknown verifier"):
        available("gsm9k")
    crashed = run_verifier("exact", "x", "y", {"no_such_option": 1})
    assert crashed.status == "error" and "TypeError" in crashed.detail


def test_code_verifier_is_opt_in(monkeypatch):
    monkeypatch.delenv("BRADLEY_ENABLE_CODE_VERIFIER", raising=False)
    with pytest.raises(VerifierError, match="BRADLEY_ENABLE_CODE_VERIFIER=1"):
        available("code")
    monkeypatch.setenv("BRADLEY_ENABLE_CODE_VERIFIER", "1")
    available("code")


needs_math = pytest.mark.skipif(importlib.util.find_spec("math_verify") is None,
                                reason="math-verify not installed (pip install 'bradley[math]')")

MATH_CASES = [  # (gold, response, reward): acceptance 3
    (r"\frac{1}{2}", r"\boxed{0.5}", 1.0),
    (r"\frac{1}{2}", r"\boxed{\frac{2}{4}}", 1.0),
    (r"\sqrt{2}/2", r"The answer is \boxed{\frac{1}{\sqrt{2}}}", 1.0),
    (r"1<x<2", r"\boxed{(1,2)}", 1.0),
    (r"(1,2)", r"\boxed{1<x<2}", 0.0),
    ("10", "1 2 3 4 5 6 7 8 9 10", 0.0),
]


def _math_rewards() -> list[float]:
    from rm.verify.rules import math

    return [math(response, gold).reward for gold, response, _ in MATH_CASES]


@needs_math
def test_math_worked_cases_on_the_main_thread_and_off_it():
    expected = [reward for _, _, reward in MATH_CASES]
    assert _math_rewards() == expected
    seen = []
    thread = threading.Thread(target=lambda: seen.append(_math_rewards()))
    thread.start()
    thread.join()
    assert seen == [expected]  # math-verify's signal.alarm would raise here with default timeouts


@needs_math
def test_math_statuses():
    from rm.verify.rules import math

    assert math("no box here, just 3", "3").status == "no_answer"
    assert math(r"\boxed{3}", "???").status == "unparseable_gold"
    assert math(r"\boxed{3}", "???").correct is None
    assert math(r"\boxed{4}", "3").status == "ok" and not math(r"\boxed{4}", "3").correct
