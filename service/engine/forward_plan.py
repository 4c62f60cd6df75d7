"""How the rows waiting in one pool become forwards: sorted by length, then cut where a cut pays.

A forward of `rows` rows padded to its longest row costs about

    seconds = a + b * rows * longest

a fixed part `a` per forward (a Python call per module and op, a kernel launch per op on a GPU,
the pipe to a forward process) and a part `b` per padded token. In padded tokens, a forward costs
`a / b` before it does any work: measured here for the tiny model on one thread, a = 1.5 ms and
b = 8 us, ~190 tokens; the 5M model ~17; under /score's load on the 2-core machine the batcher
learned 140-260 for the tiny model's forward processes and 31-81 for the 5M model's. On a GPU that
launches more than it computes (the H200's 135M model: 31 ms for 1 row, 36 ms for 64 rows of 300 tokens),
a / b is tens of thousands of tokens and one forward should take everything.

`plan_by_cost` cuts the length-sorted rows into consecutive groups minimising the pool's total,
sum(a / b + rows * longest): a shortest path over cut points (dynamic programming, O(n k) for n
rows and at most k in a forward). It needs a / b, which `ForwardCost` learns per model from the
forwards the batcher times: a weighted least-squares line through (padded tokens, seconds) with
relative weights 1 / seconds^2 (forwards span 1-100 ms; unweighted, the large ones' noise and their
attention's extra cost would swamp the fixed part) and exponential forgetting, so it follows the
machine's load (the batcher keeps one per model: a swapped-in model starts afresh). Until it
has seen enough forwards of different sizes, `plan_forwards` cuts by a padding limit instead
(BRADLEY_MAX_PADDING; setting it turns the learning off).

A forward that packs its rows (rm/model/packed.py, a decoder on a CPU) computes no padding; the batcher
learns its line in real tokens and still cuts as above, as if padding cost: a heuristic, not a
model of a packed forward's cost, kept because its small forwards measured faster per token on a
CPU than one forward of the whole pool per worker (tiny model, one thread, pools of 16 random
hh-rlhf rows, 3 alternating measures: cut 523-723 items/s, one forward a worker 477-681; packed
forwards of 1,024-2,048 tokens ran 881-938 items/s, of 4,096-8,192 tokens 634-856, plausibly as
the smaller ones' activations fit the 4 MiB L2 cache).

    >>> plan_by_cost([10, 10, 11, 20], max_tokens=100, max_items=8, overhead_tokens=5)
    [[0, 1, 2], [3]]
    >>> plan_by_cost([10, 10, 11, 20], max_tokens=100, max_items=8, overhead_tokens=50)
    [[0, 1, 2, 3]]
"""

from __future__ import annotations

import math
from collections.abc import Sequence

EXACT_ROWS = 128  # pools up to this many rows are cut exactly


def plan_forwards(lengths: Sequence[int], max_tokens: int, max_items: int,
                  max_padding: float = float("inf")) -> list[list[int]]:
    """Split rows into forwards by a padding limit: rows sorted by length; each forward's padded size
    (rows x longest row) within `max_tokens`, its rows within `max_items`, and its padding within
    `max_padding` x its real tokens. A row longer than `max_tokens` gets a forward of its own.
    Returns the row indices of each forward.

    >>> plan_forwards([5, 1, 4, 2], max_tokens=8, max_items=8)
    [[1, 3], [2], [0]]
    >>> plan_forwards([1, 1, 1], max_tokens=100, max_items=2)
    [[0, 1], [2]]
    >>> plan_forwards([10, 10, 11, 20], max_tokens=100, max_items=8, max_padding=0.1)
    [[0, 1, 2], [3]]
    """
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    forwards: list[list[int]] = []
    current: list[int] = []
    real = 0
    for i in order:
        # sorted ascending, so row i is the longest of the forward if it joins
        padded = (len(current) + 1) * lengths[i]
        if current and (padded > max_tokens or len(current) >= max_items
                        or padded > (1 + max_padding) * (real + lengths[i])):
            forwards.append(current)
            current, real = [], 0
        current.append(i)
        real += lengths[i]
    if current:
        forwards.append(current)
    return forwards


def plan_by_cost(lengths: Sequence[int], max_tokens: int, max_items: int,
                 overhead_tokens: float) -> list[list[int]]:
    """Split rows into forwards of consecutive length-sorted rows with the least total cost,
    sum over forwards of (overhead_tokens + rows x longest row), within the same `max_tokens` and
    `max_items` limits as `plan_forwards`. Consecutive sorted rows suffice: give any plan's forwards,
    the one with the longest row first, the same numbers of rows from the top of the sorted order,
    and no forward's longest row grows (the k-th gets rows no longer than its old longest, since at
    most the first k-1 forwards held longer ones). With an infinite overhead, forwards are as large
    as the limits allow. Pools of more than EXACT_ROWS rows are cut between units of
    ceil(rows / EXACT_ROWS) consecutive sorted rows, which keeps the work near 1 ms a pool."""
    if math.isinf(overhead_tokens):
        return plan_forwards(lengths, max_tokens, max_items)
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    if not order:
        return []
    whole = len(order) * lengths[order[-1]]
    if len(order) <= max_items and whole <= max_tokens and whole <= overhead_tokens:
        return [order]  # one forward: any second would cost more than all the padding
    # units of consecutive sorted rows, each within the limits on its own: one row each up to
    # EXACT_ROWS rows, else the padding-free cut of plan_forwards at ceil(rows / EXACT_ROWS) a unit
    units = plan_forwards(lengths, max_tokens, min(-(-len(order) // EXACT_ROWS), max_items))
    starts = _cheapest_starts([len(u) for u in units], [lengths[u[-1]] for u in units],
                              max_tokens, max_items, overhead_tokens)
    return [[i for unit in units[a:b] for i in unit]
            for a, b in zip(starts, [*starts[1:], len(units)], strict=True)]


def _cheapest_starts(counts: list[int], longest: list[int], max_tokens: int, max_items: int,
                     overhead: float) -> list[int]:
    """Where each forward starts (a unit index) in the cheapest plan: best[j] is the least cost of
    the first j units, best[j] = min over i of best[i] + overhead + rows(i, j) x longest[j - 1].
    A forward [i, j) that splitting at its middle m would make cheaper, rows(i, m) x (longest[j-1] -
    longest[m-1]) > overhead, ends the search for j: any earlier start splits the same way."""
    before = [0]
    for count in counts:
        before.append(before[-1] + count)
    best, start = [0.0] + [math.inf] * len(counts), [0] * (len(counts) + 1)
    for j in range(1, len(counts) + 1):
        top = longest[j - 1]
        for i in range(j - 1, -1, -1):
            rows, middle = before[j] - before[i], (i + j) // 2
            if rows > max_items or (i < j - 1 and rows * top > max_tokens) \
                    or (before[middle] - before[i]) * (top - longest[middle - 1]) > overhead:
                break
            cost = best[i] + overhead + rows * top
            if cost <= best[j]:  # ties: the larger forward
                best[j], start[j] = cost, i
    starts, j = [], len(counts)
    while j:
        starts.append(start[j])
        j = start[j]
    return starts[::-1]


def cut_pool(lengths: Sequence[int], max_tokens: int, max_items: int,
             max_padding: float = math.inf, overhead_tokens: float | None = None,
             workers: int = 1) -> list[list[int]]:
    """How the batcher cuts one pool: by cost once a forward's overhead is known, no forward taking
    more than its share of the pool per worker (the workers run side by side); until then by the
    padding limit."""
    if overhead_tokens is None:
        return plan_forwards(lengths, max_tokens, max_items, max_padding)
    share = -(-len(lengths) // max(workers, 1))
    return plan_by_cost(lengths, max_tokens, min(share, max_items), overhead_tokens)


class ForwardCost:
    """a / b of one model's forwards (seconds = a + b x padded tokens), learned from timings.

    Sums of weight w = decay^age / seconds^2 over (x = padded tokens, y = seconds) give the
    weighted least-squares line: b = cov_w(x, y) / var_w(x), a = mean_w(y) - b mean_w(x). Known
    once `min_forwards` were seen and x varied (coefficient of variation >= `min_spread`) and the
    line has a fixed part (a > 0); the last such estimate holds while the data stops telling a and
    b apart.

    >>> cost = ForwardCost()
    >>> for padded in [100, 400, 1600] * 12:  # a = 2 ms, b = 10 us: 200 tokens
    ...     cost.observe(padded, 0.002 + 0.00001 * padded)
    >>> round(cost.overhead_tokens)
    200
    """

    def __init__(self, decay: float = 0.99, min_forwards: int = 32, min_spread: float = 0.25):
        self.decay, self.min_forwards, self.min_spread = decay, min_forwards, min_spread
        self.seen = 0
        self._sums = [0.0] * 5  # sum of w, w x, w x^2, w y, w x y
        self.overhead_tokens: float | None = None

    def observe(self, padded: int, seconds: float) -> None:
        if seconds <= 0 or padded <= 0:
            return
        w, x = 1.0 / (seconds * seconds), float(padded)
        terms = (w, w * x, w * x * x, w * seconds, w * x * seconds)
        self._sums = [self.decay * s + t for s, t in zip(self._sums, terms, strict=True)]
        self.seen += 1
        if self.seen >= self.min_forwards:
            self._estimate()

    def _estimate(self) -> None:
        sw, sx, sxx, sy, sxy = self._sums
        mean_x = sx / sw
        var_x = sxx / sw - mean_x * mean_x
        if var_x < (self.min_spread * mean_x) ** 2:
            return
        b = (sxy / sw - mean_x * sy / sw) / var_x
        a = sy / sw - b * mean_x
        if a <= 0:  # no fixed part: costs growing faster than the tokens (attention) read as a line
            return
        # tokens that cost nothing measurable (a millionth of a forward): no cut is worth making
        self.overhead_tokens = math.inf if b * mean_x <= 1e-6 * a else a / b
