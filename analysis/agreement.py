"""Rater agreement on pairwise verdicts: do raters give the same verdict on the same item?

An item is (prompt, unordered pair of responses), every verdict in the item's orientation, in one of
three categories: first, second and tie (analysis.verdicts codes them).

A rater who judged one item more than once (typically an AI judge asked in both orders) is one
voice per item: the repeated verdicts collapse to their common category, or to a tie when they
disagree (MT-Bench's convention for position-inconsistent judges). Agreement statistics between
raters use these collapsed verdicts, so every pair of verdicts on an item is by different raters;
`position_consistency` reads the raw ones.

`analyze(table)` takes `Store.verdict_arrays()`, codes it (analysis.verdicts) and returns every
statistic; above it, one pure function per statistic on plain numpy arrays. Every statistic is a
function of counts that add up over items, so `analyze` is `block_counts` of all items, then
`finish`; the report adds up blocks of prompts instead (analysis/store_analyses.py).
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
    distinct_rows,
    verdict_items,
    wilson_interval,
)

MIN_OVERLAP = 10      # items two raters must share before their Cohen's kappa is reported
MAX_KAPPA_RATERS = 50  # Cohen's kappa is computed among this many of the busiest raters
FLAG_MARGIN = 0.10    # flagged: this far below the median rater's agreement, and its upper
FLAG_MIN_N = 10       # 95% bound below it too, over at least this many verdicts with a majority


# --- statistics on plain arrays ------------------------------------------------------------


def pairwise_agreement(counts: np.ndarray, ties: bool = True,
                       weights: np.ndarray | None = None) -> tuple[float | None, int]:
    """Share of agreeing pairs among all unordered pairs of verdicts on the same item.

    agreement = Σ_i Σ_c C(n_ic, 2) / Σ_i C(n_i, 2), with n_ic the verdicts of category c on item i.
    Without ties, tie verdicts are dropped first (pairs where either verdict is a tie).
    Returns (agreement or None when there is no pair, number of pairs). The measure used by
    Zheng et al. 2023 (MT-Bench) for judge–human and human–human agreement. `weights`: how many
    items each row of counts stands for (default one each).

    Item 1: first, first, second (3 pairs, 1 agrees); item 2: tie, first (1 pair, 0 agree).
    >>> counts = np.array([[2, 1, 0], [1, 0, 1]])
    >>> pairwise_agreement(counts), pairwise_agreement(counts, ties=False)
    ((0.25, 4), (0.3333333333333333, 3))
    """
    counts = np.asarray(counts, dtype=np.int64)
    weights = _ones_or(weights, len(counts))
    if not ties:
        counts = counts[:, :2]
    pairs = int(np.sum(weights * _choose2(counts.sum(axis=1))))
    agree = int(np.sum(weights[:, None] * _choose2(counts)))
    return (agree / pairs if pairs else None), pairs


def _ones_or(weights, n: int) -> np.ndarray:
    return np.ones(n, dtype=np.int64) if weights is None else np.asarray(weights, dtype=np.int64)


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


def fleiss_kappa(counts: np.ndarray, weights: np.ndarray | None = None) -> float:
    """Fleiss' kappa for N items each rated by the same number m of raters into k categories.

    P_i = (Σ_c n_ic² − m) / (m(m−1)), P̄ = mean P_i, p_c = Σ_i n_ic / (N m), P̄_e = Σ_c p_c²,
    κ = (P̄ − P̄_e) / (1 − P̄_e)  (Fleiss 1971, "Measuring nominal scale agreement among many raters").
    `weights`: how many items each row stands for (default one each).

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
    weights = _ones_or(weights, len(counts)).astype(float)
    p_item = (np.sum(counts**2, axis=1) - m) / (m * (m - 1))
    p_cat = weights @ counts / (weights.sum() * m)
    p_e = np.sum(p_cat**2)
    return float((weights @ p_item / weights.sum() - p_e) / (1 - p_e)) if p_e < 1 else float("nan")


def krippendorff_alpha(counts: np.ndarray, weights: np.ndarray | None = None) -> float | None:
    """Krippendorff's alpha, nominal, from an (items × categories) count matrix; items with fewer
    than two values are not pairable and are dropped. `weights`: how many items each row stands
    for (default one each), so items with the same counts can come as one row.

    α = 1 − D_o / D_e from the coincidence matrix o_ck = Σ_u (n_uc n_uk − [c = k] n_uc) / (m_u − 1),
    D_o ∝ Σ_{c≠k} o_ck, D_e ∝ Σ_{c≠k} n_c n_k / (n − 1) (Krippendorff 2011, "Computing
    Krippendorff's alpha-reliability"; the `krippendorff` package computes the same). None when
    undefined (no pairable item, or a single category overall).

    Item 1: first, first; item 2: first, second. D_o = 2/4, D_e = 2·3·1/(4·3), α = 0.
    >>> krippendorff_alpha(np.array([[2, 0, 0], [1, 1, 0]]))
    0.0
    >>> one_row_each = krippendorff_alpha(np.array([[2, 0, 0]] * 3 + [[1, 1, 0]]))
    >>> krippendorff_alpha(np.array([[2, 0, 0], [1, 1, 0]]), weights=np.array([3, 1])) == one_row_each
    True
    """
    counts = np.asarray(counts, dtype=float)
    weights = _ones_or(weights, len(counts)).astype(float)
    m = counts.sum(axis=1)
    pairable = m >= 2
    counts, weights, m = counts[pairable], weights[pairable], m[pairable]
    if len(counts) == 0 or np.count_nonzero(weights @ counts) < 2:
        return None
    scaled = counts * (weights / (m - 1))[:, None]
    coincidences = scaled.T @ counts - np.diag(scaled.sum(axis=0))
    n_c = coincidences.sum(axis=0)
    expected = (np.outer(n_c, n_c) - np.diag(n_c)) / (n_c.sum() - 1)
    different = 1 - np.eye(len(n_c))
    with np.errstate(divide="ignore", invalid="ignore"):
        value = 1 - np.sum(coincidences * different) / np.sum(expected * different)
    return float(value) if np.isfinite(value) else None


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
    cells = np.asarray(cat_x, dtype=np.int64) * 3 + np.asarray(cat_y, dtype=np.int64)
    return confusion_agreement(np.bincount(cells, minlength=9).reshape(3, 3))


def confusion_agreement(confusion: np.ndarray) -> dict:
    """`matched_agreement` from the 3×3 counts of matched pairs by (category x, category y).

    >>> confusion_agreement(np.array([[1, 0, 1], [1, 0, 0], [0, 0, 1]]))
    {'with_ties': 0.5, 'without_ties': 0.5, 'n': 4, 'n_without_ties': 2}
    """
    strict = confusion[:TIE, :TIE]
    return {"with_ties": _share(np.trace(confusion), confusion.sum()),
            "without_ties": _share(np.trace(strict), strict.sum()),
            "n": int(confusion.sum()), "n_without_ties": int(strict.sum())}


def _share(k, n) -> float | None:
    return float(k) / float(n) if n else None


# --- the whole analysis --------------------------------------------------------------------


def analyze(table: pa.Table, min_overlap: int = MIN_OVERLAP) -> dict:
    """Every agreement statistic of a `Store.verdict_arrays()` table, as JSON-ready values.

    Statistics that need two verdicts on an item are None (with n = 0) when no item has two.
    """
    v = verdict_items(table)
    voices = collapse(v.item, v.rater, v.category)[1]
    busy = busiest_raters(np.bincount(voices, minlength=len(v.rater_names)), min_overlap)
    return finish(block_counts(v, busy), v.rater_names, busy, min_overlap)


def busiest_raters(voices: np.ndarray, min_overlap: int = MIN_OVERLAP) -> np.ndarray:
    """Codes of the raters Cohen's kappa is computed among: the MAX_KAPPA_RATERS with the most
    voices (items judged; the lower code first among equals) that have at least `min_overlap`,
    so that pairing raters stays linear in the items. Sorted.

    >>> busiest_raters(np.array([30, 5, 30, 12]), min_overlap=10).tolist()
    [0, 2, 3]
    """
    voices = np.asarray(voices)
    busy = np.zeros(len(voices), dtype=bool)
    busy[np.argsort(-voices, kind="stable")[:MAX_KAPPA_RATERS]] = True
    return np.flatnonzero(busy & (voices >= min_overlap))


def block_counts(v: Verdicts, busy: np.ndarray) -> dict:
    """What agreement adds up over items, for the items of `v` (each with all its verdicts): the
    distinct category counts of items (`profiles`, with `items` of each), the confusion counts of
    every pair of `busy` raters, per rater the leave-one-out majorities met, the human–AI
    confusions and the position counts. `add_counts` joins two blocks, `finish` gives the analysis."""
    item, rater, cat = collapse(v.item, v.rater, v.category)
    counts = category_counts(item, cat, v.n_items)
    profiles, items = distinct_rows(counts)
    has, agrees = leave_one_out_majority(counts, item, cat)
    n_raters = len(v.rater_names)
    return {"n_judgments": int(len(v.item)), "profiles": profiles, "items": items,
            "kappa": _kappa_confusions(item, rater, cat, busy, n_raters),
            "loo_n": np.bincount(rater, weights=has, minlength=n_raters),
            "loo_k": np.bincount(rater, weights=agrees, minlength=n_raters),
            "human_ai": _human_ai_confusions(item, rater, cat, v.rater_names),
            "position": _position_counts(v)}


def add_counts(total: dict | None, block: dict) -> dict:
    """Two blocks' counts as one."""
    if total is None:
        return dict(block)
    out = {key: total[key] + block[key] for key in block if key not in ("profiles", "items")}
    profiles, items = distinct_rows(np.concatenate([total["profiles"], block["profiles"]]),
                                    np.concatenate([total["items"], block["items"]]))
    out.update(profiles=profiles, items=items)
    return out


def finish(counts: dict, rater_names, busy: np.ndarray, min_overlap: int = MIN_OVERLAP) -> dict:
    """The analysis from the counts of every item (`busy`: the raters `block_counts` was given)."""
    profiles, items = counts["profiles"], counts["items"]
    with_ties, n_pairs = pairwise_agreement(profiles, weights=items)
    without_ties, n_pairs_strict = pairwise_agreement(profiles, ties=False, weights=items)
    return {
        "n_judgments": counts["n_judgments"],
        "n_items": int(items.sum()),
        "n_items_multi": int(items[profiles.sum(axis=1) >= 2].sum()),
        "n_raters": int(len(rater_names)),
        "pairwise_with_ties": with_ties,
        "pairwise_without_ties": without_ties,
        "n_pairs": n_pairs,
        "n_pairs_without_ties": n_pairs_strict,
        "cohen_kappa": _kappa_list(counts["kappa"], rater_names, busy, min_overlap),
        "fleiss_kappa": _fleiss_where_it_applies(profiles, items),
        "krippendorff_alpha": krippendorff_alpha(profiles, items),
        **_per_rater(counts["loo_n"], counts["loo_k"], rater_names),
        "human_ai": {rater_names[r]: confusion_agreement(c)
                     for r, c in enumerate(counts["human_ai"]) if c.sum()},
        "position_consistency": _position_consistency(counts["position"], rater_names),
    }


def _kappa_confusions(item, rater, cat, busy, n_raters) -> np.ndarray:
    """(busy × busy × 3 × 3) counts of items two busy raters (lower code first) both judged, by
    their two categories."""
    slot = np.full(n_raters, -1)
    slot[busy] = np.arange(len(busy))
    width = len(busy)
    frame = pd.DataFrame({"item": item, "rater": slot[rater], "cat": cat})
    frame = frame[frame["rater"].to_numpy() >= 0]
    pairs = frame.merge(frame, on="item", suffixes=("_1", "_2"))
    pairs = pairs[pairs["rater_1"] < pairs["rater_2"]]
    cells = ((pairs["rater_1"].to_numpy() * width + pairs["rater_2"].to_numpy()) * 3
             + pairs["cat_1"].to_numpy()) * 3 + pairs["cat_2"].to_numpy()
    return np.bincount(cells, minlength=width * width * 9).reshape(width, width, 3, 3)


def _kappa_list(confusion, rater_names, busy, min_overlap) -> list:
    """Cohen's kappa for every pair of busy raters sharing at least `min_overlap` items: a list of
    {rater_1, rater_2, n, agreement, kappa} sorted by rater ids."""
    n = confusion.sum(axis=(2, 3))
    first, second = np.nonzero(n >= max(min_overlap, 1))
    if len(first) == 0:
        return []
    tables = confusion[first, second]
    kappas = cohen_kappa(tables)
    agreement = np.trace(tables, axis1=1, axis2=2) / n[first, second]
    return [{"rater_1": rater_names[busy[a]], "rater_2": rater_names[busy[b]], "n": int(m),
             "agreement": float(g), "kappa": _finite(k)}
            for a, b, m, g, k in zip(first, second, n[first, second], agreement, kappas, strict=True)]


def _fleiss_where_it_applies(profiles: np.ndarray, items: np.ndarray) -> dict | None:
    """Fleiss needs a constant number of ratings: use the most common count among items with 2+."""
    m = profiles.sum(axis=1)
    multi = m >= 2
    if not items[multi].sum():
        return None
    sizes = np.unique(m[multi])
    freq = np.array([items[m == size].sum() for size in sizes])
    size = int(sizes[np.argmax(freq)])
    return {"kappa": _finite(fleiss_kappa(profiles[m == size], items[m == size])),
            "raters_per_item": size, "n_items": int(freq.max())}


def _per_rater(n, k, rater_names) -> dict:
    """Each rater's agreement with the leave-one-out majority: `k` met of `n` verdicts with one."""
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


def _human_ai_confusions(item, rater, cat, rater_names) -> np.ndarray:
    """(raters × 3 × 3): per AI rater, its verdicts matched with every human verdict on the same
    item, counted by (human category, AI category)."""
    human, ai = _is_kind(rater_names, "human:"), _is_kind(rater_names, "ai:")
    humans = pd.DataFrame({"item": item[human[rater]], "cat_h": cat[human[rater]]})
    judges = pd.DataFrame({"item": item[ai[rater]], "ai": rater[ai[rater]], "cat_ai": cat[ai[rater]]})
    matched = humans.merge(judges, on="item")
    cells = (matched["ai"].to_numpy() * 3 + matched["cat_h"].to_numpy()) * 3 + matched["cat_ai"].to_numpy()
    return np.bincount(cells.astype(np.int64), minlength=len(rater_names) * 9).reshape(-1, 3, 3)


def _position_counts(v: Verdicts) -> np.ndarray:
    """(raters × 4), per AI rater over the items it judged in both orders: items, items whose
    (oriented) verdict did not change with the order, verdicts won by the response shown first,
    decided verdicts."""
    ai = _is_kind(v.rater_names, "ai:")[v.rater]
    frame = pd.DataFrame({"item": v.item[ai], "rater": v.rater[ai], "swapped": v.swapped[ai],
                          "cat": v.category[ai]})
    both = frame.groupby(["item", "rater"])["swapped"].transform("nunique") == 2
    frame = frame[both]
    cat, swapped, rater = (frame[c].to_numpy() for c in ("cat", "swapped", "rater"))
    shown_first_won = (cat != TIE) & ((cat == HI) == swapped)
    # one verdict per (rater, item, order): sorted, each item's two orders are neighbours
    per_order = frame.groupby(["rater", "item", "swapped"], sort=True)["cat"].agg(["min", "max"])
    order_cat = np.where(per_order["min"] == per_order["max"], per_order["min"], TIE)
    order_rater = per_order.index.get_level_values(0).to_numpy()[::2]
    n_raters = len(v.rater_names)
    return np.column_stack([
        np.bincount(order_rater, minlength=n_raters),
        np.bincount(order_rater, weights=order_cat[::2] == order_cat[1::2], minlength=n_raters),
        np.bincount(rater, weights=shown_first_won, minlength=n_raters),
        np.bincount(rater, weights=cat != TIE, minlength=n_raters)])


def _position_consistency(position: np.ndarray, rater_names) -> dict:
    """Per AI rater, over items it judged in both orders: the share whose (oriented) verdict did
    not change with the order, and how often the response shown first won (1/2 = no position bias)."""
    return {rater_names[r]: {"consistency": _share(position[r, 1], position[r, 0]),
                             "n": int(position[r, 0]),
                             "first_shown_win_rate": _share(position[r, 2], position[r, 3])}
            for r in np.flatnonzero(position[:, 0] > 0)}


def _finite(x) -> float | None:
    x = float(x)
    return x if np.isfinite(x) else None
