"""Rater agreement on pairwise verdicts: do raters give the same verdict on the same item?

An item is (prompt, unordered pair of responses), every verdict in the item's orientation, in one of
three categories: first, second and tie (analysis.verdicts codes them).

A rater who judged one item more than once (typically an AI judge asked in both orders) is one
voice per item: the repeated verdicts collapse to their common category, or to a tie when they
disagree (MT-Bench's convention for position-inconsistent judges). Agreement statistics between
raters use these collapsed verdicts, so every pair of verdicts on an item is by different raters;
`position_consistency` reads the raw ones.

`analyze(table)` takes `Store.verdict_arrays()`, codes it (analysis.verdicts) and returns every
statistic; above it, one pure function per statistic on plain numpy arrays.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa

from analysis.verdicts import (
    HI,
    TIE,
    Verdicts,
    category_counts,
    collapse,
    verdict_items,
    wilson_interval,
)

MIN_OVERLAP = 10      # items two raters must share before their Cohen's kappa is reported
MAX_KAPPA_RATERS = 50  # Cohen's kappa is computed among this many of the busiest raters
FLAG_MARGIN = 0.10    # flagged: this far below the median rater's agreement, and its upper
FLAG_MIN_N = 10       # 95% bound below it too, over at least this many verdicts with a majority


# --- statistics on plain arrays ------------------------------------------------------------


def pairwise_agreement(counts: np.ndarray, ties: bool = True) -> tuple[float | None, int]:
    """Share of agreeing pairs among all unordered pairs of verdicts on the same item.

    agreement = Σ_i Σ_c C(n_ic, 2) / Σ_i C(n_i, 2), with n_ic the verdicts of category c on item i.
    Without ties, tie verdicts are dropped first (pairs where either verdict is a tie).
    Returns (agreement or None when there is no pair, number of pairs). The measure used by
    Zheng et al. 2023 (MT-Bench) for judge–human and human–human agreement.

    Item 1: first, first, second (3 pairs, 1 agrees); item 2: tie, first (1 pair, 0 agree).
    >>> counts = np.array([[2, 1, 0], [1, 0, 1]])
    >>> pairwise_agreement(counts), pairwise_agreement(counts, ties=False)
    ((0.25, 4), (0.3333333333333333, 3))
    """
    counts = np.asarray(counts, dtype=np.int64)
    if not ties:
        counts = counts[:, :2]
    pairs = int(np.sum(_choose2(counts.sum(axis=1))))
    agree = int(np.sum(_choose2(counts)))
    return (agree / pairs if pairs else None), pairs


def _choose2(n):
    return n * (n - 1) // 2


def cohen_kappa(confusion: np.ndarray) -> np.ndarray:
    """Cohen's kappa of one or many k×k confusion tables (..., k, k) between two raters.

    κ = (p_o − p_e) / (1 − p_e), p_o = Σ_c P_cc, p_e = Σ_c P_c· P_·c (Cohen 1960,
    "A coefficient of agreement for nominal scales"). NaN where p_e = 1 (both raters constant).

    20 items: both say first 8 times, both second 6, they differ 6 times (4 and 2):
    p_o = 0.7, p_e = 0.6·0.5 + 0.4·0.5 = 0.5, κ = 0.4.
    >>> round(float(cohen_kappa(np.array([[8, 4], [2, 6]]))), 12)
    0.4
    """
    table = np.asarray(confusion, dtype=float)
    total = table.sum(axis=(-2, -1), keepdims=True)
    p = table / total
    p_o = np.trace(p, axis1=-2, axis2=-1)
    p_e = np.sum(p.sum(axis=-1) * p.sum(axis=-2), axis=-1)
    with np.errstate(divide="ignore", invalid="ignore"):
        return (p_o - p_e) / (1.0 - p_e)


def fleiss_kappa(counts: np.ndarray) -> float:
    """Fleiss' kappa for N items each rated by the same number m of raters into k categories.

    P_i = (Σ_c n_ic² − m) / (m(m−1)), P̄ = mean P_i, p_c = Σ_i n_ic / (N m), P̄_e = Σ_c p_c²,
    κ = (P̄ − P̄_e) / (1 − P̄_e)  (Fleiss 1971, "Measuring nominal scale agreement among many raters").

    Two items, three raters: (3, 0) and (1, 2): P = (1, 1/3), P̄ = 2/3, p = (2/3, 1/3),
    P̄_e = 5/9, κ = (2/3 − 5/9) / (4/9) = 0.25.
    >>> round(fleiss_kappa(np.array([[3, 0], [1, 2]])), 12)
    0.25
    """
    counts = np.asarray(counts, dtype=float)
    m = counts.sum(axis=1)
    if len(counts) == 0 or np.any(m != m[0]) or m[0] < 2:
        raise ValueError("Fleiss' kappa needs every item rated by the same number (>= 2) of raters; "
                         "select items with equal counts first")
    m = m[0]
    p_item = (np.sum(counts**2, axis=1) - m) / (m * (m - 1))
    p_cat = counts.sum(axis=0) / counts.sum()
    p_e = np.sum(p_cat**2)
    return float((p_item.mean() - p_e) / (1 - p_e)) if p_e < 1 else float("nan")


def krippendorff_alpha(counts: np.ndarray) -> float | None:
    """Krippendorff's alpha, nominal, from an (items × categories) count matrix; items with fewer
    than two values are not pairable and are dropped. Computed by the `krippendorff` package.

    α = 1 − D_o / D_e from the coincidence matrix (Krippendorff 2011, "Computing Krippendorff's
    alpha-reliability"). None when undefined (no pairable item, or a single category overall).

    Item 1: first, first; item 2: first, second. D_o = 2/4, D_e = 2·3·1/(4·3), α = 0.
    >>> krippendorff_alpha(np.array([[2, 0, 0], [1, 1, 0]]))
    0.0
    """
    import krippendorff

    counts = np.asarray(counts)
    counts = counts[counts.sum(axis=1) >= 2]
    if len(counts) == 0 or np.count_nonzero(counts.sum(axis=0)) < 2:
        return None
    value = float(krippendorff.alpha(value_counts=counts, level_of_measurement="nominal"))
    return value if np.isfinite(value) else None


def leave_one_out_majority(counts: np.ndarray, item: np.ndarray, category: np.ndarray) -> tuple:
    """For each verdict, the majority category of the other verdicts on its item.

    Returns (has_majority, agrees): has_majority is False when no other verdict exists or the
    others split evenly between their top categories; agrees says the verdict matched it.

    Item counts (lo, hi, tie) = (2, 1, 0). The 'hi' verdict sees (2, 0, 0): disagrees;
    a 'lo' verdict sees (1, 1, 0): no majority.
    >>> has, agrees = leave_one_out_majority(np.array([[2, 1, 0]]), np.array([0, 0]), np.array([1, 0]))
    >>> has.tolist(), agrees.tolist()
    ([True, False], [False, False])
    """
    others = np.asarray(counts)[item].copy()
    others[np.arange(len(item)), category] -= 1
    top = others.max(axis=1)
    unique = np.sum(others == top[:, None], axis=1) == 1
    has = unique & (top > 0)
    return has, has & (others.argmax(axis=1) == category)


def matched_agreement(cat_x: np.ndarray, cat_y: np.ndarray) -> dict:
    """Agreement of matched verdict pairs: {with_ties, without_ties, n, n_without_ties}.

    with_ties = mean(x == y); without_ties = the same over pairs where neither is a tie.
    >>> matched_agreement(np.array([0, 1, 2, 0]), np.array([0, 0, 2, 2]))
    {'with_ties': 0.5, 'without_ties': 0.5, 'n': 4, 'n_without_ties': 2}
    """
    same = np.asarray(cat_x) == np.asarray(cat_y)
    strict = (np.asarray(cat_x) != TIE) & (np.asarray(cat_y) != TIE)
    return {"with_ties": _share(same.sum(), len(same)),
            "without_ties": _share((same & strict).sum(), strict.sum()),
            "n": int(len(same)), "n_without_ties": int(strict.sum())}


def _share(k, n) -> float | None:
    return float(k) / float(n) if n else None


# --- the whole analysis --------------------------------------------------------------------


def analyze(table: pa.Table, min_overlap: int = MIN_OVERLAP) -> dict:
    """Every agreement statistic of a `Store.verdict_arrays()` table, as JSON-ready values.

    Statistics that need two verdicts on an item are None (with n = 0) when no item has two.
    """
    v = verdict_items(table)
    item, rater, cat = collapse(v.item, v.rater, v.category)
    counts = category_counts(item, cat, v.n_items)
    with_ties, n_pairs = pairwise_agreement(counts)
    without_ties, n_pairs_strict = pairwise_agreement(counts, ties=False)
    return {
        "n_judgments": int(len(v.item)),
        "n_items": v.n_items,
        "n_items_multi": int(np.sum(counts.sum(axis=1) >= 2)),
        "n_raters": int(len(v.rater_names)),
        "pairwise_with_ties": with_ties,
        "pairwise_without_ties": without_ties,
        "n_pairs": n_pairs,
        "n_pairs_without_ties": n_pairs_strict,
        "cohen_kappa": rater_pair_kappas(item, rater, cat, v.rater_names, min_overlap),
        "fleiss_kappa": _fleiss_where_it_applies(counts),
        "krippendorff_alpha": krippendorff_alpha(counts),
        **_per_rater(counts, item, rater, cat, v.rater_names),
        "human_ai": _human_ai(item, rater, cat, v.rater_names),
        "position_consistency": _position_consistency(v),
    }


def rater_pair_kappas(item, rater, cat, rater_names, min_overlap: int = MIN_OVERLAP) -> list:
    """Cohen's kappa for every pair of raters who share at least `min_overlap` items, among the
    MAX_KAPPA_RATERS busiest raters (so the pairing join stays linear in the items), from the
    collapsed verdicts; a list of {rater_1, rater_2, n, agreement, kappa} sorted by rater ids."""
    load = np.bincount(rater, minlength=len(rater_names))
    busy = np.zeros(len(load), dtype=bool)
    busy[np.argsort(-load, kind="stable")[:MAX_KAPPA_RATERS]] = True
    busy &= load >= min_overlap
    frame = pd.DataFrame({"item": item, "rater": rater, "cat": cat})[busy[rater]]
    pairs = frame.merge(frame, on="item", suffixes=("_1", "_2"))
    pairs = pairs[pairs["rater_1"] < pairs["rater_2"]]
    if pairs.empty:
        return []
    pair, uniques = pd.factorize(pairs["rater_1"].to_numpy() * len(rater_names)
                                 + pairs["rater_2"].to_numpy(), sort=True)
    cells = pair * 9 + pairs["cat_1"].to_numpy() * 3 + pairs["cat_2"].to_numpy()
    confusion = np.bincount(cells, minlength=len(uniques) * 9).reshape(-1, 3, 3)
    n = confusion.sum(axis=(1, 2))
    keep = n >= min_overlap
    kappas = cohen_kappa(confusion[keep])
    agreement = np.trace(confusion[keep], axis1=1, axis2=2) / n[keep]
    r1, r2 = np.divmod(np.asarray(uniques)[keep], len(rater_names))
    return [{"rater_1": rater_names[a], "rater_2": rater_names[b], "n": int(m),
             "agreement": float(g), "kappa": _finite(k)}
            for a, b, m, g, k in zip(r1, r2, n[keep], agreement, kappas, strict=True)]


def _fleiss_where_it_applies(counts: np.ndarray) -> dict | None:
    """Fleiss needs a constant number of ratings: use the most common count among items with 2+."""
    m = counts.sum(axis=1)
    multi = m[m >= 2]
    if len(multi) == 0:
        return None
    sizes, freq = np.unique(multi, return_counts=True)
    size = int(sizes[np.argmax(freq)])
    return {"kappa": _finite(fleiss_kappa(counts[m == size])), "raters_per_item": size,
            "n_items": int(freq.max())}


def _per_rater(counts, item, rater, cat, rater_names) -> dict:
    has, agrees = leave_one_out_majority(counts, item, cat)
    n = np.bincount(rater, weights=has, minlength=len(rater_names))
    k = np.bincount(rater, weights=agrees, minlength=len(rater_names))
    low, high = wilson_interval(k, n)
    share = k / np.maximum(n, 1)
    flagged = np.zeros(len(n), dtype=bool)
    eligible = n >= FLAG_MIN_N
    if eligible.sum() >= 3:
        # The median rater, not the pooled rest: an adversary must not drag the reference down.
        typical = np.median(share[eligible])
        flagged = eligible & (high < typical) & (share < typical - FLAG_MARGIN)
    per_rater = {rater_names[r]: {"n": int(n[r]), "agreement": _share(k[r], n[r]),
                                  "low": _finite(low[r]), "high": _finite(high[r]),
                                  "flagged": bool(flagged[r])}
                 for r in np.flatnonzero(n > 0)}
    return {"per_rater": per_rater, "flagged_raters": [rater_names[r] for r in np.flatnonzero(flagged)],
            "loo_agreement": _share(k.sum(), n.sum())}


def _is_kind(rater_names: np.ndarray, prefix: str) -> np.ndarray:
    return np.array([str(name).startswith(prefix) for name in rater_names], dtype=bool)


def _human_ai(item, rater, cat, rater_names) -> dict:
    human, ai = _is_kind(rater_names, "human:"), _is_kind(rater_names, "ai:")
    humans = pd.DataFrame({"item": item[human[rater]], "cat_h": cat[human[rater]]})
    judges = pd.DataFrame({"item": item[ai[rater]], "ai": rater[ai[rater]], "cat_ai": cat[ai[rater]]})
    matched = humans.merge(judges, on="item")
    return {rater_names[r]: matched_agreement(group["cat_h"].to_numpy(), group["cat_ai"].to_numpy())
            for r, group in matched.groupby("ai", sort=True)}


def _position_consistency(v: Verdicts) -> dict:
    """Per AI rater, over items it judged in both orders: the share whose (oriented) verdict did
    not change with the order, and how often the response shown first won (1/2 = no position bias)."""
    ai = _is_kind(v.rater_names, "ai:")[v.rater]
    frame = pd.DataFrame({"item": v.item[ai], "rater": v.rater[ai], "swapped": v.swapped[ai],
                          "cat": v.category[ai]})
    both = frame.groupby(["item", "rater"])["swapped"].transform("nunique") == 2
    frame = frame[both]
    shown_first_won = (frame["cat"] != TIE) & ((frame["cat"] == HI) == frame["swapped"])
    frame = frame.assign(decided=frame["cat"] != TIE, shown_first_won=shown_first_won)
    result = {}
    for r, group in frame.groupby("rater", sort=True):
        order = collapse(*(group[c].to_numpy() for c in ("item", "swapped", "cat")))
        as_shown, reversed_ = order[2][~order[1]], order[2][order[1]]
        result[v.rater_names[r]] = {
            "consistency": _share(np.sum(as_shown == reversed_), len(as_shown)),
            "n": int(len(as_shown)),
            "first_shown_win_rate": _share(group["shown_first_won"].sum(), group["decided"].sum())}
    return result


def _finite(x) -> float | None:
    x = float(x)
    return x if np.isfinite(x) else None
