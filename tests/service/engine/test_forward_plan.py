"""Cutting a pool into forwards by their cost, and learning that cost from timed forwards."""

import asyncio
import math
import random
import time

from hypothesis import given, settings
from hypothesis import strategies as st

from service.engine import forward_plan
from service.engine.batcher import Batcher
from service.engine.forward_plan import ForwardCost, plan_by_cost, plan_forwards


def cost(lengths, forwards, overhead):
    return sum(overhead + len(f) * max(lengths[i] for i in f) for f in forwards)


def feasible(lengths, forwards, max_tokens, max_items):
    return all(len(f) <= max_items and (len(f) == 1 or len(f) * max(lengths[i] for i in f) <= max_tokens)
               for f in forwards)


def partitions(items):
    """Every way to split `items` into non-empty groups, in any order (Bell(n) of them)."""
    if not items:
        yield []
        return
    first, rest = items[0], items[1:]
    for smaller in partitions(rest):
        for k in range(len(smaller)):
            yield smaller[:k] + [[first, *smaller[k]]] + smaller[k + 1:]
        yield [[first], *smaller]


lengths_st = st.lists(st.integers(1, 40), min_size=1, max_size=7)


@given(lengths_st, st.integers(1, 120), st.integers(1, 7), st.sampled_from([0, 3, 17, 200]))
@settings(max_examples=150, deadline=None)
def test_plan_by_cost_is_the_cheapest_of_every_split_not_only_sorted_ones(lengths, max_tokens,
                                                                         max_items, overhead):
    """Brute force over all set partitions (877 for 7 rows): the exchange argument in
    plan_by_cost's docstring says consecutive sorted rows lose nothing; this holds it to that."""
    planned = plan_by_cost(lengths, max_tokens, max_items, overhead)
    assert sorted(i for f in planned for i in f) == list(range(len(lengths)))
    assert feasible(lengths, planned, max_tokens, max_items)
    best = min(cost(lengths, p, overhead) for p in partitions(list(range(len(lengths))))
               if feasible(lengths, p, max_tokens, max_items))
    assert cost(lengths, planned, overhead) == best


def test_plan_by_cost_by_hand():
    # rows 1,1,1,9: one forward pads three rows to 9 (4 x 9 = 36 tokens + 10); two cost 3 + 9 + 20
    assert plan_by_cost([9, 1, 1, 1], max_tokens=100, max_items=8, overhead_tokens=10) == [[1, 2, 3], [0]]
    # a forward worth 30 tokens: padding 24 is cheaper than a second forward
    assert plan_by_cost([9, 1, 1, 1], max_tokens=100, max_items=8, overhead_tokens=30) == [[1, 2, 3, 0]]
    # no cost per forward but within the limits: as big as they allow, like an unbounded padding
    assert plan_by_cost([3, 1, 2], 100, 2, math.inf) == plan_forwards([3, 1, 2], 100, 2) == [[1, 2], [0]]
    # no cost per forward at all: equal rows still share one (ties go to the larger forward)
    assert plan_by_cost([5, 5, 5, 5], 100, 8, 0) == [[0, 1, 2, 3]]


def test_large_pools_are_cut_in_units_close_to_the_exact_cut():
    """512 rows (64 clients x 8 items) are cut between units of 4 sorted rows: within 1% of the
    exact cost (the exact cut being the same function on units of one row, EXACT_ROWS raised)."""
    rng = random.Random(0)
    lengths = [rng.randint(30, 380) for _ in range(512)]
    units = plan_by_cost(lengths, 16384, 256, 200)
    assert sorted(i for f in units for i in f) == list(range(512))
    assert feasible(lengths, units, 16384, 256)
    saved, forward_plan.EXACT_ROWS = forward_plan.EXACT_ROWS, 10_000
    try:
        exact = plan_by_cost(lengths, 16384, 256, 200)
    finally:
        forward_plan.EXACT_ROWS = saved
    assert cost(lengths, exact, 200) <= cost(lengths, units, 200) <= 1.01 * cost(lengths, exact, 200)


def test_forward_cost_recovers_a_noisy_line():
    """a = 2.5 ms, b = 12 us (a / b = 208 tokens, what the tiny model's forward processes took
    under load), sizes as the batcher makes them, +-15% noise on every timing."""
    rng, learned = random.Random(0), ForwardCost()
    for _ in range(400):
        padded = rng.choice([40, 120, 300, 600, 1200, 2400, 3600])
        learned.observe(padded, (0.0025 + 12e-6 * padded) * rng.uniform(0.85, 1.15))
    assert 150 < learned.overhead_tokens < 270


def test_forward_cost_waits_for_enough_varied_forwards_then_holds():
    learned = ForwardCost(decay=0.5, min_forwards=8)
    for _ in range(7):
        learned.observe(100, 0.002)
        learned.observe(0, 0.001)  # nothing learned from an empty forward
    assert learned.overhead_tokens is None  # 7 forwards, all alike
    learned.observe(100, 0.002)
    assert learned.overhead_tokens is None  # 8, but one size cannot tell a from b
    for padded in [100, 1000] * 10:  # a = 1 ms, b = 10 us
        learned.observe(padded, 0.001 + 1e-5 * padded)
    assert abs(learned.overhead_tokens - 100) < 1
    for _ in range(200):  # the plan now makes one size only: nothing tells a from b, it holds
        learned.observe(1000, 0.011)
    assert abs(learned.overhead_tokens - 100) < 1


def test_forward_cost_without_a_fixed_part_is_not_learned():
    """Costs that grow faster than the tokens (attention's square) fit a line through or below
    the origin: no overhead to learn, so the padding limit stays (an overhead of 0 would make
    every row a forward of its own)."""
    learned = ForwardCost()
    for padded in [100, 400, 1600, 6400] * 10:
        learned.observe(padded, 1e-6 * padded + 1e-9 * padded * padded)
    assert learned.overhead_tokens is None


def test_forward_cost_of_a_launch_bound_device_is_unbounded():
    """Every forward takes the same time whatever its size (the H200's small forwards): cutting
    saves nothing, so there is no overhead a cut could be worth."""
    learned = ForwardCost()
    for padded in [64, 9600, 300, 4000] * 10:
        learned.observe(padded, 0.031)
    assert learned.overhead_tokens == math.inf


class Timed:
    """A scorer whose forward takes `fixed + per_token x padded` seconds; it records its forwards."""

    def __init__(self, fixed: float, per_token: float):
        self.fixed, self.per_token, self.calls = fixed, per_token, []

    def __call__(self, ids):
        self.calls.append([len(row) for row in ids])
        time.sleep(self.fixed + self.per_token * len(ids) * max(map(len, ids)))
        return [0.0] * len(ids)


def run_learning(scorer, learn_cost=True):
    """40 lone requests of varied length (one forward each: the batcher learns), then 8 at once:
    four of 1 token and four of 60. Returns the learned overhead and the last pool's forwards."""
    async def main():
        batcher = Batcher(max_batch_tokens=4096, max_batch_items=64, max_wait_s=0.005,
                          max_padding=0.1, learn_cost=learn_cost).start()
        for k in range(40):
            await batcher.score(scorer, [[1] * (5 + 10 * (k % 8))])
        scorer.calls.clear()
        batcher.max_wait_s = 0.5  # the eight below must meet in one pool on a loaded machine too
        await asyncio.gather(*(batcher.score(scorer, [[1] * n]) for n in [1, 60] * 4))
        overhead = batcher.overhead_tokens(scorer)
        assert batcher.close(timeout=10)
        return overhead, sorted(map(sorted, scorer.calls))

    return asyncio.run(main())


def test_batcher_learns_to_take_everything_in_one_forward_when_size_is_free():
    overhead, calls = run_learning(Timed(fixed=0.02, per_token=0.0))
    assert not math.isnan(overhead)
    # cutting [1 x 4, 60 x 4] in two saves 236 padded tokens, less than a forward costs here;
    # the padding limit 0.1 would have cut it
    assert calls == [[1, 1, 1, 1, 60, 60, 60, 60]]


def test_batcher_learns_to_cut_when_tokens_cost_and_forwards_do_not():
    overhead, calls = run_learning(Timed(fixed=0.0, per_token=200e-6))
    assert overhead < 60  # sleep's own overshoot (and the batcher's) is the only fixed part
    assert calls == [[1, 1, 1, 1], [60, 60, 60, 60]]


def test_batcher_without_learning_keeps_the_padding_limit():
    overhead, calls = run_learning(Timed(fixed=0.02, per_token=0.0), learn_cost=False)
    assert math.isnan(overhead)
    assert calls == [[1, 1, 1, 1], [60, 60, 60, 60]]
