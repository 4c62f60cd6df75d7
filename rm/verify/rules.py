"""Rule rewards ("verifiable rewards"): a registry of checkers that compare a response with ground
truth, torch-free and cheap, for GRPO/DAPO-style training beside (or instead of) a learned reward model.

Every verifier is `fn(response: str, ground_truth, **options) -> Check` and never raises on model
output: what went wrong is in `status`, one of

- `ok`               an answer was read and compared (`correct` is True or False);
- `no_answer`        nothing answer-shaped was found (reward 0, `correct` False);
- `unparseable_gold` the ground truth itself could not be read (reward 0, `correct` None: such items
                     are left out of accuracy statistics, they say nothing about the policy);
- `timeout`          the call ran past its wall-clock limit (set by rm/verify/pool.py);
- `error`            the verifier or the checked program failed (`detail` says how).

    >>> gsm8k("3x4=12, 12-2=10\\n#### 10", 10).reward
    1.1
    >>> [gsm8k(r, 10).reward for r in ("#### 7", "So 10 apples are left.", "#### 7\\n#### 10")]
    [0.1, 0.0, 1.0]
    >>> gsm8k("So 10 apples are left.", "2 + 8 = 10\\n#### 10", partial=0.5).reward
    0.5
    >>> numeric("The total is $1,250.50.", 1250.5)
    Check(reward=1.0, correct=True, format_ok=True, status='ok', extracted='$1,250.50', detail=None)
    >>> exact("  Paris ", "paris", casefold=True).correct
    True

`DATA_SOURCES` maps the dataset names trainers send (verl's `data_source`) to a verifier name.
The `code` verifier lives in rm/verify/sandbox.py; `math` needs the optional extra `bradley[math]`.
"""

from __future__ import annotations

import importlib
import importlib.util
import math as _math
import os
import re
from collections.abc import Callable

from rm.verify.check import Check
from rm.verify.sandbox import run_code

STATUSES = ("ok", "no_answer", "unparseable_gold", "timeout", "error")
FORMAT_BONUS = 0.1  # gsm8k: exactly one "####" followed by a number
CODE_ENV = "BRADLEY_ENABLE_CODE_VERIFIER"

# A number as people and GSM8K write it: optional sign and "$", thousands grouped by commas only in
# threes (so "1,2,3" is three numbers, "1,000" is one), optional decimals.
NUMBER = r"[-+]?\$?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|[-+]?\$?\.\d+"
NUMBER_RE = re.compile(NUMBER)
MARKER = "####"
MARKER_ANSWER_RE = re.compile(r"####\s*(" + NUMBER + r")")


class VerifierError(ValueError):
    """A verifier name or option the caller must fix (unknown name, missing extra, bad option)."""


def to_number(text: str) -> float | None:
    """ "$1,000.50" -> 1000.5; None when it is not a number.

    >>> to_number("$1,000.50"), to_number("-.5"), to_number("ten")
    (1000.5, -0.5, None)
    """
    cleaned = text.strip().replace(",", "").replace("$", "")
    try:
        value = float(cleaned)
    except ValueError:
        return None
    return value if _math.isfinite(value) else None


def same_number(a: float, b: float, rtol: float = 1e-6, atol: float = 1e-9) -> bool:
    """Numeric equality: `#### 10.0` is right for 10; float noise is not a wrong answer."""
    return abs(a - b) <= atol + rtol * abs(b)


def _gold_number(ground_truth) -> float | None:
    """A number, or text: a whole GSM8K solution ending in `#### N`, or a bare number."""
    if isinstance(ground_truth, bool):
        return None
    if isinstance(ground_truth, int | float):
        try:
            return float(ground_truth) if _math.isfinite(ground_truth) else None
        except OverflowError:  # an integer beyond any float
            return None
    if not isinstance(ground_truth, str):
        return None
    if MARKER in ground_truth:
        found = MARKER_ANSWER_RE.match(ground_truth, ground_truth.rfind(MARKER))
        return to_number(found.group(1)) if found else None
    return to_number(ground_truth)


def exact(response: str, ground_truth, strip: bool = True, casefold: bool = False) -> Check:
    """1 when the response equals the ground truth (after `strip` / `casefold` when asked)."""
    if not isinstance(ground_truth, str | int | float) or isinstance(ground_truth, bool):
        return Check(0.0, None, False, "unparseable_gold")
    got, want = response, str(ground_truth)
    if strip:
        got, want = got.strip(), want.strip()
    if casefold:
        got, want = got.casefold(), want.casefold()
    ok = got == want
    return Check(float(ok), ok, True, "ok", got[:200])


def numeric(response: str, ground_truth, atol: float = 1e-9, rtol: float = 1e-6) -> Check:
    """1 when the last number in the response equals the ground truth within atol + rtol·|gold|."""
    gold = _gold_number(ground_truth)
    if gold is None:
        return Check(0.0, None, False, "unparseable_gold")
    numbers = NUMBER_RE.findall(response)
    if not numbers:
        return Check(0.0, False, False, "no_answer")
    got = to_number(numbers[-1])
    ok = got is not None and same_number(got, gold, rtol, atol)
    return Check(float(ok), ok, True, "ok", numbers[-1])


def gsm8k(response: str, ground_truth, partial: float = 0.0, format_bonus: float = FORMAT_BONUS
          ) -> Check:
    """GSM8K's rule: 1 for the right number after the last `####`, plus `format_bonus` (0.1) when
    there is exactly one `####` and a number follows it. Several markers: the last one is read and no
    bonus is given (a policy must not hedge). `partial` (off by default) pays for the right number
    anywhere in the text when the marked answer is missing or wrong; it is there to show how such
    credit is hacked: "1 2 3 ... 100" earns it on every problem whose answer lies in 1..100.
    """
    gold = _gold_number(ground_truth)
    if gold is None:
        return Check(0.0, None, False, "unparseable_gold")
    markers = response.count(MARKER)
    found = MARKER_ANSWER_RE.match(response, response.rfind(MARKER)) if markers else None
    format_ok = markers == 1 and found is not None
    bonus = format_bonus if format_ok else 0.0
    answer = to_number(found.group(1)) if found else None
    if answer is not None and same_number(answer, gold):
        return Check(1.0 + bonus, True, format_ok, "ok", found.group(1))
    if partial and any(same_number(v, gold) for v in map(to_number, NUMBER_RE.findall(response))
                       if v is not None):
        return Check(partial + bonus, False, format_ok, "ok" if found else "no_answer",
                     found.group(1) if found else None, "partial credit")
    if found is None:
        return Check(0.0, False, False, "no_answer")
    return Check(bonus, False, format_ok, "ok", found.group(1))


def regex(response: str, ground_truth=None, pattern: str | None = None, fullmatch: bool = False
          ) -> Check:
    r"""1 when the response matches `pattern` (or the ground truth taken as a pattern), a format
    check such as `<think>.*?</think>`; dot matches newlines. Patterns come from requests, so they
    run in a worker with a wall-clock limit (catastrophic backtracking is a timeout, not a hang).

    >>> regex("<think>ok</think> 4", pattern=r"^<think>.*?</think>").reward
    1.0
    """
    pattern = pattern if pattern is not None else ground_truth
    if not isinstance(pattern, str):
        return Check(0.0, None, False, "unparseable_gold", detail="pass a pattern")
    try:
        compiled = re.compile(pattern, re.DOTALL)
    except re.error as exc:
        return Check(0.0, None, False, "unparseable_gold", detail=f"bad pattern: {exc}")
    hit = (compiled.fullmatch if fullmatch else compiled.search)(response)
    return Check(float(hit is not None), hit is not None, hit is not None, "ok",
                 hit.group(0)[:200] if hit else None)


def math(response: str, ground_truth) -> Check:
    r"""Mathematical equivalence with `math-verify` (extra `bradley[math]`). The gold answer is wrapped
    in `\boxed{}` before parsing (a bare `\sqrt{2}/2` parses to nothing otherwise); the response is
    parsed strictly: LaTeX only, `\boxed{}` first, nothing taken without an anchor, so a list
    "1 2 3 ... 10" is not a correct 10. Both timeouts are off (`parsing_timeout=None`,
    `timeout_seconds=None`): math-verify's own use `signal.alarm`, which fails off the main thread
    and would turn every reward into a silent 0; the worker pool bounds the time instead.
    Not symmetric: gold `1<x<2` accepts `\boxed{(1,2)}`, gold `(1,2)` refuses `\boxed{1<x<2}`.
    """
    mv = _math_verify()
    gold_text = str(ground_truth).strip() if isinstance(ground_truth, str | int | float) else ""
    if not gold_text or isinstance(ground_truth, bool):
        return Check(0.0, None, False, "unparseable_gold")
    boxed = gold_text if "\\boxed" in gold_text else f"\\boxed{{{gold_text}}}"
    gold = mv.parse(boxed, parsing_timeout=None)
    if not any(not isinstance(g, str) for g in gold):  # only the raw-text fallback: nothing parsed
        return Check(0.0, None, False, "unparseable_gold")
    strict = [mv.LatexExtractionConfig(boxed_match_priority=0, try_extract_without_anchor=False)]
    pred = mv.parse(response, extraction_config=strict, parsing_timeout=None)
    if not pred:
        return Check(0.0, False, False, "no_answer")
    ok = bool(mv.verify(gold, pred, timeout_seconds=None))
    return Check(float(ok), ok, True, "ok", str(pred[-1])[:200])


def _math_verify():
    try:
        return importlib.import_module("math_verify")
    except ImportError:
        raise VerifierError("the math verifier needs math-verify: pip install 'bradley[math]'") from None


def code(response: str, ground_truth, **options) -> Check:
    """Run Python against tests; see rm/verify/sandbox.py (opt-in: BRADLEY_ENABLE_CODE_VERIFIER=1)."""
    return run_code(response, ground_truth, **options)


VERIFIERS: dict[str, Callable[..., Check]] = {
    "exact": exact, "numeric": numeric, "gsm8k": gsm8k, "math": math, "regex": regex, "code": code,
}

# verl's `data_source` values (those of its default_compute_score, and the Hub ids trainers put
# there) -> verifier name.
DATA_SOURCES = {
    "openai/gsm8k": "gsm8k", "gsm8k": "gsm8k", "gsm_symbolic": "gsm8k",
    "HuggingFaceH4/MATH-500": "math", "lighteval/MATH": "math", "DigitalLearningGmbH/MATH-lighteval":
    "math", "math": "math", "AI-MO/NuminaMath-CoT": "math", "math_dapo": "math",
    "numina_aops_forum": "math", "numina_synthetic_math": "math", "numina_amc_aime": "math",
    "numina_olympiads": "math", "numina_cn_k12": "math",
    "openai/openai_humaneval": "code", "openai_humaneval": "code", "humaneval": "code",
}


def available(name: str) -> None:
    """Raise VerifierError (with the fix) unless `name` can run in this installation."""
    if name not in VERIFIERS:
        raise VerifierError(f"unknown verifier {name!r}; use one of {sorted(VERIFIERS)}")
    if name == "math" and importlib.util.find_spec("math_verify") is None:
        raise VerifierError("the math verifier needs math-verify: pip install 'bradley[math]'")
    if name == "code" and os.environ.get(CODE_ENV) != "1":
        raise VerifierError(f"the code verifier runs submitted programs; enable it with {CODE_ENV}=1 "
                            "(it is not a security boundary: see rm/verify/sandbox.py)")


def resolve(verifier: str | None, data_source: str | None) -> str:
    """The verifier for an item: named directly, or looked up from its data source.

    >>> resolve(None, "openai/gsm8k"), resolve("numeric", None)
    ('gsm8k', 'numeric')
    """
    if verifier is not None:
        return verifier
    if data_source in DATA_SOURCES:
        return DATA_SOURCES[data_source]
    raise VerifierError(f"no verifier for data_source {data_source!r}; name one with \"verifier\" "
                        f"or use one of {sorted(DATA_SOURCES)}")


def run_verifier(name: str, response: str, ground_truth, options: dict | None = None) -> Check:
    """Call a verifier in this process, turning a crash into `status: error` (never a silent 0)."""
    try:
        return VERIFIERS[name](response, ground_truth, **(options or {}))
    except Exception as exc:  # the check carries it; the pool counts it
        return Check(0.0, None, False, "error", detail=f"{type(exc).__name__}: {exc}"[:300])
