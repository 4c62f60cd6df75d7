"""service/engine/encoder.py: small requests that queue while the tokenizer thread works are encoded in one
call, each gets exactly its own ids, and a request that breaks the shared call fails alone."""

import asyncio
import threading

import pytest

from service.engine.batcher import ShuttingDown
from service.engine.encoder import EncodeQueue


class GatedModel:
    """Stands in for RewardModel.encode: ids are the texts' lengths; refuses the prompt "bad"."""

    def __init__(self):
        self.calls: list[int] = []
        self.threads: set[str] = set()
        self.gate = threading.Event()

    def encode(self, prompts, responses):
        self.calls.append(len(prompts))
        self.threads.add(threading.current_thread().name)
        self.gate.wait(10)
        if "bad" in prompts:
            raise ValueError("items[0].prompt: bad")
        return [[len(p), len(r)] for p, r in zip(prompts, responses, strict=True)]


def test_queued_requests_share_one_call_and_a_bad_one_fails_alone():
    model = GatedModel()

    async def run():
        queue = EncodeQueue("bradley-tokenize-test")
        first = asyncio.ensure_future(queue.encode(model, ["a"], ["b"]))
        await asyncio.sleep(0.2)  # the thread holds the first request at the gate
        rest = [asyncio.ensure_future(queue.encode(model, [p], ["xy"])) for p in ("cc", "bad", "ddd")]
        pair = asyncio.ensure_future(queue.encode(model, ["e", "ff"], ["", "g"]))
        await asyncio.sleep(0.2)
        model.gate.set()
        out = await asyncio.gather(first, *rest, pair, return_exceptions=True)
        queue.close()
        return out, threading.current_thread().name

    out, loop_thread = asyncio.run(run())
    assert out[0] == [[1, 1]] and out[1] == [[2, 2]] and out[3] == [[3, 2]]
    assert out[4] == [[1, 0], [2, 1]]
    assert isinstance(out[2], ValueError) and "items[0].prompt" in str(out[2])
    # the first alone, then the four queued behind it in one call (5 rows), which failed on "bad":
    # so each of them again alone
    assert model.calls == [1, 5, 1, 1, 1, 2]
    assert model.threads == {"bradley-tokenize-test"} and loop_thread not in model.threads


def test_a_closed_queue_refuses_new_work():
    async def run():
        queue = EncodeQueue("bradley-tokenize-test")
        queue.close()
        with pytest.raises(ShuttingDown):
            await queue.encode(GatedModel(), ["a"], ["b"])

    asyncio.run(run())


def test_then_takes_the_ids_over_in_the_thread_and_its_refusal_fails_only_its_request():
    """With `then` (what /score passes: Batcher.submit), the ids go from the tokenizer thread to the
    batcher and the request's answer is the scores; a `then` that refuses (a full queue) fails only
    its own request."""
    from service.engine.batcher import Batcher, QueueFull

    model = GatedModel()
    model.gate.set()
    batcher = Batcher(max_batch_tokens=64, max_batch_items=8, max_wait_s=0.001).start()
    handed: list[str] = []

    def submit(ids, future, loop):
        handed.append(threading.current_thread().name)
        batcher.submit(lambda rows: [float(sum(r)) for r in rows], ids, future, loop)

    def refuse(ids, future, loop):
        raise QueueFull("50000 items are queued")

    async def run():
        queue = EncodeQueue("bradley-tokenize-test")
        out = await asyncio.gather(queue.encode(model, ["ab", ""], ["c", "de"], then=submit),
                                   queue.encode(model, ["x"], ["y"], then=refuse),
                                   queue.encode(model, ["bad"], ["y"], then=submit),
                                   return_exceptions=True)
        queue.close()
        return out

    out = asyncio.run(run())
    batcher.close()
    assert out[0] == [3.0, 2.0]  # the scores of ids [2, 1] and [0, 2]
    assert isinstance(out[1], QueueFull) and isinstance(out[2], ValueError)
    assert handed == ["bradley-tokenize-test"]  # `then` ran in the tokenizer thread, once
