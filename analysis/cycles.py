"""Condorcet cycles and the loss floors they impose on any reward model.

Per prompt, each compared pair of responses has a majority: the vote share p̂ of the item's first
response (ties count half to each side); a pair is strict when the two sides differ. A triad is three
responses whose three pairs are all compared and strict; it is cyclic when its majorities go round
(x ≻ y ≻ z ≻ x).

Two floors, in nats per judgment:
- `entropy_floor` = Σ_i n_i H(p̂_i) / Σ_i n_i: no model of any kind predicts these verdicts better.
- `bt_floor`: the best a one-number reward (Bradley–Terry, fitted by maximum likelihood per prompt)
  can do on the same verdicts. `gap` = bt_floor − entropy_floor is the intransitivity cost that no
  architecture of scalar reward can remove.

Both plug-in floors are fitted in sample, so both are biased low, the entropy floor most (one
parameter per item). Two corrections of the gap, named apart in the output:
- `*_corrected` and `transitivity_p_value` (asymptotic): each fitted parameter lowers the in-sample
  loss by ½ nat in expectation (`optimism_correction`); 2N·gap ~ χ² under transitivity. Given only
  from MIN_VOTES_ASYMPTOTIC votes per item on, where they hold.
- `gap_bootstrap_corrected` and `gap_bootstrap_p_value` (parametric bootstrap): the gap minus its
  mean over replicates drawn from a transitive model with the same design (`transitive_null_gaps`),
  scores drawn from their approximate posterior under a N(0, 1/λ) prior whose λ is chosen by
  cross-validation (`choose_prior`), so that sparse items are not drawn as certainties. Meant for
  the sparse case (one to a few votes per item), where the asymptotics fail.

Everything but the bootstrap adds up over prompts: `analyze` is `block_counts` of every prompt,
then `finish`; the report adds up blocks of prompts instead (analysis/store_analyses.py).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
from scipy import sparse, stats

from analysis.bt_fit import bradley_terry_fit, choose_prior, item_log_loss, laplace_sd
from analysis.verdicts import HI, LO, TIE, Verdicts, verdict_items

N_WORST = 5
MIN_VOTES_ASYMPTOTIC = 5  # mean votes per item before the χ² / optimism asymptotics are used
BOOT_BUDGET = 500_000  # judgments refitted by the default bootstrap (it runs up to 50k judgments)


# --- pure statistics ---------------------------------------------------------------------------


def binary_entropy(p: np.ndarray) -> np.ndarray:
    """H(p) = −p ln p − (1−p) ln(1−p) in nats, with 0 ln 0 = 0.

    >>> [round(float(h), 4) for h in binary_entropy(np.array([0.5, 0.7, 1.0]))]
    [0.6931, 0.6109, 0.0]
    """
    p = np.asarray(p, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = -p * np.log(p) - (1 - p) * np.log1p(-p)
    return np.where((p <= 0) | (p >= 1), 0.0, terms)


def entropy_floor(n: np.ndarray, p_hat: np.ndarray) -> float:
    """Σ_i n_i H(p̂_i) / Σ_i n_i: the lowest mean log-loss any predictor of the verdicts reaches.

    Three answers, each preferred 70% over the next in a cycle (10 votes per pair):
    >>> round(entropy_floor(np.array([10, 10, 10]), np.array([0.7, 0.7, 0.7])), 3)
    0.611
    """
    n = np.asarray(n, dtype=float)
    return float(np.sum(n * binary_entropy(p_hat)) / np.sum(n)) if np.sum(n) else 0.0


def bradley_terry_floor(group: np.ndarray, i: np.ndarray, j: np.ndarray, n: np.ndarray,
                        p_hat: np.ndarray) -> tuple[float, np.ndarray]:
    """Lowest mean log-loss of the verdicts under Bradley–Terry, P(i ≻ j) = σ(θ_i − θ_j), with one
    θ per response fitted by maximum likelihood separately in each group (prompt).

    Item k compares responses i_k and j_k (integer ids, each belonging to one group) with n_k
    verdicts of which a share p̂_k went to i_k (ties as half). Loss = Σ n_k [−p̂_k ln σ(d_k) −
    (1−p̂_k) ln σ(−d_k)] / Σ n_k, d_k = θ_i − θ_j (Bradley & Terry 1952; Zermelo 1929). Solved by
    batched Newton over all groups at once, θ of each group's first response fixed at 0 (gauge).
    Returns (floor, θ per response id).

    A 70% cycle has no better scalar fit than θ equal, i.e. ln 2; a consistent order does better:
    >>> g, i, j = np.zeros(3, int), np.array([0, 1, 2]), np.array([1, 2, 0])
    >>> round(bradley_terry_floor(g, i, j, np.full(3, 10), np.full(3, 0.7))[0], 4)
    0.6931
    >>> round(bradley_terry_floor(g, i, j, np.full(3, 10), np.array([0.7, 0.7, 0.3]))[0], 4)
    0.6193
    """
    theta = bradley_terry_fit(group, i, j, n, p_hat)
    total = float(np.sum(n))
    return (float(item_log_loss(theta, i, j, n, p_hat).sum()) / total if total else 0.0), theta


def triads(i: np.ndarray, j: np.ndarray, sign: np.ndarray) -> tuple:
    """Every triple of nodes whose three pairs all appear among the strict majority edges, and
    whether its majorities go round. Edge k joins nodes i_k, j_k (ids unique across prompts, so
    triples never mix prompts); sign_k = +1 when i_k wins the majority, −1 when j_k does.
    Returns (a, b, c, cyclic) with a < b < c. Found with two joins (no loop over prompts).

    The three-annotator example (A≻B≻C, B≻C≻A, C≻A≻B): A beats B, B beats C and C beats A, 2:1 each.
    >>> a, b, c, cyclic = triads(np.array([0, 1, 0]), np.array([1, 2, 2]), np.array([1, 1, -1]))
    >>> a.tolist(), b.tolist(), c.tolist(), cyclic.tolist()
    ([0], [1], [2], [True])
    """
    i, j, sign = np.asarray(i), np.asarray(j), np.asarray(sign)
    edges = pd.DataFrame({"a": np.minimum(i, j), "b": np.maximum(i, j),
                          "s": np.where(i < j, sign, -sign)})
    wedges = edges.merge(edges, on="a", suffixes=("_ab", "_ac"))
    wedges = wedges[wedges["b_ab"] < wedges["b_ac"]]
    closing = edges.rename(columns={"a": "b_ab", "b": "b_ac", "s": "s_bc"})
    tri = wedges.merge(closing, on=["b_ab", "b_ac"])
    s_ab, s_ac, s_bc = (tri[c].to_numpy() for c in ("s_ab", "s_ac", "s_bc"))
    cyclic = (s_ab == s_bc) & (s_ac == -s_ab)
    return tri["a"].to_numpy(), tri["b_ab"].to_numpy(), tri["b_ac"].to_numpy(), cyclic


def transitive_null_gaps(group, i, j, n, ties, theta, n_boot: int, seed: int = 0,
                         theta_sd: np.ndarray | None = None) -> np.ndarray:
    """Gaps the same design shows when preferences are exactly Bradley–Terry with scores θ: a
    parametric bootstrap (Efron & Tibshirani 1993, ch. 6). Each replicate keeps every item's n and
    its ties and draws the other votes ~ Binomial(n − ties, σ(θ_i − θ_j)); all replicates are
    fitted at once as separate groups. Their mean is the gap that sampling noise alone produces.

    Three equal responses, each pair judged once: the 2 of 8 outcomes that go round show a gap of
    ln 2 although the truth is transitive (expected share 0.25):
    >>> gaps = transitive_null_gaps(np.zeros(3, int), np.array([0, 1, 2]), np.array([1, 2, 0]),
    ...                             np.ones(3), np.zeros(3), np.zeros(3), 4000)
    >>> round(float(np.mean(gaps > 0.1)), 2), round(float(gaps.max()), 4)
    (0.23, 0.6931)
    """
    group, i, j = np.asarray(group), np.asarray(i), np.asarray(j)
    n, ties = np.asarray(n, dtype=float), np.asarray(ties, dtype=float)
    rng = np.random.default_rng(seed)
    replicate = np.repeat(np.arange(n_boot), len(n))
    draws = np.broadcast_to(theta, (n_boot, len(theta)))
    if theta_sd is not None:
        draws = draws + theta_sd * rng.standard_normal((n_boot, len(theta)))
    prob = 1 / (1 + np.exp(-(draws[:, i] - draws[:, j]).ravel()))
    wins = rng.binomial(np.tile(n - ties, n_boot).astype(np.int64), prob)
    n_rep = np.tile(n, n_boot)
    p_rep = (wins + 0.5 * np.tile(ties, n_boot)) / n_rep
    g_rep = replicate * (int(group.max()) + 1) + np.tile(group, n_boot)
    i_rep, j_rep = (replicate * len(theta) + np.tile(x, n_boot) for x in (i, j))
    theta_rep = bradley_terry_fit(g_rep, i_rep, j_rep, n_rep, p_rep)
    bt = np.bincount(replicate, item_log_loss(theta_rep, i_rep, j_rep, n_rep, p_rep), n_boot)
    ent = np.bincount(replicate, n_rep * binary_entropy(p_rep), n_boot)
    return (bt - ent) / n.sum()


def optimism_correction(n_params: int, n_judgments: int) -> float:
    """Expected in-sample optimism of a maximum-likelihood fit, in nats per judgment: each fitted
    parameter lowers the in-sample log-loss by ½ nat in expectation (Akaike 1973; Wilks 1938:
    2·ΔNLL ~ χ²_d), so the population floor ≈ plug-in + d / (2N). Asymptotic: accurate when items
    have many votes; over-corrects when ties are frequent (a tie carries less information).

    600 items (one p̂ each) seen 20 times each:
    >>> optimism_correction(600, 12_000)
    0.025
    """
    return n_params / (2 * n_judgments) if n_judgments else 0.0


def transitivity_p_value(gap: float, n_judgments: int, df: int) -> float | None:
    """Likelihood-ratio test of Bradley–Terry (df fewer parameters) against one p̂ per item:
    statistic 2N·gap ~ χ²_df under transitive preferences (Wilks 1938).

    >>> round(transitivity_p_value(0.082, 30, 1), 3)
    0.027
    """
    if df <= 0 or n_judgments == 0:
        return None
    return float(stats.chi2.sf(2 * n_judgments * gap, df))


# --- the whole analysis --------------------------------------------------------------------


def analyze(table: pa.Table, n_worst: int = N_WORST, n_boot: int | None = None) -> dict:
    """Cycles and loss floors of a `Store.verdict_arrays()` table, as JSON-ready values.

    n_boot: replicates of the transitive-null bootstrap of the gap; by default as many as keep it
    to about BOOT_BUDGET judgments refitted (100 for small stores, none above 50k judgments).
    """
    v = verdict_items(table)
    counts = block_counts(v, n_worst)
    return finish(counts, default_n_boot(counts["n_judgments"]) if n_boot is None else n_boot, v)


def default_n_boot(n_judgments: int) -> int:
    """Bootstrap replicates that refit about BOOT_BUDGET judgments; none when fewer than 10 fit."""
    n_boot = min(100, BOOT_BUDGET // max(n_judgments, 1))
    return n_boot if n_boot >= 10 else 0


def block_counts(v: Verdicts, n_worst: int = N_WORST) -> dict:
    """What the analysis adds up over prompts, for the prompts of `v` (each with all its verdicts):
    counts, the floors' loss sums, free Bradley–Terry scores, and the block's `n_worst` worst cycles
    (`worst`: (vote margin, share margin, record), worst first). `add_counts` joins two blocks of
    prompts; `finish` turns the sums into the analysis."""
    votes, nodes = _item_votes(v), _nodes(v)
    node_i, node_j, node_response, node_prompt = nodes
    strict = votes["lo"] != votes["hi"]
    sign = np.where(votes["lo"] > votes["hi"], 1, -1)
    a, b, c, cyclic = triads(node_i[strict], node_j[strict], sign[strict])
    entropy_loss, bt_loss = _floor_sums(v, votes, nodes)
    return {
        "n_judgments": int(votes["n"].sum()),
        "n_items": v.n_items,
        "n_prompts": int(len(np.unique(v.item_prompt))),
        "n_strict_pairs": int(strict.sum()),
        "n_triads": int(len(a)),
        "n_cyclic_triads": int(cyclic.sum()),
        "n_prompts_with_cycles": int(len(np.unique(node_prompt[a[cyclic]]))),
        **_condorcet(v, node_i, node_j, votes, node_prompt),
        "entropy_loss": entropy_loss, "bt_loss": bt_loss,
        "n_bt_params": _n_free_scores(node_i, node_j, len(node_response)),
        "worst": _worst_cycles(v, votes, nodes, (a[cyclic], b[cyclic], c[cyclic]), n_worst),
    }


def add_counts(total: dict | None, block: dict, n_worst: int = N_WORST) -> dict:
    """Two blocks' counts as one (`total` first: of two equally bad cycles the earlier is kept,
    as one block holding both prompts would)."""
    if total is None:
        return dict(block)
    out = {key: total[key] + block[key] for key in block if key != "worst"}
    out["worst"] = sorted(total["worst"] + block["worst"], key=lambda w: (-w[0], -w[1]))[:n_worst]
    return out


def finish(counts: dict, n_boot: int = 0, whole: Verdicts | None = None) -> dict:
    """The analysis from the counts of every prompt. The bootstrap (n_boot > 0) refits the whole
    data at once, so it needs `whole`: the Verdicts the counts came from, as one block."""
    n_total, n_items = counts["n_judgments"], counts["n_items"]
    result = {key: counts[key] for key in ("n_judgments", "n_items", "n_prompts")}
    result["votes_per_item"] = n_total / n_items if n_items else None
    for key in ("n_strict_pairs", "n_triads", "n_cyclic_triads", "n_prompts_with_cycles",
                "n_prompts_complete", "n_condorcet_winners"):
        result[key] = counts[key]
    ent = counts["entropy_loss"] / n_total if n_total else 0.0
    bt = counts["bt_loss"] / n_total if n_total else 0.0
    df = n_items - counts["n_bt_params"]
    null = _bootstrap(whole, n_boot) if n_boot and df > 0 and whole is not None else None
    result.update(_floors(ent, bt, counts, n_boot, null))
    result["worst_cycles"] = [record for _, _, record in counts["worst"]]
    return result


def loss_floors(table: pa.Table) -> dict:
    """`entropy_floor` and `bt_floor` of a `Store.verdict_arrays()` table, and nothing else (no
    triads, no bootstrap): what a training run records beside its losses. None for no verdicts.

    >>> t = pa.table({"prompt_id": ["p"] * 4, "response_a": ["x", "x", "x", "y"],
    ...               "response_b": ["y", "y", "y", "x"], "winner": ["a", "a", "b", "a"],
    ...               "rater": ["human:1", "human:2", "human:3", "human:4"]})
    >>> {k: round(v, 4) for k, v in loss_floors(t).items()}  # p̂ = 1/2 on one item: H = ln 2
    {'entropy_floor': 0.6931, 'bt_floor': 0.6931}
    """
    if table.num_rows == 0:
        return {"entropy_floor": None, "bt_floor": None}
    v = verdict_items(table)
    votes = _item_votes(v)
    entropy_loss, bt_loss = _floor_sums(v, votes, _nodes(v))
    n_total = float(votes["n"].sum())
    return {"entropy_floor": entropy_loss / n_total, "bt_floor": bt_loss / n_total}


def _floor_sums(v: Verdicts, votes: dict, nodes: tuple) -> tuple[float, float]:
    """Σ_i n_i H(p̂_i) and the Bradley–Terry log-loss summed over the verdicts (see the floors)."""
    node_i, node_j = nodes[0], nodes[1]
    theta = bradley_terry_fit(v.item_prompt, node_i, node_j, votes["n"], votes["p_hat"])
    bt = float(item_log_loss(theta, node_i, node_j, votes["n"], votes["p_hat"]).sum())
    return float(np.sum(np.asarray(votes["n"], dtype=float) * binary_entropy(votes["p_hat"]))), bt


def _bootstrap(v: Verdicts, n_boot: int) -> tuple[float, np.ndarray]:
    """The prior precision chosen by cross-validation and the gaps of `n_boot` transitive replicates."""
    votes, (node_i, node_j, _, _) = _item_votes(v), _nodes(v)
    n = votes["n"]
    prior = choose_prior(v.item_prompt, node_i, node_j, votes)
    shrunk = bradley_terry_fit(v.item_prompt, node_i, node_j, n, votes["p_hat"], ridge=prior)
    return prior, transitive_null_gaps(v.item_prompt, node_i, node_j, n, votes["ties"], shrunk, n_boot,
                                       theta_sd=laplace_sd(shrunk, node_i, node_j, n, prior))


def _floors(ent: float, bt: float, counts: dict, n_boot: int, null) -> dict:
    n_total, n_items, n_bt_params = counts["n_judgments"], counts["n_items"], counts["n_bt_params"]
    df = n_items - n_bt_params
    floors = {
        "entropy_floor": ent,
        "bt_floor": bt,
        "gap": bt - ent,
        "entropy_floor_corrected": None, "bt_floor_corrected": None, "gap_corrected": None,
        "transitivity_df": int(df), "transitivity_p_value": None,
        "correction": "*_corrected: asymptotic bias correction, + (fitted parameters) / "
                      f"(2 n_judgments) per floor, given from {MIN_VOTES_ASYMPTOTIC} votes per item "
                      "on; gap_bootstrap_corrected: gap minus its mean under a transitive "
                      "(Bradley-Terry) parametric bootstrap, valid for sparse votes too",
        "n_boot": n_boot, "null_prior_precision": None, "gap_null_mean": None,
        "gap_bootstrap_corrected": None,
        "gap_bootstrap_p_value": None,
    }
    if n_total >= MIN_VOTES_ASYMPTOTIC * n_items:
        floors.update(entropy_floor_corrected=ent + optimism_correction(n_items, n_total),
                      bt_floor_corrected=bt + optimism_correction(n_bt_params, n_total),
                      gap_corrected=bt - ent - optimism_correction(df, n_total),
                      transitivity_p_value=transitivity_p_value(bt - ent, n_total, df))
    if null is not None:
        prior, gaps = null
        floors.update(gap_null_mean=float(gaps.mean()), null_prior_precision=prior,
                      gap_bootstrap_corrected=bt - ent - float(gaps.mean()),
                      gap_bootstrap_p_value=float((1 + np.sum(gaps >= bt - ent)) / (n_boot + 1)))
    return floors


def _item_votes(v: Verdicts) -> dict:
    count = {name: np.bincount(v.item, weights=v.category == code, minlength=v.n_items)
             for name, code in (("lo", LO), ("hi", HI), ("ties", TIE))}
    n = count["lo"] + count["hi"] + count["ties"]
    return {**count, "n": n, "p_hat": (count["lo"] + 0.5 * count["ties"]) / np.maximum(n, 1)}


def _nodes(v: Verdicts) -> tuple:
    """One node per (prompt, response): the same response id under two prompts is two nodes."""
    width = len(v.response_names)
    keys = np.concatenate([v.item_prompt * width + v.item_lo, v.item_prompt * width + v.item_hi])
    codes, uniques = pd.factorize(keys)
    m = v.n_items
    return codes[:m], codes[m:], uniques % width, uniques // width


def _n_free_scores(node_i, node_j, n_nodes: int) -> int:
    """Bradley–Terry scores identifiable from the comparisons: one per node less one per connected
    component of the comparison graph (each component has its own free offset)."""
    if n_nodes == 0:
        return 0
    graph = sparse.coo_matrix((np.ones(len(node_i)), (node_i, node_j)), shape=(n_nodes, n_nodes))
    n_components, _ = sparse.csgraph.connected_components(graph, directed=False)
    return n_nodes - n_components


def _condorcet(v: Verdicts, node_i, node_j, votes: dict, node_prompt) -> dict:
    """Among prompts with 3+ responses whose every pair was compared: how many have a Condorcet
    winner (a response whose majority beats every other)."""
    n_prompts = int(v.item_prompt.max(initial=-1)) + 1
    size = np.bincount(node_prompt, minlength=n_prompts)
    compared = np.bincount(v.item_prompt, minlength=n_prompts)
    complete = (size >= 3) & (compared == size * (size - 1) // 2)
    strict = votes["lo"] != votes["hi"]
    winner = np.where(votes["lo"] > votes["hi"], node_i, node_j)[strict]
    wins = np.bincount(winner, minlength=len(node_prompt))
    beats_all = wins == size[node_prompt] - 1
    has_winner = np.bincount(node_prompt[beats_all], minlength=n_prompts) > 0
    return {"n_prompts_complete": int(complete.sum()),
            "n_condorcet_winners": int((complete & has_winner).sum())}


def _worst_cycles(v: Verdicts, votes: dict, nodes: tuple, cycles: tuple, n_worst: int) -> list:
    """The cyclic triads whose weakest majority wins by most votes (then by the largest share),
    so that cycles resting on single votes come last, as (vote margin, share margin, record); the
    record in cycle order: responses[0] ≻ responses[1] ≻ responses[2] ≻ responses[0], with each
    step's vote share."""
    node_i, node_j, node_response, node_prompt = nodes
    a, b, c = cycles
    if len(a) == 0:
        return []
    width = len(node_response)
    index = pd.Index(np.minimum(node_i, node_j) * width + np.maximum(node_i, node_j))
    ab, ac, bc = (index.get_indexer(np.minimum(x, y) * width + np.maximum(x, y))
                  for x, y in ((a, b), (a, c), (b, c)))
    edges = np.stack([ab, ac, bc])
    vote_margin = np.min(np.abs(votes["lo"] - votes["hi"])[edges], axis=0)
    share_margin = np.min(np.abs(votes["p_hat"][edges] - 0.5), axis=0)
    chosen = np.lexsort((-share_margin, -vote_margin))[:n_worst]
    return [(float(vote_margin[t]), float(share_margin[t]),
             _cycle_record(v, votes, nodes, index, width, (a[t], b[t], c[t]))) for t in chosen]


def _cycle_record(v: Verdicts, votes: dict, nodes: tuple, index, width, triad) -> dict:
    node_i, _, node_response, node_prompt = nodes
    a, b, c = (int(x) for x in triad)
    first_ab = index.get_indexer([min(a, b) * width + max(a, b)])[0]
    a_beats_b = (votes["p_hat"][first_ab] > 0.5) == (node_i[first_ab] == a)
    order = (a, b, c) if a_beats_b else (a, c, b)
    shares, n_votes = [], []
    for x, y in zip(order, order[1:] + order[:1], strict=True):
        item = index.get_indexer([min(x, y) * width + max(x, y)])[0]
        p = votes["p_hat"][item]
        shares.append(float(p if node_i[item] == x else 1 - p))
        n_votes.append(int(votes["n"][item]))
    return {"prompt_id": v.prompt_names[node_prompt[a]],
            "responses": [v.response_names[node_response[x]] for x in order],
            "shares": shares, "n_votes": n_votes}
