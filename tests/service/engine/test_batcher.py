"""The micro-batcher with deterministic fake scorers: merging, regrouping, isolation, draining."""

import asyncio
import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from service.engine.batcher import Batcher, QueueFull, ShuttingDown, plan_forwards


class Recorder:
    """A scorer that records every forward it was given; score = sum of ids (hand-checkable)."""

    def __init__(self, fail_on: int | None = None):
        self.calls: list[list[list[int]]] = []
        self.fail_on = fail_on

    def __call__(self, ids):
        self.calls.append([list(row) for row in ids])
        if self.fail_on is not None and any(self.fail_on in row for row in ids):
            raise ValueError("poisoned row")
        return [float(sum(row)) for row in ids]


def run(coro):
    return asyncio.run(coro)


@given(st.lists(st.integers(1, 50), min_size=1, max_size=60), st.integers(1, 200), st.integers(1, 9),
       st.sampled_from([0.0, 0.1, 0.5, float("inf")]))
@settings(max_examples=80, deadline=None)
def test_plan_forwards_covers_every_row_once_within_limits(lengths, max_tokens, max_items, pad):
    forwards = plan_forwards(lengths, max_tokens, max_items, pad)
    assert sorted(i for f in forwards for i in f) == list(range(len(lengths)))
    for f in forwards:
        assert len(f) <= max_items
        if len(f) > 1:
            padded, real = len(f) * max(lengths[i] for i in f), sum(lengths[i] for i in f)
            assert padded <= max_tokens and padded <= (1 + pad) * real


def test_plan_forwards_sorts_by_length_to_cut_padding():
    # lengths 1,9,1,9: sorted pairs (1,1) and (9,9) pad nothing; input order would pad 16 tokens
    assert plan_forwards([1, 9, 1, 9], max_tokens=18, max_items=2) == [[0, 2], [1, 3]]


def test_each_forward_is_reported_with_its_real_and_padded_tokens():
    """8 waiting rows of 1 and 9 tokens, within the padding limit only in one forward: 8 rows, 40
    real tokens, 8 x 9 padded, which is what the metrics see."""
    scorer, seen = Recorder(), []

    async def main():
        batcher = Batcher(max_batch_tokens=10_000, max_batch_items=64, max_wait_s=0.05,
                          on_forward=lambda *forward: seen.append(forward)).start()
        rows = [[1] * (1 if i % 2 else 9) for i in range(8)]
        results = await asyncio.gather(*(batcher.score(scorer, [row]) for row in rows))
        batcher.close()
        return results

    assert run(main()) == [[1.0 if i % 2 else 9.0] for i in range(8)]
    assert len(scorer.calls) == 1 and seen[0][:3] == (8, 40, 72)


def test_the_padding_limit_cuts_rows_of_different_lengths_apart():
    """The same 8 rows with at most 0.5 padded tokens per real one: the 1-token rows and the
    9-token rows go in two forwards, with no padding, in one batch."""
    scorer = Recorder()

    async def main():
        batcher = Batcher(max_batch_tokens=10_000, max_batch_items=64, max_wait_s=0.05,
                          max_padding=0.5).start()
        rows = [[1] * (1 if i % 2 else 9) for i in range(8)]
        results = await asyncio.gather(*(batcher.score(scorer, [row]) for row in rows))
        assert batcher.close(timeout=10)
        return results, batcher.stats

    results, stats = run(main())
    assert results == [[1.0 if i % 2 else 9.0] for i in range(8)]
    assert sorted(sorted(map(len, call)) for call in scorer.calls) == [[1] * 4, [9] * 4]
    assert stats == {"batches": 1, "forwards": 2, "items": 8}


def test_concurrent_single_item_requests_share_forwards():
    scorer = Recorder()

    async def main():
        batcher = Batcher(max_batch_tokens=10_000, max_batch_items=64, max_wait_s=0.05).start()
        results = await asyncio.gather(*(batcher.score(scorer, [[i, 1]]) for i in range(32)))
        batcher.close()
        return results

    results = run(main())
    assert results == [[float(i + 1)] for i in range(32)]
    assert len(scorer.calls) < 8  # 32 requests, at most a few forwards
    assert sum(len(c) for c in scorer.calls) == 32


def test_results_go_back_to_their_own_request_in_order():
    scorer = Recorder()

    async def main():
        batcher = Batcher(max_batch_tokens=12, max_batch_items=3, max_wait_s=0.02).start()
        a = batcher.score(scorer, [[5, 5, 5], [1], [2, 2]])
        b = batcher.score(scorer, [[7], [3, 3, 3, 3]])
        out = await asyncio.gather(a, b)
        batcher.close()
        return out

    assert run(main()) == [[15.0, 1.0, 4.0], [7.0, 12.0]]
    for call in scorer.calls:  # every forward within the padded-token budget
        assert len(call) == 1 or len(call) * max(map(len, call)) <= 12


def test_two_scorers_are_never_mixed_in_one_forward():
    old, new = Recorder(), Recorder()

    async def main():
        batcher = Batcher(max_wait_s=0.05).start()
        out = await asyncio.gather(*(batcher.score(old if i % 2 else new, [[i]]) for i in range(10)))
        batcher.close()
        return out

    assert run(main()) == [[float(i)] for i in range(10)]
    assert sorted(r[0] for c in old.calls for r in c) == [1, 3, 5, 7, 9]
    assert sorted(r[0] for c in new.calls for r in c) == [0, 2, 4, 6, 8]


def test_a_failing_forward_fails_only_the_requests_in_it():
    scorer = Recorder(fail_on=99)

    async def main():
        batcher = Batcher(max_batch_tokens=2, max_batch_items=1, max_wait_s=0.02).start()
        out = await asyncio.gather(batcher.score(scorer, [[99]]), batcher.score(scorer, [[4]]),
                                   return_exceptions=True)
        batcher.close()
        return out

    bad, good = run(main())
    assert isinstance(bad, ValueError) and good == [4.0]


def test_queue_limit_and_shutdown_refuse_new_work():
    async def main():
        batcher = Batcher(max_queue_items=2)  # not started: nothing leaves the queue
        pending = asyncio.ensure_future(batcher.score(Recorder(), [[1], [2]]))
        await asyncio.sleep(0)
        with pytest.raises(QueueFull, match="retry"):
            await batcher.score(Recorder(), [[3]])
        batcher.start()
        assert await pending == [1.0, 2.0]
        batcher.close()
        with pytest.raises(ShuttingDown):
            await batcher.score(Recorder(), [[3]])

    run(main())


def test_close_drains_queued_requests_without_waiting_for_fuller_batches():
    scorer = Recorder()
    results = []

    async def main():
        batcher = Batcher(max_wait_s=60.0).start()  # would wait a minute for a fuller batch
        tasks = [asyncio.ensure_future(batcher.score(scorer, [[i]])) for i in range(5)]
        await asyncio.sleep(0.05)
        closer = threading.Thread(target=batcher.close)
        closer.start()
        results.extend(await asyncio.wait_for(asyncio.gather(*tasks), timeout=10))
        closer.join()

    run(main())
    assert results == [[float(i)] for i in range(5)]


def test_hurry_flushes_a_waiting_batch():
    async def main():
        batcher = Batcher(max_wait_s=60.0).start()
        task = asyncio.ensure_future(batcher.score(Recorder(), [[2, 3]]))
        await asyncio.sleep(0.05)
        batcher.hurry()
        out = await asyncio.wait_for(task, timeout=10)
        batcher.close()
        return out

    assert run(main()) == [5.0]


def test_a_large_request_does_not_hold_small_ones_behind_it():
    """Fairness: a 20-row request (10 batches of 2 rows at this budget) is taken two rows at a time
    and its rest goes to the back of the queue, so a 1-row request queued after it is scored in the
    second or third batch (the large one was already back in the queue when it came) and answered
    before the large one, whose scores still come back whole and in order."""
    gate, scorer = threading.Event(), Recorder()

    def gated(ids):
        gate.wait(10)  # hold the first forward until both requests are queued
        return scorer(ids)

    async def main():
        batcher = Batcher(max_batch_tokens=20, max_batch_items=64, max_wait_s=0.0).start()
        order: list[str] = []

        async def send(name, ids):
            result = await batcher.score(gated, ids)
            order.append(name)
            return result

        large = asyncio.ensure_future(send("large", [[k] * 10 for k in range(20)]))
        await asyncio.sleep(0.05)
        small = asyncio.ensure_future(send("small", [[7]]))
        await asyncio.sleep(0.05)
        gate.set()
        out = await asyncio.gather(large, small)
        batcher.close()
        return out, order

    (large, small), order = run(main())
    assert order == ["small", "large"]
    assert large == [float(10 * k) for k in range(20)] and small == [7.0]
    assert scorer.calls[0] == [[0] * 10, [1] * 10]
    assert any([7] in call for call in scorer.calls[1:3]), scorer.calls[:3]
    assert max(sum(map(len, call)) for call in scorer.calls) <= 20 + 10
