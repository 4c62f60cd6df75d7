"""Length bias: do raters prefer the longer answer, and how much once quality is accounted for?

Two measures, overall, per rater and per rater kind (the part of the rater id before the first ':'):

- `p_longer_wins`: among non-tie verdicts whose two responses differ in length, the share where the
  longer one won, with a Wilson 95% interval (Wilson, JASA 1927) and n. 0.5 means no length bias.
- `slope`: the coefficient β of a logistic regression of "a won" (non-tie verdicts) on
  tanh((len_a − len_b) / sd), sd the standard deviation of len_a − len_b over the whole table; the
  feature of AlpacaEval's length-controlled win rate (Dubois et al., 2024). When every response has a
  known source model the regression also holds one strength θ per source (Bradley–Terry on sources),
  and `sources[s].lc_win_rate` = mean over the other sources s' of σ(θ_s − θ_s'): the win rate with
  the length term set to zero. There is no intercept (see `length_slope`).

Input is the pyarrow Table of `Store.verdict_arrays` (winner, rater, len_a, len_b, model_a, model_b),
or the same verdicts counted by (rater, winner, length difference, sources) (`analyze_cells`: what
the store's report reads); everything is vectorized numpy, one fit per rater. Every statistic
takes `count`, how many verdicts each row stands for (default one each).

    >>> import pyarrow as pa
    >>> t = pa.table({"winner": ["a", "a", "b", "tie", "a"], "rater": ["human:x"] * 5,
    ...               "len_a": [10, 5, 3, 9, 4], "len_b": [2, 7, 8, 1, 4],
    ...               "model_a": [None] * 5, "model_b": [None] * 5})
    >>> analyze(t)["p_longer_wins"]  # decided and different lengths: won by longer 10>2, 3<8; shorter 5<7
    0.6667
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from analysis.verdicts import TIE, Z95, A, B, wilson_interval, winner_codes

MIN_FIT = 20  # fewer decided verdicts than this (or 5 per parameter) give no slope


def _index_in(column, names: list) -> np.ndarray:
    """Position of each value in `names` (−1 where absent or null), computed in Arrow, not Python."""
    codes = pc.index_in(column, value_set=pa.array(names, pa.string()))
    return np.asarray(pc.fill_null(codes, -1).to_numpy(zero_copy_only=False), dtype=np.int64)


def p_longer_wins(winner, len_a: np.ndarray, len_b: np.ndarray, count=None) -> dict:
    """Share of decided verdicts on pairs of different length won by the longer response.

    >>> p_longer_wins(["a", "b", "b"], np.array([3, 3, 1]), np.array([1, 1, 1]))
    {'p_longer_wins': 0.5, 'p_longer_wins_ci95': [0.0945, 0.9055], 'n': 2}
    """
    w = winner_codes(winner)
    count = _ones_or(count, len(w))
    used = (w != TIE) & (len_a != len_b)
    longer_won = (w[used] == A) == (len_a[used] > len_b[used])
    n = int(count[used].sum())
    k = float(count[used][longer_won].sum())
    low, high = wilson_interval(k, n)
    value = k / n if n else None
    return {"p_longer_wins": _round(value), "p_longer_wins_ci95": [round(low, 4), round(high, 4)],
            "n": n}


def fit_logistic(x: np.ndarray, y: np.ndarray, max_iter: int = 50) -> tuple[np.ndarray, np.ndarray]:
    """Maximum-likelihood logistic regression by Newton's method (IRLS); returns the coefficients
    and their covariance (inverse Fisher information).

    At x = 1 one y = 1 in three (P = 1/3), at x = −1 two in three: β = logit(1/3) = −ln 2 = −0.6931.

    >>> x = np.array([[1.0], [-1.0], [1.0], [1.0], [-1.0], [-1.0]])
    >>> y = np.array([1.0, 0.0, 0.0, 0.0, 1.0, 1.0])
    >>> beta, cov = fit_logistic(x, y)
    >>> round(float(beta[0]), 4)
    -0.6931
    """
    beta = np.zeros(x.shape[1])
    info = np.eye(x.shape[1])
    for _ in range(max_iter):
        prob = 1.0 / (1.0 + np.exp(-(x @ beta)))
        weight = prob * (1.0 - prob)
        info = (x * weight[:, None]).T @ x + 1e-9 * np.eye(x.shape[1])
        step = np.linalg.solve(info, x.T @ (y - prob))
        beta = beta + step
        if np.max(np.abs(step)) < 1e-9:
            break
    return beta, np.linalg.inv(info)


def fit_logistic_grouped(feature: np.ndarray, group: np.ndarray, d: np.ndarray, y: np.ndarray,
                         trials: np.ndarray | None = None,
                         max_iter: int = 50) -> tuple[np.ndarray, np.ndarray]:
    """`fit_logistic` for x = [feature, d[group]], where rows of one group share their last columns
    (here: the ±1 source indicators of a (source_a, source_b) pair). X'WX and X'(y − p) then come
    from five per-group sums (np.bincount) instead of an n×k product at each Newton step. With
    `trials`, each row is a binomial cell: y successes out of trials.

    >>> rng = np.random.default_rng(0)
    >>> f, g = rng.standard_normal(200), rng.integers(0, 3, 200)
    >>> d = np.array([[1.0], [-1.0], [0.0]]); y = (rng.random(200) < 0.5).astype(float)
    >>> fast, _ = fit_logistic_grouped(f, g, d, y)
    >>> slow, _ = fit_logistic(np.column_stack([f, d[g]]), y)
    >>> bool(np.allclose(fast, slow))
    True
    """
    n_groups, k = d.shape[0], 1 + d.shape[1]
    beta = np.zeros(k)
    info = np.eye(k)
    for _ in range(max_iter):
        prob = 1.0 / (1.0 + np.exp(-(beta[0] * feature + (d @ beta[1:])[group])))
        weight, resid = prob * (1.0 - prob), y - prob
        if trials is not None:
            weight, resid = trials * weight, y - trials * prob
        sw, swf, swff, sr, srf = (np.bincount(group, weights=v, minlength=n_groups) for v in
                                  (weight, weight * feature, weight * feature * feature, resid,
                                   resid * feature))
        info = np.empty((k, k))
        info[0, 0] = swff.sum()
        info[0, 1:] = info[1:, 0] = swf @ d
        info[1:, 1:] = d.T @ (d * sw[:, None])
        info += 1e-9 * np.eye(k)
        step = np.linalg.solve(info, np.concatenate([[srf.sum()], sr @ d]))
        beta = beta + step
        if np.max(np.abs(step)) < 1e-9:
            break
    return beta, np.linalg.inv(info)


def _source_groups(source_a, source_b, n_sources: int) -> tuple[np.ndarray, np.ndarray]:
    """Group = (source_a, source_b) pair; its design row is +1 at a's column, −1 at b's (source 0
    is the reference and has no column)."""
    s = max(n_sources, 1)
    pairs = np.arange(s * s)
    d = np.zeros((s * s, s))
    np.add.at(d, (pairs, pairs // s), 1.0)
    np.add.at(d, (pairs, pairs % s), -1.0)
    group = source_a * s + source_b if n_sources > 1 else np.zeros(0, dtype=np.int64)
    return group, d[:, 1:]


def binomial_cells(delta: np.ndarray, group: np.ndarray, y: np.ndarray, n_groups: int,
                   count=None) -> tuple:
    """Rows sharing (group, length difference) collapsed into one binomial cell: (delta, group,
    trials, successes) per cell, sorted by (group, delta). Newton steps then run over cells, whose
    number hardly grows with the data (length differences are whole characters), instead of over
    every verdict.

    >>> binomial_cells(np.array([3.0, 3.0, -1.0]), np.array([0, 0, 1]), np.array([1.0, 0.0, 1.0]), 2)
    (array([ 3., -1.]), array([0, 1]), array([2., 1.]), array([1., 1.]))
    """
    count = _ones_or(count, len(delta)).astype(float)
    lo = float(delta.min())
    span = int(delta.max() - lo) + 1
    if np.all(delta == np.round(delta)) and n_groups * span <= 4 * len(delta) + 1_000_000:
        key = group * span + (delta - lo).astype(np.int64)  # dense key: bincount, no sort
        trials = np.bincount(key, weights=count, minlength=n_groups * span)
        wins = np.bincount(key, weights=y * count, minlength=n_groups * span)
        cells = np.flatnonzero(trials)
        return lo + cells % span, cells // span, trials[cells], wins[cells]
    pairs, inverse = np.unique(np.column_stack([group, delta]), axis=0, return_inverse=True)
    inverse = inverse.ravel()
    return (pairs[:, 1], pairs[:, 0].astype(np.int64), np.bincount(inverse, weights=count),
            np.bincount(inverse, weights=y * count))


def length_slope(winner, len_a, len_b, sd: float, source_a=None, source_b=None,
                 n_sources: int = 0, count=None) -> dict:
    """β on tanh((len_a − len_b)/sd) with its Wald 95% interval; θ per source (codes 0..S−1,
    source 0 fixed at 0) when sources are given. No intercept: the model is about the responses,
    not the order they were shown in, so files whose first response is always the chosen one
    (TRL/hh-rlhf) or the better model (MT-Bench) fit as well as randomly ordered ones.

    a longer by 8 (= sd): a wins 15 of 20; shorter by 8: 5 of 20, so the longer wins 3/4 at
    feature ±tanh(1): β = logit(3/4) / tanh(1) = ln 3 / 0.76159 = 1.4425:

    >>> w = ["a"] * 15 + ["b"] * 5 + ["a"] * 5 + ["b"] * 15
    >>> la, lb = np.array([9] * 20 + [1] * 20), np.array([1] * 20 + [9] * 20)
    >>> length_slope(w, la, lb, 8.0)["slope"]
    1.4425
    """
    w = winner_codes(winner)
    decided = w != TIE
    count = _ones_or(count, len(w))[decided]
    y = (w[decided] == A).astype(float)
    feature = np.tanh((len_a[decided] - len_b[decided]) / sd)
    sources = n_sources if n_sources > 1 else 0
    group, d = _source_groups(source_a[decided] if sources else None,
                              source_b[decided] if sources else None, sources)
    if not sources:
        group = np.zeros(len(y), dtype=np.int64)
    n = int(count.sum())
    longer_won = ((y == 1) == (feature > 0))[feature != 0]
    different = count[feature != 0]
    # all longer (or all shorter) winning separates the data: no finite maximum-likelihood slope
    if n < max(MIN_FIT, 5 * (1 + d.shape[1])) or not 0 < different[longer_won].sum() < different.sum():
        return {"slope": None, "slope_ci95": None, "n_slope": n}
    cell_delta, cell_group, trials, wins = binomial_cells(
        len_a[decided] - len_b[decided], group, y, d.shape[0], count)
    with np.errstate(over="ignore"):
        beta, cov = fit_logistic_grouped(np.tanh(cell_delta / sd), cell_group, d, wins, trials)
    se = np.sqrt(np.maximum(np.diag(cov), 0.0))
    out = {"slope": _round(beta[0]), "slope_ci95": [_round(beta[0] - Z95 * se[0]),
                                                  _round(beta[0] + Z95 * se[0])], "n_slope": n}
    if sources:
        out["theta"] = np.concatenate([[0.0], beta[1:]])
    return out


def source_win_rates(winner, source_a, source_b, theta: np.ndarray, names: list,
                     count=None) -> dict:
    """Raw win rate (ties count half) and length-controlled win rate per source (codes into names).

    >>> w = ["a", "a", "tie"]; sa = np.array([0, 0, 1]); sb = np.array([1, 1, 0])
    >>> source_win_rates(w, sa, sb, np.zeros(2), ["x", "y"])["x"]
    {'win_rate': 0.8333, 'lc_win_rate': 0.5, 'n': 3}
    """
    w = winner_codes(winner)
    k, count = len(names), _ones_or(count, len(w))

    def total(side, rows):
        return np.bincount(side[rows], weights=count[rows], minlength=k)

    everything = np.ones(len(w), dtype=bool)
    wins = total(source_a, w == A) + total(source_b, w == B)
    ties = total(source_a, w == TIE) + total(source_b, w == TIE)
    n = total(source_a, everything) + total(source_b, everything)
    vs = 1.0 / (1.0 + np.exp(-(theta[:, None] - theta[None, :])))  # σ(θ_s − θ_s')
    lc = (vs.sum(axis=1) - 0.5) / max(k - 1, 1)  # drop the diagonal σ(0) = 1/2
    return {name: {"win_rate": _round((wins[s] + 0.5 * ties[s]) / n[s]) if n[s] else None,
                   "lc_win_rate": _round(lc[s]), "n": int(n[s])} for s, name in enumerate(names)}


def win_rate_curve(winner, len_a, len_b, bins: int = 10, count=None) -> dict:
    """Share won by the longer response in quantile bins of |len_a − len_b|, over the verdicts
    `p_longer_wins` uses (for the plot; orientation-free, so a data set whose a/b order is not
    random, like MT-Bench's, is not confounded with position).

    >>> c = win_rate_curve(["a", "b", "a", "a"], np.array([1, 1, 30, 30]), np.array([9, 9, 1, 1]), bins=2)
    >>> c["abs_delta"], c["p_longer_wins"], c["n"]
    ([8.0, 29.0], [0.5, 1.0], [2, 2])
    """
    w = winner_codes(winner)
    used = (w != TIE) & (len_a != len_b)
    count = _ones_or(count, len(w))[used]
    delta = np.abs(len_a[used] - len_b[used]).astype(float)
    longer_won = ((w[used] == A) == (len_a[used] > len_b[used])).astype(float)
    if count.sum() == 0:
        return {"abs_delta": [], "p_longer_wins": [], "n": []}
    edges = np.unique(repeated_quantiles(delta, count, np.linspace(0, 1, bins + 1)))
    which = np.clip(np.searchsorted(edges, delta, side="right") - 1, 0, max(len(edges) - 2, 0))
    n = np.bincount(which, weights=count, minlength=max(len(edges) - 1, 1)).astype(np.int64)
    keep = n > 0
    sums = np.bincount(which, weights=delta * count, minlength=len(n))
    wins = np.bincount(which, weights=longer_won * count, minlength=len(n))
    return {"abs_delta": np.round(sums[keep] / n[keep], 1).tolist(),
            "p_longer_wins": np.round(wins[keep] / n[keep], 4).tolist(), "n": n[keep].tolist()}


def repeated_quantiles(values: np.ndarray, count: np.ndarray, q: np.ndarray) -> np.ndarray:
    """np.quantile(np.repeat(values, count), q) (its default, linear method) without repeating:
    order statistics are read off the cumulative counts, and interpolated as numpy does.

    >>> v, c, q = np.array([5.0, 1.0, 3.0]), np.array([2, 3, 1]), np.linspace(0, 1, 7)
    >>> bool(np.array_equal(repeated_quantiles(v, c, q), np.quantile(np.repeat(v, c), q)))
    True
    """
    order = np.argsort(values, kind="stable")
    values, ends = values[order], np.cumsum(count[order])
    last = int(ends[-1]) - 1
    at = (last * np.asarray(q, dtype=float))
    below = np.minimum(np.floor(at), last).astype(np.int64)
    gamma = at - below
    low = values[np.searchsorted(ends, below, side="right")]
    high = values[np.searchsorted(ends, np.minimum(below + 1, last), side="right")]
    diff = high - low
    return np.where(gamma >= 0.5, high - diff * (1 - gamma), low + diff * gamma)


def _ones_or(count, n: int) -> np.ndarray:
    return np.ones(n, dtype=np.int64) if count is None else np.asarray(count)


# --- the table -------------------------------------------------------------------------------


def _columns(table) -> dict:
    """Numeric columns: winner codes, lengths, count (one each), rater codes (+ names), source codes
    (+ names, empty unless every response has a source and there are two or more)."""
    missing = {"winner", "rater", "len_a", "len_b"} - set(table.column_names)
    if missing:
        raise ValueError(f"length_bias.analyze: table lacks columns {sorted(missing)}; "
                         "pass Store.verdict_arrays()")
    if table.num_rows == 0:
        raise ValueError("length_bias.analyze: no judgments; ingest some or widen --raters")
    raters = sorted(pc.unique(table.column("rater")).drop_null().to_pylist())
    cols = {"winner": winner_codes(table.column("winner")),
            "len_a": table.column("len_a").to_numpy().astype(float),
            "len_b": table.column("len_b").to_numpy().astype(float),
            "count": np.ones(table.num_rows, dtype=np.int64),
            "rater": _index_in(table.column("rater"), raters), "rater_names": raters,
            "source_names": []}
    if {"model_a", "model_b"} <= set(table.column_names):
        ma, mb = table.column("model_a"), table.column("model_b")
        if table.num_rows and ma.null_count == 0 and mb.null_count == 0:
            names = sorted(set(pc.unique(ma).to_pylist()) | set(pc.unique(mb).to_pylist()))
            if len(names) >= 2:
                cols.update(source_names=names, source_a=_index_in(ma, names),
                            source_b=_index_in(mb, names))
    return cols


def _summary(cols: dict, rows: np.ndarray, sd: float) -> dict:
    w, la, lb, count = (cols[c][rows] for c in ("winner", "len_a", "len_b", "count"))
    n_sources = len(cols["source_names"])
    out = p_longer_wins(w, la, lb, count)
    sa = cols["source_a"][rows] if n_sources else None
    sb = cols["source_b"][rows] if n_sources else None
    out.update(length_slope(w, la, lb, sd, sa, sb, n_sources, count))
    out.pop("theta", None)
    return out


def _grouped(cols: dict, codes: np.ndarray, names: list, sd: float) -> dict:
    order = np.argsort(codes, kind="stable")
    present, starts = np.unique(codes[order], return_index=True)
    bounds = [*starts[1:], len(order)]
    return {names[c]: _summary(cols, order[s:e], sd)
            for c, s, e in zip(present, starts, bounds, strict=True) if c >= 0}


def _token_lengths(table, tokenizer) -> tuple[np.ndarray, np.ndarray]:
    """Token counts of response_a_text/response_b_text (Store.judgments) with an HF tokenizer or a
    callable str -> tokens."""
    if not {"response_a_text", "response_b_text"} <= set(table.column_names):
        raise ValueError("length_bias.analyze: counting tokens needs response_a_text and "
                         "response_b_text columns; pass Store.judgments() instead of verdict_arrays()")
    counts: dict[str, int] = {}
    out = []
    for name in ("response_a_text", "response_b_text"):
        texts = table.column(name).to_pylist()
        missing = [t for t in dict.fromkeys(texts) if t not in counts]
        if hasattr(tokenizer, "batch_decode"):  # a transformers tokenizer: one batched call
            ids = tokenizer(missing, add_special_tokens=False)["input_ids"] if missing else []
        else:
            ids = [tokenizer(t) for t in missing]
        counts.update(zip(missing, map(len, ids), strict=True))
        out.append(np.array([counts[t] for t in texts], dtype=float))
    return out[0], out[1]


def analyze(table, tokenizer=None) -> dict:
    """Length bias overall, per rater and per rater kind (see the module docstring for definitions)."""
    cols = _columns(table)
    out = analyze_cells(cols)
    if tokenizer is not None:
        tok_a, tok_b = _token_lengths(table, tokenizer)
        tokens = p_longer_wins(cols["winner"], tok_a, tok_b)
        tokens.update(length_slope(cols["winner"], tok_a, tok_b, float(np.std(tok_a - tok_b)) or 1.0))
        out["tokens"] = tokens
    return out


def analyze_cells(cols: dict) -> dict:
    """`analyze` of verdict rows or of counted cells. cols: winner codes, len_a and len_b (the
    difference and 0 will do), count, rater codes and rater_names, source_names and, when there
    are two or more, source_a and source_b codes."""
    count = cols["count"]
    sd = weighted_sd(cols["len_a"] - cols["len_b"], count) or 1.0
    names = cols["source_names"]
    out = p_longer_wins(cols["winner"], cols["len_a"], cols["len_b"], count)
    out.update(length_slope(cols["winner"], cols["len_a"], cols["len_b"], sd, cols.get("source_a"),
                            cols.get("source_b"), len(names), count))
    theta = out.pop("theta", None)
    out["sources"] = source_win_rates(cols["winner"], cols["source_a"], cols["source_b"], theta,
                                      names, count) if theta is not None else None
    kinds = sorted({r.split(":", 1)[0] for r in cols["rater_names"]})
    kind_of_rater = np.array([kinds.index(r.split(":", 1)[0]) for r in cols["rater_names"]] + [-1])
    out["by_rater"] = _grouped(cols, cols["rater"], cols["rater_names"], sd)
    out["by_kind"] = _grouped(cols, kind_of_rater[cols["rater"]], kinds, sd)
    out["curve"] = win_rate_curve(cols["winner"], cols["len_a"], cols["len_b"], count=count)
    out["length_sd"] = round(sd, 3)
    out["feature"] = "tanh((len_a - len_b) / length_sd), lengths in characters"
    return out


def weighted_sd(values: np.ndarray, count: np.ndarray) -> float:
    """np.std(np.repeat(values, count)) without repeating.

    >>> weighted_sd(np.array([1.0, 4.0]), np.array([2, 1])) == float(np.std([1.0, 1.0, 4.0]))
    True
    """
    weights = np.asarray(count, dtype=float)
    mean = weights @ values / weights.sum()
    return float(np.sqrt(weights @ (values - mean) ** 2 / weights.sum()))


def _round(value, digits: int = 4):
    return None if value is None else round(float(value), digits)
