"""RLAIF bookkeeping: constitutions, judge prompts, both presentation orders, and the verdict rows an
LLM judge's probabilities become. Text and numbers only: the model side is rm/judge/local.py, and the CLI
edge (service/cli/label.py) composes store → comparisons → prompts → judge → rows → one ingest batch.

A constitution (Bai et al. 2022, *Constitutional AI*, §4) is a TOML file: `name`, `version`, a list of
`[[principles]]` (each a comparison question `text`, optional `weight`, default 1) and a judge prompt
`template` with named slots ({header} {prompt} {first} {second} {principle} {label_first}
{label_second}). The template ends where the judge writes the label of the better response, so a
local judge reads P(label) from one forward (§4.1's soft preference labels). Everything before
{principle} is shared by every principle of one presentation, which lets a judge reuse its KV cache.

Every comparison is judged in both orders, (a, b) and (b, a): LLM judges prefer whatever is shown
first (Zheng et al. 2023, MT-Bench, §3.3). Each order is one raw judgment with `strength` =
P(winner better); the store's `voices_in` macro then counts the rater once per comparison.

    >>> c = load_constitution("helpful")
    >>> c.rater("smollm2"), len(c.principles)  # doctest: +ELLIPSIS
    ('ai:smollm2:helpful@...', 2)
    >>> text = c.render("2+2?", "4", "5", c.principles[0].text)
    >>> text.endswith("The answer is: (")
    True
    >>> order_probability(0.8, 0.3)  # P(a better): a shown first 0.8; b shown first 0.3
    0.75
"""

from __future__ import annotations

import hashlib
import random
import re
import string
from dataclasses import dataclass, field
from pathlib import Path

import tomllib

CONSTITUTIONS = Path(__file__).with_name("constitutions")
LABELS = ("A", "B")
SLOTS = {"header", "prompt", "first", "second", "principle", "label_first", "label_second"}
REQUIRED_SLOTS = SLOTS - {"header"}
REQUIRED_FIELDS = ("name", "version", "template", "principles")
OPPOSITE_MARGIN = 0.1  # both orders this far from 1/2 on opposite sides: position bias, a tie


class ConstitutionError(ValueError):
    """A constitution file that cannot be used; the message is `FILE:LINE: field: problem`."""


@dataclass(frozen=True)
class Principle:
    text: str
    weight: float = 1.0


@dataclass
class Constitution:
    name: str
    version: str
    template: str
    principles: list[Principle]
    header: str = ""
    path: str = ""
    sha8: str = ""
    labels: tuple[str, str] = LABELS
    extra: dict = field(default_factory=dict)

    def rater(self, model: str, suffix: str = "") -> str:
        """`ai:<model>:<constitution>@<8 hex of the file's sha256>[suffix]`."""
        return f"ai:{model}:{self.name}@{self.sha8}{suffix}"

    def split(self, prompt: str, first: str, second: str) -> tuple[str, str]:
        """(shared prefix, template tail with the {principle} slot still open) for one order."""
        values = self._values(prompt, first, second)
        head, tail = self.template.split("{principle}", 1)
        return head.format(**values), "{principle}" + tail.format(**values)

    def render(self, prompt: str, first: str, second: str, principle: str) -> str:
        """The whole judge prompt for one presentation and one principle."""
        head, tail = self.split(prompt, first, second)
        return head + tail.replace("{principle}", principle)

    def _values(self, prompt, first, second) -> dict:
        return {"header": self.header, "prompt": prompt, "first": first, "second": second,
                "label_first": self.labels[0], "label_second": self.labels[1]}


def load_constitution(spec: str) -> Constitution:
    """A constitution by name (a file in annotation/constitutions/) or path; validated."""
    path = Path(spec)
    if not path.suffix and not path.exists():
        path = CONSTITUTIONS / f"{spec}.toml"
    if not path.is_file():
        names = ", ".join(sorted(p.stem for p in CONSTITUTIONS.glob("*.toml")))
        raise ConstitutionError(f"{spec}:1: constitution: no such file; use a TOML path or one of {names}")
    raw = path.read_bytes()
    text = raw.decode("utf-8")
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        line = re.search(r"line (\d+)", str(exc))
        raise ConstitutionError(f"{path}:{line.group(1) if line else 1}: toml: {exc}") from None
    return _validate(path, text, data, hashlib.sha256(raw).hexdigest()[:8])


def _line_of(text: str, key: str, nth: int = 0) -> int:
    """1-based line where `key =` (or `[[key]]`) appears for the nth time; 1 when absent."""
    pattern = re.compile(rf"^[ \t]*(\[\[{re.escape(key)}\]\]|{re.escape(key)}\s*=)", re.M)
    hits = [text.count("\n", 0, m.start()) + 1 for m in pattern.finditer(text)]
    return hits[nth] if nth < len(hits) else (hits[-1] if hits else 1)


def _validate(path: Path, text: str, data: dict, sha8: str) -> Constitution:
    def fail(key: str, problem: str, nth: int = 0):
        raise ConstitutionError(f"{path}:{_line_of(text, key.split('.')[0], nth)}: {key}: {problem}")

    for key in REQUIRED_FIELDS:
        if key not in data:
            fail(key, "missing; a constitution needs name, version, template and [[principles]]")
    if not isinstance(data["name"], str) or not re.fullmatch(r"[A-Za-z0-9_.-]+", data["name"]):
        fail("name", "must be a word of letters, digits, '.', '_' or '-' (it goes into the rater id)")
    principles = data["principles"]
    if not isinstance(principles, list) or not principles:
        fail("principles", "empty; add at least one [[principles]] with a text")
    _check_template(data["template"], fail)
    seen, out = set(), []
    for i, item in enumerate(principles):
        body = item.get("text") if isinstance(item, dict) else None
        if not isinstance(body, str) or not body.strip():
            fail("principles.text", f"principle {i + 1} needs a non-empty text", i)
        weight = item.get("weight", 1.0)
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or weight <= 0:
            fail("principles.weight", f"principle {i + 1}: weight must be a positive number", i)
        if body.strip() in seen:
            fail("principles.text", f"principle {i + 1} repeats an earlier one", i)
        seen.add(body.strip())
        out.append(Principle(body.strip(), float(weight)))
    return Constitution(str(data["name"]), str(data["version"]), data["template"], out,
                        str(data.get("header", "")), str(path), sha8)


def _check_template(template, fail) -> None:
    if not isinstance(template, str) or not template.strip():
        fail("template", "must be a non-empty string")
    try:
        named = [f for _, f, _, _ in string.Formatter().parse(template) if f is not None]
    except ValueError as exc:
        fail("template", f"{exc}; write a literal brace as {{{{ or }}}}")
    unknown = sorted(set(named) - SLOTS)
    if unknown:
        fail("template", f"unknown slot {{{unknown[0]}}}; slots are {', '.join(sorted(SLOTS))}")
    missing = sorted(REQUIRED_SLOTS - set(named))
    if missing:
        fail("template", f"lacks the slot {{{missing[0]}}}")
    if named.count("principle") != 1:
        fail("template", "needs {principle} exactly once")


# --- which principle, which order ----------------------------------------------------------


@dataclass(frozen=True)
class Task:
    """One judge call: comparison index, presentation ('ab' or 'ba') and principle index."""

    comparison: int
    order: str
    principle: int


def plan(keys: list[str], constitution: Constitution, principles: str = "sample",
         seed: int = 0) -> list[Task]:
    """Both orders of every comparison, with one seeded principle per comparison (`sample`, as the
    Constitutional AI paper draws one) or every principle (`all`). The draw depends only on the seed
    and the comparison's key, so a rerun or a different --limit picks the same principle.

    >>> c = load_constitution("default")
    >>> [(t.order, t.principle) for t in plan(["k"], c, "all")][:3]
    [('ab', 0), ('ab', 1), ('ab', 2)]
    >>> len(plan(["k1", "k2"], c, "sample"))
    4
    """
    if principles not in ("sample", "all"):
        raise ValueError(f"--principles must be sample or all, got {principles!r}")
    n = len(constitution.principles)
    tasks = []
    for i, key in enumerate(keys):
        chosen = range(n) if principles == "all" else [_draw(key, seed, constitution)]
        tasks += [Task(i, order, p) for order in ("ab", "ba") for p in chosen]
    return tasks


def _draw(key: str, seed: int, constitution: Constitution) -> int:
    weights = [p.weight for p in constitution.principles]
    rng = random.Random(f"{seed}:{key}")
    return rng.choices(range(len(weights)), weights=weights)[0]


def weighted_mean(probs: list[float], weights: list[float]) -> float:
    """Σ w p / Σ w over the principles judged.

    >>> weighted_mean([0.9, 0.3], [1.0, 0.5])
    0.7
    """
    return round(sum(p * w for p, w in zip(probs, weights, strict=True)) / sum(weights), 12)


def order_probability(p_ab: float, p_ba: float) -> float:
    """P(a better) from both orders: the mean of P(first) as (a, b) and 1 − P(first) as (b, a)."""
    return (p_ab + (1.0 - p_ba)) / 2.0


def collapsed_verdict(p_ab: float, p_ba: float, margin: float = OPPOSITE_MARGIN) -> str:
    """The per-comparison verdict the store counts (schema.sql voices_in), from both orders.

    >>> collapsed_verdict(0.9, 0.8)  # the first-shown always wins: position bias, a tie
    'tie'
    >>> collapsed_verdict(0.9, 0.2), collapsed_verdict(0.3, 0.9)
    ('a', 'b')
    """
    p_lo_ab, p_lo_ba = p_ab, 1.0 - p_ba
    if max(p_lo_ab, p_lo_ba) > 0.5 + margin and min(p_lo_ab, p_lo_ba) < 0.5 - margin:
        return "tie"
    p = order_probability(p_ab, p_ba)
    return "a" if p > 0.5 + 1e-9 else "b" if p < 0.5 - 1e-9 else "tie"


# --- verdict rows ------------------------------------------------------------------------------


@dataclass
class Comparison:
    """A comparison as the store has it: the prompt (text, or messages when it came as a chat)."""

    prompt: str
    messages: list | None
    a: str
    b: str
    model_a: str | None = None
    model_b: str | None = None

    @property
    def key(self) -> str:
        return hashlib.sha256("\0".join([self.prompt, *sorted((self.a, self.b))]).encode()).hexdigest()


def verdict_row(c: Comparison, order: str, p_first: float, principles: list[str], rater: str) -> dict:
    """One raw judgment (ingest's `judgments` format) for one presentation order.

    >>> r = verdict_row(Comparison("q", None, "x", "y"), "ba", 0.25, ["Which is kinder?"], "ai:m:c@0")
    >>> (r["response_a"], r["winner"], r["strength"])
    ('y', 'b', 0.75)
    """
    first, second = (c.a, c.b) if order == "ab" else (c.b, c.a)
    model_first, model_second = (c.model_a, c.model_b) if order == "ab" else (c.model_b, c.model_a)
    winner = "a" if p_first > 0.5 else "b" if p_first < 0.5 else "tie"
    row = {"prompt": c.messages if c.messages else c.prompt, "response_a": first,
           "response_b": second, "winner": winner, "strength": round(max(p_first, 1 - p_first), 6),
           "rater": rater, "source": "rlaif",
           "rationale": f"principle: {' | '.join(principles)}; "
                        f"P(first)={p_first:.4f} P(second)={1 - p_first:.4f}"}
    if model_first or model_second:
        row["model_a"], row["model_b"] = model_first, model_second
    return row


def critique_prompt(prompt: str, response: str, principle: str) -> str:
    """Constitutional AI's supervised phase (§3): ask for a critique of `response` against a principle."""
    return (f"Conversation:\n{prompt}\n\nResponse:\n{response}\n\nCritique the response against this "
            f"principle: {principle}\nCritique:")


def revision_prompt(prompt: str, response: str, principle: str, critique: str) -> str:
    """...then ask for the response rewritten to answer the critique."""
    return (f"{critique_prompt(prompt, response, principle)} {critique.strip()}\n\n"
            "Rewrite the response so that it answers the critique.\nRevision:")
