"""Which pairs to send for labeling: each strategy orders candidate pairs, most useful first.

Candidates come as columns (annotation.label_studio.ledger.candidates: prompt_id, votes_a, votes_b, ties,
prompt_judgments); every strategy returns row indices into them. Ties between equally useful pairs
are broken by a seeded random draw, so a run is reproducible and no strategy favours store order.

- `uncertain`: the reward model is least sure, |σ(r_a − r_b) − ½| smallest (uncertainty sampling,
  Lewis & Gale 1994); the scores come from the caller (the CLI edge loads the model: annotation/
  imports nothing of rm/).
- `disagreement`: pairs whose votes are split so that one more vote changes or settles the majority
  (|votes_a − votes_b| ≤ 1 with at least one vote; ties count for neither side), the evenest and
  most-voted first.
- `coverage`: prompts with the fewest judgments first; a prompt's second pair counts as if the
  first had been judged, so a push spreads over prompts.
- `random`: the baseline.

    >>> cols = {"prompt_id": ["p", "p", "q"], "votes_a": [2, 1, 0], "votes_b": [0, 1, 0],
    ...         "ties": [0, 0, 0], "prompt_judgments": [3, 3, 0]}
    >>> disagreement(cols, rng=np.random.default_rng(0)).tolist()
    [1]
    >>> coverage(cols, rng=np.random.default_rng(0)).tolist()[0]
    2
    >>> uncertain(cols, scores_a=[0.0, 2.0, 0.3], scores_b=[3.0, 2.1, 0.0]).tolist()
    [1, 2, 0]
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np


def _column(cols, name: str) -> np.ndarray:
    value = cols[name]
    return np.asarray(value.to_pylist() if hasattr(value, "to_pylist") else value)


def _n(cols) -> int:
    return len(_column(cols, "prompt_id"))


def uncertain(cols, scores_a, scores_b, rng: np.random.Generator | None = None) -> np.ndarray:
    """Indices by |σ(r_a − r_b) − ½| ascending (the model's least sure first)."""
    margin = np.abs(1.0 / (1.0 + np.exp(-(np.asarray(scores_a) - np.asarray(scores_b)))) - 0.5)
    noise = (rng or np.random.default_rng(0)).random(len(margin))
    return np.lexsort((noise, margin))


def disagreement(cols, rng: np.random.Generator | None = None, **_) -> np.ndarray:
    """Indices of split pairs (|votes_a − votes_b| ≤ 1, at least one vote), evenest first."""
    a, b, ties = (_column(cols, k) for k in ("votes_a", "votes_b", "ties"))
    gap, n = np.abs(a - b), a + b + ties
    keep = np.flatnonzero((gap <= 1) & (n > 0))
    noise = (rng or np.random.default_rng(0)).random(len(keep))
    return keep[np.lexsort((noise, -n[keep], gap[keep]))]


def coverage(cols, rng: np.random.Generator | None = None, **_) -> np.ndarray:
    """Indices by (judgments of the prompt + pairs of it taken before), random within a level."""
    rng = rng or np.random.default_rng(0)
    prompts, seen = _column(cols, "prompt_id"), _column(cols, "prompt_judgments")
    order = rng.permutation(len(prompts))
    taken: dict = {}
    level = np.empty(len(prompts))
    for i in order:  # each prompt's pairs in random order: 0, 1, 2 ... more judgments
        level[i] = seen[i] + taken.get(prompts[i], 0)
        taken[prompts[i]] = taken.get(prompts[i], 0) + 1
    return order[np.argsort(level[order], kind="stable")]


def random(cols, rng: np.random.Generator | None = None, **_) -> np.ndarray:
    return (rng or np.random.default_rng(0)).permutation(_n(cols))


STRATEGIES: dict[str, Callable[..., np.ndarray]] = {
    "uncertain": uncertain, "disagreement": disagreement, "coverage": coverage, "random": random}


def select(strategy: str, cols, limit: int, seed: int = 0, scores=None) -> np.ndarray:
    """The first `limit` indices by `strategy`; `scores` = (r_a, r_b) arrays for `uncertain`."""
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown selection {strategy!r}; use {', '.join(STRATEGIES)}")
    rng = np.random.default_rng(seed)
    if strategy == "uncertain":
        if scores is None:
            raise ValueError("--select uncertain needs a reward model: pass --model ID (a model "
                             "id from the store or a model folder)")
        return uncertain(cols, *scores, rng=rng)[:limit]
    return STRATEGIES[strategy](cols, rng=rng)[:limit]
