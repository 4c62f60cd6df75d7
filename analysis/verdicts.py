"""Verdicts coded for the statistics: `Store.verdict_arrays()` → integer arrays, one row per verdict.

An item is (prompt, unordered pair of responses). Every verdict is put in the item's orientation
(the response with the smaller id is "first"), so 'a' on (x, y) and 'b' on (y, x) are the same
verdict; categories are FIRST, SECOND and TIE. analysis.agreement and analysis.cycles both start
from these codes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

CATEGORIES = ("first", "second", "tie")
FIRST, SECOND, TIE = 0, 1, 2
REQUIRED_COLUMNS = ("prompt_id", "response_a", "response_b", "winner", "rater")
WINNER_CODES = {"a": FIRST, "b": SECOND, "tie": TIE}


class VerdictTableError(ValueError):
    """The verdict table cannot be analysed as given; the message says what to fix."""


@dataclass(frozen=True)
class Verdicts:
    """Integer-coded verdicts. Per verdict: prompt, item, rater, category, swapped (response_a was
    the item's second response). Per item: item_prompt, item_first, item_second (response codes)."""

    prompt: np.ndarray
    item: np.ndarray
    rater: np.ndarray
    category: np.ndarray
    swapped: np.ndarray
    item_prompt: np.ndarray
    item_first: np.ndarray
    item_second: np.ndarray
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
    winner = _winner_codes(table["winner"])
    category = np.where(winner == TIE, TIE, np.where(swapped, 1 - winner, winner)).astype(np.int8)
    first, second = np.minimum(code_a, code_b), np.maximum(code_a, code_b)
    pair = pd.factorize(first * len(response_names) + second)[0]
    item, _ = pd.factorize(prompt * (int(pair.max(initial=0)) + 1) + pair)
    at = _first_occurrence(item)
    return Verdicts(prompt, item, rater, category, swapped, prompt[at], first[at], second[at],
                    prompt_names, response_names, rater_names)


def _sorted_codes(column) -> tuple[np.ndarray, np.ndarray]:
    column = column.cast(pa.string())  # also undoes dictionary encoding and large_string
    uniques = pc.unique(column)
    uniques = uniques.take(pc.sort_indices(uniques))
    codes = pc.index_in(column, value_set=uniques)
    return codes.to_numpy().astype(np.int64), np.asarray(uniques.to_pylist(), dtype=object)


def _winner_codes(column) -> np.ndarray:
    values, names = _sorted_codes(column)
    bad = [str(n) for n in names if n not in WINNER_CODES]
    if bad:
        raise VerdictTableError(f"winner must be 'a', 'b' or 'tie', got {bad[:5]}; fix those rows")
    return np.array([WINNER_CODES[n] for n in names], dtype=np.int8)[values]


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
