"""Bradley–Terry scores fitted by maximum likelihood in many small groups (prompts) at once.

P(i ≻ j) = σ(θ_i − θ_j) (Bradley & Terry 1952; Zermelo 1929), one θ per response, fitted
separately per group. The fit is a batched Newton iteration: groups with the same number K of
responses share one (groups × K × K) Hessian array, solved together; the gauge is fixed by θ = 0
for each group's first response, and converged groups drop out of the iteration. No Python loop
runs over groups or items, only over the distinct group sizes.
"""

from __future__ import annotations

import numpy as np

RIDGE = 1e-6         # keeps separated groups (a response that always wins) finite; costs < 1e-4 nats
NEWTON_STEPS = 100
NEWTON_TOLERANCE = 1e-8
MAX_BLOCK = 1 << 18  # groups × K² Hessian entries solved at once (2 MB: blocks that outgrow the
                     # CPU cache make the fit slower per group as the store grows)
PRIOR_GRID = (0.1, 0.3, 1.0, 3.0)  # prior precisions `choose_prior` picks from


def bradley_terry_fit(group: np.ndarray, i: np.ndarray, j: np.ndarray, n: np.ndarray,
                      p_hat: np.ndarray, ridge: float = RIDGE) -> np.ndarray:
    """Maximum-likelihood Bradley–Terry scores θ, one per response id, every group at once.

    Item k compares responses i_k and j_k (integer ids, each in one group only: group_k) with n_k
    verdicts of which a share p̂_k went to i_k (ties as half). θ minimises, per group,
    Σ_k n_k [−p̂_k ln σ(θ_i − θ_j) − (1 − p̂_k) ln σ(θ_j − θ_i)] + ridge/2·|θ|². The default
    ridge only keeps separated groups finite; ridge 1 is a N(0, 1) prior on the scores.

    0 beats 1 in 8 of 10, 1 and 2 split 5:5: θ_0 − θ_1 = logit 0.8 = 1.386, θ_1 = θ_2.

    >>> theta = bradley_terry_fit(np.zeros(2, int), np.array([0, 1]), np.array([1, 2]),
    ...                           np.array([10, 10]), np.array([0.8, 0.5]))
    >>> [round(float(t), 3) for t in theta]
    [0.0, -1.386, -1.386]
    """
    group, i, j = np.asarray(group), np.asarray(i), np.asarray(j)
    n, wins = np.asarray(n, dtype=float), np.asarray(n, dtype=float) * np.asarray(p_hat)
    theta = np.zeros(int(max(i.max(initial=-1), j.max(initial=-1))) + 1)
    if len(n) == 0:
        return theta
    node_group, local, size = _local_indices(group, i, j, len(theta))
    item_size = size[group]
    for k in np.unique(size[size > 1]):
        mine = np.flatnonzero(item_size == k)
        items = (group[mine], local[i[mine]], local[j[mine]], n[mine], wins[mine])
        _fit_size(int(k), items, node_group, local, size, theta, ridge)
    return theta


def item_log_loss(theta: np.ndarray, i: np.ndarray, j: np.ndarray, n: np.ndarray,
                  p_hat: np.ndarray) -> np.ndarray:
    """Σ over an item's n verdicts of −ln P(verdict) under scores θ, ties as half a win each:
    n [−p̂ ln σ(θ_i − θ_j) − (1 − p̂) ln σ(θ_j − θ_i)].

    >>> round(float(item_log_loss(np.zeros(2), np.array([0]), np.array([1]), np.array([4]), np.array([0.75]))[0]), 4)
    2.7726
    """
    d = theta[np.asarray(i)] - theta[np.asarray(j)]
    wins = np.asarray(n) * np.asarray(p_hat)
    return wins * np.logaddexp(0, -d) + (np.asarray(n) - wins) * np.logaddexp(0, d)


def _local_indices(group, i, j, n_nodes):
    """Each node's group, its index 0..K−1 inside the group, and each group's size K."""
    node_group = np.full(n_nodes, -1, dtype=np.int64)
    node_group[i], node_group[j] = group, group
    used = np.flatnonzero(node_group >= 0)
    used = used[np.argsort(node_group[used], kind="stable")]
    size = np.bincount(node_group[used], minlength=int(group.max()) + 1)
    start = np.concatenate([[0], np.cumsum(size)[:-1]])
    local = np.full(n_nodes, -1, dtype=np.int64)
    local[used] = np.arange(len(used)) - start[node_group[used]]
    return node_group, local, size


def _fit_size(k, items, node_group, local, size, theta, ridge):
    """Newton on every group of size k, in blocks of consecutive groups that bound memory. Items and
    nodes are sorted by group once (stably: each group's sums add up in the same order), so a
    block's items and nodes are slices, not a search over all of them."""
    order = np.argsort(items[0], kind="stable")
    group, li, lj, n, wins = (x[order] for x in items)
    nodes = np.flatnonzero((node_group >= 0) & (size[np.maximum(node_group, 0)] == k))
    nodes = nodes[np.argsort(node_group[nodes], kind="stable")]
    groups = np.unique(group)
    per_block = max(1, MAX_BLOCK // (k * k))
    for first in range(0, len(groups), per_block):
        block = groups[first:first + per_block]
        at = _between(group, block)
        fitted = _newton(k, len(block), (np.searchsorted(block, group[at]), li[at], lj[at], n[at],
                                         wins[at]), ridge)
        mine = nodes[_between(node_group[nodes], block)]
        theta[mine] = fitted[np.searchsorted(block, node_group[mine]), local[mine]]


def _between(sorted_groups: np.ndarray, block: np.ndarray) -> slice:
    """The slice of `sorted_groups` whose values lie in block[0] .. block[-1]."""
    return slice(int(np.searchsorted(sorted_groups, block[0], side="left")),
                 int(np.searchsorted(sorted_groups, block[-1], side="right")))


def _newton(k, p, items, ridge) -> np.ndarray:
    """Newton iterations on the groups that still move; converged groups drop out, and so do their
    items, so a late iteration costs what its few slow groups need. Each step's accepted loss is
    the next step's starting loss (the same sums, not computed twice)."""
    theta = np.zeros((p, k))
    active = np.arange(p)
    row, li, lj, n, wins = items
    loss = _block_loss(theta, items, ridge)
    position = np.full(p, -1)
    for _ in range(NEWTON_STEPS):
        position[active] = np.arange(len(active))
        subset = (position[row], li, lj, n, wins)
        theta[active], moved, loss = _newton_step(theta[active], subset, ridge, loss)
        position[active] = -1
        still = moved > NEWTON_TOLERANCE
        active, loss = active[still], loss[still]
        if len(active) == 0:
            break
        keep = still[subset[0]]
        row, li, lj, n, wins = row[keep], li[keep], lj[keep], n[keep], wins[keep]
    return theta


def _newton_step(theta, items, ridge, loss) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One damped Newton step per group (θ of local node 0 stays 0), halving the step of each
    group whose loss would rise (up to 40 tries, then it stays); returns (θ, how far it moved,
    its loss)."""
    grad, hess = _block_derivatives(theta, items, ridge)
    step = np.zeros_like(theta)
    step[:, 1:] = np.linalg.solve(hess[:, 1:, 1:], grad[:, 1:, None])[..., 0]
    t = np.ones((len(theta), 1))
    new_theta = theta - t * step
    new_loss = _block_loss(new_theta, items, ridge)
    worse = new_loss > loss + 1e-12 * (1 + np.abs(loss))
    for _ in range(39):
        if not worse.any():
            break
        t[worse] /= 2
        new_theta[worse] = theta[worse] - t[worse] * step[worse]
        new_loss[worse] = _block_loss(new_theta[worse], _items_of(items, worse), ridge)
        worse = new_loss > loss + 1e-12 * (1 + np.abs(loss))
    new_theta[worse], new_loss[worse] = theta[worse], loss[worse]
    return new_theta, np.max(np.abs(new_theta - theta), axis=1), new_loss


def _items_of(items, groups: np.ndarray) -> tuple:
    """The items of the groups where `groups` (a mask) is True, rows renumbered among them."""
    row = items[0]
    mine = groups[row]
    renumber = np.cumsum(groups) - 1
    return (renumber[row[mine]], *(x[mine] for x in items[1:]))


def _block_loss(theta, items, ridge) -> np.ndarray:
    row, li, lj, n, wins = items
    d = theta[row, li] - theta[row, lj]
    per_item = wins * np.logaddexp(0, -d) + (n - wins) * np.logaddexp(0, d)
    return np.bincount(row, per_item, minlength=len(theta)) + 0.5 * ridge * np.sum(theta**2, axis=1)


def _block_derivatives(theta, items, ridge):
    row, li, lj, n, wins = items
    p, k = theta.shape
    s = 1 / (1 + np.exp(-(theta[row, li] - theta[row, lj])))
    gd, h = n * s - wins, n * s * (1 - s)
    grad = (np.bincount(row * k + li, gd, minlength=p * k)
            - np.bincount(row * k + lj, gd, minlength=p * k)).reshape(p, k) + ridge * theta
    base = row * k * k
    cells = np.concatenate([base + li * k + li, base + lj * k + lj, base + li * k + lj, base + lj * k + li])
    weights = np.concatenate([h, h, -h, -h])
    hess = np.bincount(cells, weights, minlength=p * k * k).reshape(p, k, k) + ridge * np.eye(k)
    return grad, hess


def choose_prior(group, i, j, votes: dict, seed: int = 0) -> float:
    """The prior precision λ of the scores (θ ~ N(0, 1/λ)) from PRIOR_GRID with the lowest 2-fold
    cross-validated log-loss: each item's votes are split at random, a ridge-λ Bradley–Terry fit on
    one half predicts the other (empirical Bayes by cross-validation; Hastie et al. 2009, 7.10).

    Strong, consistent preferences (9 of 10 votes) want a wide prior, i.e. a small λ:
    >>> votes = {"lo": np.array([9, 9]), "hi": np.array([1, 1]), "ties": np.zeros(2)}
    >>> choose_prior(np.zeros(2, int), np.array([0, 1]), np.array([1, 2]), votes)
    0.1
    """
    rng = np.random.default_rng(seed)
    kinds = ("lo", "hi", "ties")
    half = {k: rng.binomial(np.asarray(votes[k], dtype=np.int64), 0.5) for k in kinds}
    folds = (half, {k: np.asarray(votes[k]) - half[k] for k in kinds})
    width = int(max(np.max(i, initial=-1), np.max(j, initial=-1))) + 1
    losses = []
    for ridge in PRIOR_GRID:
        total = 0.0
        for train, test in (folds, folds[::-1]):
            n_train, p_train = _n_and_share(train)
            seen = n_train > 0
            theta = np.zeros(width)
            fit = bradley_terry_fit(group[seen], i[seen], j[seen], n_train[seen], p_train[seen], ridge)
            theta[:len(fit)] = fit
            total += float(item_log_loss(theta, i, j, *_n_and_share(test)).sum())
        losses.append(total)
    return PRIOR_GRID[int(np.argmin(losses))]


def _n_and_share(counts: dict) -> tuple[np.ndarray, np.ndarray]:
    n = counts["lo"] + counts["hi"] + counts["ties"]
    return n, (counts["lo"] + 0.5 * counts["ties"]) / np.maximum(n, 1)


def laplace_sd(theta, node_i, node_j, n, prior: float) -> np.ndarray:
    """Posterior sd of each score under a N(0, 1/prior) prior, by the Laplace approximation with
    a diagonal Hessian: 1 / sqrt(prior + Σ_items n σ(1 − σ)) (MacKay 2003, ch. 27).

    One pair of equal responses judged 12 times, prior 1: 1 / sqrt(1 + 12/4) = 0.5.
    >>> laplace_sd(np.zeros(2), np.array([0]), np.array([1]), np.array([12.0]), 1.0).tolist()
    [0.5, 0.5]
    """
    s = 1 / (1 + np.exp(-(theta[node_i] - theta[node_j])))
    info = np.bincount(node_i, n * s * (1 - s), len(theta)) + np.bincount(node_j, n * s * (1 - s), len(theta))
    return 1 / np.sqrt(prior + info)
