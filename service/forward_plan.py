"""How the rows waiting in one pool become forwards: sorted by length, then cut where a cut pays.

A forward of `rows` rows padded to its longest row costs about

    seconds = a + b * rows * longest

a fixed part `a` per forward (a Python call per module and op, a kernel launch per op on a GPU,
the pipe to a forward process) and a part `b` per padded token. In padded tokens, a forward costs
`a / b` before it does any work: measured here for the tiny model on one thread, a = 1.5 ms and
b = 8 us, ~190 tokens; the 5M model ~17; under /score's load on the 2-core machine the batcher
learned 140-260 for the tiny model's forward processes and 31-81 for the 5M model's. On a GPU that launches
more than it computes (the H200's 135M model: 31 ms for 1 row, 36 ms for 64 rows of 300 tokens),
a / b is tens of thousands of tokens and one forward should take everything.

`plan_by_cost` cuts the length-sorted rows into consecutive groups minimising the pool's total,
sum(a / b + rows * longest): a shortest path over cut points (dynamic programming, O(n k) for n
rows and at most k in a forward). It needs a / b, which `ForwardCost` learns per model from the
forwards the batcher times: a weighted least-squares line through (padded tokens, seconds) with
relative weights 1 / seconds^2 (forwards span 1-100 ms; unweighted, the large ones' noise and their
attention's extra cost would swamp the fixed part) and exponential forgetting, so it follows the
machine's load (the batcher keeps one per model: a swapped-in model starts afresh). Until it has seen enough forwards of different
sizes, `plan_forwards` cuts by a padding limit instead (BRADLEY_MAX_PADDING; setting it turns the
learning off).

    >>> plan_by_cost([10, 10, 11, 20], max_tokens=100, max_items=8, overhead_tokens=5)
    [[0, 1, 2], [3]]
    >>> plan_by_cost([10, 10, 11, 20], max_tokens=100, max_items=8, overhead_tokens=50)
    [[0, 1, 2, 3]]
"""

from __future__ import annotations

import math
from collections.abc import Sequence


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
    as the limits allow."""
    if math.isinf(overhead_tokens):
        return plan_forwards(lengths, max_tokens, max_items)
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    sorted_lengths = [lengths[i] for i in order]
    best = [0.0] + [math.inf] * len(order)  # best[j]: least cost of the first j sorted rows
    start = [0] * (len(order) + 1)          # where the last forward of that plan starts
    for j in range(1, len(order) + 1):
        longest = sorted_lengths[j - 1]
        for i in range(j - 1, max(j - max_items, 0) - 1, -1):
            rows = j - i
            if rows > 1 and rows * longest > max_tokens:
                break
            cost = best[i] + overhead_tokens + rows * longest
            if cost < best[j]:
                best[j], start[j] = cost, i
    forwards, j = [], len(order)
    while j:
        forwards.append(order[start[j]:j])
        j = start[j]
    return forwards[::-1]


class ForwardCost:
    """a / b of one model's forwards (seconds = a + b x padded tokens), learned from timings.

    Sums of weight w = decay^age / seconds^2 over (x = padded tokens, y = seconds) give the
    weighted least-squares line: b = cov_w(x, y) / var_w(x), a = mean_w(y) - b mean_w(x). Known
    once `min_forwards` were seen and x varied (coefficient of variation >= `min_spread`); then
    the last such estimate holds while the data stops telling a and b apart.

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
        # tokens that cost nothing measurable (a millionth of a forward): no cut is worth making
        self.overhead_tokens = math.inf if b * mean_x <= 1e-6 * a else max(a, 0.0) / b
