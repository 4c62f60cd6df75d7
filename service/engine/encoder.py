"""Tokenization of small /score requests, many requests per tokenizer call, in a thread of its own.

Per request, a thread-pool hop costs a future, a wake-up of the event loop and two tokenizer calls
whose Python overhead dwarfs the Rust work for a 100-token item. Here each
request is appended to a list; one thread takes everything that queued while it was busy, encodes it
with one `RewardModel.encode` call per model (`rm.model.tokenizer.encode_many`: one fast-tokenizer call
for all prompt parts, one for all response parts) and hands the ids back with one
`call_soon_threadsafe` per event loop. Under load the batch grows by itself; alone, a request waits
for nobody. `/score` goes one step further: with `then=Batcher.submit` the ids go from this thread
straight into the scoring queue, and the event loop hears of the request again only with its scores.

Independence: `encode_many` gives every item the ids it gets alone (tests/rm/model/test_encode_many.py),
and a batch whose call fails (a template that refuses one request's messages) is encoded again
request by request, so one bad request fails only itself. Nothing here runs on the event loop.

    >>> import asyncio
    >>> class Upper:  # a stand-in for RewardModel: "ids" are the texts' lengths
    ...     def encode(self, prompts, responses):
    ...         return [[len(p), len(r)] for p, r in zip(prompts, responses)]
    >>> async def demo():
    ...     queue = EncodeQueue("bradley-tokenize-doc")
    ...     out = await asyncio.gather(queue.encode(Upper(), ["ab"], ["c"]),
    ...                                queue.encode(Upper(), ["", "xyz"], ["d", ""]))
    ...     queue.close()
    ...     return out
    >>> asyncio.run(demo())
    [[[2, 1]], [[0, 1], [3, 0]]]
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from dataclasses import dataclass

from service.engine.batcher import ShuttingDown, deliver


@dataclass(eq=False)
class _Request:
    rm: object  # what encodes: rm.model.reward_model.RewardModel (the model the request will be scored by)
    prompts: list
    responses: list[str]
    future: asyncio.Future
    loop: asyncio.AbstractEventLoop
    then: Callable | None = None  # takes (ids, future, loop) over in this thread


Then = Callable[[list, asyncio.Future, asyncio.AbstractEventLoop], None]


class EncodeQueue:
    """One thread; `await encode(rm, prompts, responses)` from any event loop."""

    def __init__(self, name: str):
        self._pending: list[_Request] = []
        self._cond = threading.Condition()
        self._closing = False
        self._thread = threading.Thread(target=self._work, name=name, daemon=True)
        self._thread.start()

    async def encode(self, rm, prompts: list, responses: list[str], then: Then | None = None):
        """The ids of every item; with `then`, whatever `then(ids, future, loop)` later resolves
        the future with: `Batcher.submit` makes it the scores, handed over in this thread without a
        round trip through the event loop between tokenizing and scoring. An exception `then`
        raises (a full queue) fails the request."""
        loop = asyncio.get_running_loop()
        request = _Request(rm, prompts, responses, loop.create_future(), loop, then)
        with self._cond:
            if self._closing:
                raise ShuttingDown("the server is shutting down; retry against another replica")
            self._pending.append(request)
            self._cond.notify()
        return await request.future

    def close(self, timeout: float | None = 30.0) -> None:
        """Encode what is queued, then stop the thread."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        self._thread.join(timeout)

    def _work(self) -> None:
        while True:
            with self._cond:
                while not self._pending and not self._closing:
                    self._cond.wait()
                if not self._pending:
                    return
                taken, self._pending = self._pending, []
            _encode_round(taken)
            del taken  # while waiting, hold no request: a swapped-out model goes with its last one


def _encode_round(taken: list[_Request]) -> None:
    by_model: dict[int, list[_Request]] = {}
    for request in taken:
        by_model.setdefault(id(request.rm), []).append(request)
    results = [pair for group in by_model.values() for pair in _encode_group(group)]
    deliver([(request.loop, request.future, result) for request, result in results
             if not _handed_on(request, result)])


def _encode_group(group: list[_Request]) -> list[tuple[_Request, object]]:
    """(request, ids or the exception) for requests of one model: one call, or one per request
    when the shared call fails."""
    rm = group[0].rm
    try:
        ids = rm.encode([p for r in group for p in r.prompts],
                        [t for r in group for t in r.responses])
    except Exception as exc:  # noqa: BLE001 - one request's failure, found by encoding each alone
        if len(group) == 1:
            return [(group[0], exc)]
        return [pair for request in group for pair in _encode_group([request])]
    out, start = [], 0
    for request in group:
        end = start + len(request.responses)
        out.append((request, ids[start:end]))
        start = end
    return out


def _handed_on(request: _Request, result) -> bool:
    """Give encoded ids to the request's `then`; False when they (or its error) go back instead."""
    if request.then is None or isinstance(result, BaseException):
        return False
    try:
        request.then(result, request.future, request.loop)
    except Exception as exc:  # noqa: BLE001 - QueueFull/ShuttingDown: this request's answer
        deliver([(request.loop, request.future, exc)])
    return True

