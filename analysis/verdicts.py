"""Verdicts coded for the statistics: `Store.verdict_arrays()` → integer arrays, one row per verdict,
and the two small tools every statistic shares (`winner_codes`, `wilson_interval`).

Two orders, two vocabularies (docs/design.md: Vocabulary). `a`/`b` are the order a rater was shown
(`winner_codes`: A, B, TIE). An item is (prompt, unordered pair of responses), taken in canonical
order: `lo` is the response with the smaller id, `hi` the larger; every verdict is put in that
orientation, so 'a' on (x, y) and 'b' on (y, x) are the same verdict, category LO (x < y).
Categories are LO, HI and TIE. analysis.agreement and analysis.cycles both start from these codes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

CATEGORIES = ("lo", "hi", "tie")
LO, HI, TIE = 0, 1, 2
WINNERS = ("a", "b", "tie")  # a rater's raw verdict, in the order shown: codes A, B, TIE
A, B = 0, 1
REQUIRED_COLUMNS = ("prompt_id", "response_a", "response_b", "winner", "rater")
Z95 = 1.959963984540054


class VerdictTableError(ValueError):
    """The verdict table cannot be analysed as given; the message says what to fix."""


@dataclass(frozen=True)
class Verdicts:
    """Integer-coded verdicts. Per verdict: prompt, item, rater, category (LO, HI, TIE), swapped
    (response_a was the item's `hi` response). Per item: item_prompt, item_lo, item_hi (response
    codes)."""

    prompt: np.ndarray
    item: np.ndarray
    rater: np.ndarray
    category: np.ndarray
    swapped: np.ndarray
    item_prompt: np.ndarray
    item_lo: np.ndarray
    item_hi: np.ndarray
    prompt_names: np.ndarray
    response_names: np.ndarray
    rater_names: np.ndarray

    @property
    def n_items(self) -> int:
        return len(self.item_prompt)


# --- from the store's table to coded verdicts ------------------------------------------------


def verdict_items(table: pa.Table) -> Verdicts:
    """Code a `Store.verdict_arrays()` table: ids become sorted integer codes, verdicts are oriented.

    >>> t = pa.table({"prompt_id": ["p", "p"], "response_a": ["x", "y"], "response_b": ["y", "x"],
    ...               "winner": ["a", "b"], "rater": ["human:1", "human:2"]})
    >>> v = verdict_items(t)
    >>> v.n_items, v.category.tolist(), v.swapped.tolist()
    (1, [0, 0], [False, True])
    """
    missing = [c for c in REQUIRED_COLUMNS if c not in table.column_names]
    if missing:
        raise VerdictTableError(f"verdict table lacks columns {missing}; pass Store.verdict_arrays()")
    for name in REQUIRED_COLUMNS:
        if table[name].null_count:
            raise VerdictTableError(f"column {name!r} has {table[name].null_count} nulls; "
                                    "every verdict needs a prompt, two responses, a winner and a rater")
    prompt, prompt_names = _sorted_codes(table["prompt_id"])
    rater, rater_names = _sorted_codes(table["rater"])
    both = pa.chunked_array(table["response_a"].cast(pa.string()).chunks
                            + table["response_b"].cast(pa.string()).chunks, pa.string())
    codes, response_names = _sorted_codes(both)
    code_a, code_b = codes[:table.num_rows], codes[table.num_rows:]
    if np.any(code_a == code_b):
        raise VerdictTableError(f"{int(np.sum(code_a == code_b))} verdicts compare a response with "
                                "itself; drop them (response_a must differ from response_b)")
    swapped = code_a > code_b
    winner = winner_codes(table["winner"])
    category = np.where(winner == TIE, TIE, np.where(swapped, 1 - winner, winner)).astype(np.int8)
    lo, hi = np.minimum(code_a, code_b), np.maximum(code_a, code_b)
    pair = pd.factorize(lo * len(response_names) + hi)[0]
    item, _ = pd.factorize(prompt * (int(pair.max(initial=0)) + 1) + pair)
    at = _first_occurrence(item)
    return Verdicts(prompt, item, rater, category, swapped, prompt[at], lo[at], hi[at],
                    prompt_names, response_names, rater_names)


def coded_verdicts(prompt, lo, hi, rater, winner, swapped, rater_names) -> Verdicts:
    """Verdicts from store codes sorted by item (annotation.verdict_codes streams them so): prompts
    are numbered from 0 within these verdicts in code order, responses in order of appearance,
    and `prompt_names` and `response_names` hold their store codes; raters keep the store's codes
    and names. Items are numbered in order, so the verdicts need no sorting or hashing but the
    responses'.

    >>> v = coded_verdicts(*(np.array(x) for x in ([7, 7, 9], [3, 3, 3], [5, 5, 4], [0, 1, 0],
    ...                                             [0, 2, 1], [False, True, False])), ["h:1", "h:2"])
    >>> v.item.tolist(), v.category.tolist(), v.item_lo.tolist(), v.response_names.tolist()
    ([0, 0, 1], [0, 2, 1], [0, 0], [3, 5, 4])
    """
    new_prompt = np.ones(len(prompt), dtype=bool)
    new_prompt[1:] = prompt[1:] != prompt[:-1]
    new_item = new_prompt.copy()
    new_item[1:] |= (lo[1:] != lo[:-1]) | (hi[1:] != hi[:-1])
    item, starts = np.cumsum(new_item) - 1, np.flatnonzero(new_item)
    prompt_local, prompt_codes = np.cumsum(new_prompt) - 1, prompt[new_prompt]
    response_local, response_codes = pd.factorize(np.concatenate([lo[starts], hi[starts]]))
    lo_local, hi_local = response_local[:len(starts)], response_local[len(starts):]
    category = np.where(winner == TIE, TIE, np.where(swapped, 1 - winner, winner)).astype(np.int8)
    return Verdicts(prompt_local, item, np.asarray(rater, dtype=np.int64), category,
                    np.asarray(swapped, dtype=bool), prompt_local[starts], lo_local, hi_local,
                    prompt_codes, np.asarray(response_codes), np.asarray(rater_names, dtype=object))


def _sorted_codes(column) -> tuple[np.ndarray, np.ndarray]:
    column = column.cast(pa.string())  # also undoes dictionary encoding and large_string
    uniques = pc.unique(column)
    uniques = uniques.take(pc.sort_indices(uniques))
    codes = pc.index_in(column, value_set=uniques)
    return codes.to_numpy().astype(np.int64), np.asarray(uniques.to_pylist(), dtype=object)


def winner_codes(winner) -> np.ndarray:
    """The one winner decoder: 'a' → A (0), 'b' → B (1), 'tie' → TIE (2); integer codes pass
    through; anything else (or a null) is a VerdictTableError that names the values.

    >>> winner_codes(["a", "tie", "b"]).tolist()
    [0, 2, 1]
    >>> winner_codes(["a", "x"])
    Traceback (most recent call last):
    ...
    analysis.verdicts.VerdictTableError: winner must be 'a', 'b' or 'tie', got ['x']; fix those rows
    """
    if isinstance(winner, np.ndarray) and winner.dtype.kind in "iu":
        return winner
    column = winner if isinstance(winner, pa.Array | pa.ChunkedArray) else pa.array(
        np.asarray(winner, dtype=object), pa.string())
    codes = pc.index_in(column.cast(pa.string()), value_set=pa.array(WINNERS, pa.string()))
    if codes.null_count:
        bad = pc.unique(pc.filter(column, pc.is_null(codes))).to_pylist()
        raise VerdictTableError(f"winner must be 'a', 'b' or 'tie', got {bad[:5]}; fix those rows")
    return np.asarray(codes.to_numpy(zero_copy_only=False), dtype=np.int8)


def wilson_interval(k, n, z: float = Z95):
    """The one Wilson score interval for a binomial share k/n (Wilson, JASA 1927), for numbers or
    arrays alike; n = 0 gives (0, 1), and the bounds are clipped to [0, 1] against rounding:

        centre = (p + z²/2n) / (1 + z²/n),  half = z / (1 + z²/n) · √(p(1−p)/n + z²/4n²)

    8 successes out of 10 (by hand: p = 0.8, z² = 3.8415, centre 0.7167, half 0.2266):

    >>> [round(float(x), 4) for x in wilson_interval(8, 10)]
    [0.4902, 0.9433]
    >>> wilson_interval(0, 0)
    (0.0, 1.0)
    >>> [x.round(4).tolist() for x in wilson_interval(np.array([8, 0]), np.array([10, 0]))]
    [[0.4902, 0.0], [0.9433, 1.0]]
    """
    n = np.asarray(n, dtype=float)
    safe = np.maximum(n, 1.0)
    p = np.asarray(k, dtype=float) / safe
    denom = 1.0 + z * z / safe
    centre = (p + z * z / (2 * safe)) / denom
    half = z / denom * np.sqrt(p * (1 - p) / safe + z * z / (4 * safe * safe))
    low = np.where(n > 0, np.clip(centre - half, 0.0, 1.0), 0.0)
    high = np.where(n > 0, np.clip(centre + half, 0.0, 1.0), 1.0)
    if low.ndim == 0:
        return float(low), float(high)
    return low, high


def _first_occurrence(codes: np.ndarray) -> np.ndarray:
    at = np.empty(int(codes.max(initial=-1)) + 1, dtype=np.int64)
    at[codes[::-1]] = np.arange(len(codes) - 1, -1, -1)
    return at


def collapse(item: np.ndarray, rater: np.ndarray, category: np.ndarray) -> tuple:
    """One verdict per (item, rater): the common category, or tie when the rater disagreed with
    itself. Returns (item, rater, category) arrays.

    >>> [a.tolist() for a in collapse(np.array([0, 0, 0]), np.array([5, 5, 6]), np.array([0, 1, 1]))]
    [[0, 0], [5, 6], [2, 1]]
    """
    frame = pd.DataFrame({"item": item, "rater": rater, "category": category})
    grouped = frame.groupby(["item", "rater"], sort=True)["category"].agg(["min", "max"])
    cat = np.where(grouped["min"] == grouped["max"], grouped["min"], TIE).astype(np.int8)
    return (grouped.index.get_level_values(0).to_numpy(),
            grouped.index.get_level_values(1).to_numpy(), cat)


def category_counts(item: np.ndarray, category: np.ndarray, n_items: int) -> np.ndarray:
    """(n_items, 3) matrix: how many verdicts of each category each item received."""
    flat = np.bincount(item * 3 + category, minlength=n_items * 3)
    return flat.reshape(n_items, 3)


def distinct_rows(counts: np.ndarray, weights: np.ndarray | None = None) -> tuple:
    """The distinct rows of an (items × 3) count matrix, sorted, and the summed weights of each
    (by default how often each occurs); rows are keyed as one integer, not sorted as rows.

    >>> rows, n = distinct_rows(np.array([[2, 0, 1], [0, 1, 0], [2, 0, 1]]))
    >>> rows.tolist(), n.tolist()
    ([[0, 1, 0], [2, 0, 1]], [1, 2])
    """
    counts = np.asarray(counts, dtype=np.int64).reshape(-1, 3)
    base = int(counts.max(initial=0)) + 1
    keys, where = np.unique((counts[:, 0] * base + counts[:, 1]) * base + counts[:, 2],
                            return_inverse=True)
    weights = np.ones(len(counts), dtype=np.int64) if weights is None else weights
    rows = np.column_stack([keys // (base * base), keys // base % base, keys % base])
    return rows, np.bincount(where.ravel(), weights, len(keys)).astype(np.int64)
