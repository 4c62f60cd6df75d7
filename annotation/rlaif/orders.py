"""RLAIF's both-order bookkeeping: which principle judges which comparison in which presentation
order, how a judge's probabilities for the two orders combine, and the judgment rows they become;
and Constitutional AI's critique and revision prompts. Text and numbers only, like
annotation/rlaif/constitution.py, whose constitutions it reads.

Every comparison is judged in both orders, (a, b) and (b, a): LLM judges prefer whatever is shown
first (Zheng et al. 2023, MT-Bench, §3.3). Each order is one raw judgment with `strength` =
P(winner better); the store's `voices_in` macro then counts the rater once per comparison.

    >>> order_probability(0.8, 0.3)  # P(a better): a shown first 0.8; b shown first 0.3
    0.75
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass

from annotation.rlaif.constitution import Constitution

OPPOSITE_MARGIN = 0.1  # both orders this far from 1/2 on opposite sides: position bias, a tie


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

    >>> from annotation.rlaif.constitution import load_constitution
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


def collapsed_winner(p_ab: float, p_ba: float, margin: float = OPPOSITE_MARGIN) -> str:
    """The per-comparison winner ('a', 'b' or 'tie') the store counts (schema.sql voices_in), from
    both orders.

    >>> collapsed_winner(0.9, 0.8)  # the first-shown always wins: position bias, a tie
    'tie'
    >>> collapsed_winner(0.9, 0.2), collapsed_winner(0.3, 0.9)
    ('a', 'b')
    """
    p_lo_ab, p_lo_ba = p_ab, 1.0 - p_ba
    if max(p_lo_ab, p_lo_ba) > 0.5 + margin and min(p_lo_ab, p_lo_ba) < 0.5 - margin:
        return "tie"
    p = order_probability(p_ab, p_ba)
    return "a" if p > 0.5 + 1e-9 else "b" if p < 0.5 - 1e-9 else "tie"


# --- judgment rows -----------------------------------------------------------------------------


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


def judgment_row(c: Comparison, order: str, p_first: float, principles: list[str], rater: str) -> dict:
    """One raw judgment (ingest's `judgments` format) for one presentation order.

    >>> r = judgment_row(Comparison("q", None, "x", "y"), "ba", 0.25, ["Which is kinder?"], "ai:m:c@0")
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
