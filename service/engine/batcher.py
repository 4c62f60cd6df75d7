"""Dynamic micro-batching for /score: many small requests, one model worker, few large forwards.

Requests arrive already tokenized (token-id lists) together with the scorer they were tokenized for,
and wait in one queue. A single worker thread takes the oldest request, keeps collecting until the
batch holds `max_batch_items` items or `max_batch_tokens` tokens, or `max_wait_s` has passed since
that request arrived, then plans the batch's forwards (`plan_forwards`): rows sorted by length (so
rows of similar length share a forward and padding stays small), cut into forwards of at most
`max_batch_tokens` padded tokens (rows x longest row), `max_batch_items` rows and `max_padding`
padded tokens per real one. Forwards run one after another on the worker thread, in this process
(on a GPU the forward is the cost; the event loop meanwhile serves HTTP). Scores go back to each
request's event loop in one call per forward, for the requests whose every row is scored.

Fairness: a request bigger than what is left of a batch's budget gives the batch only the rows that
fit, and its remaining rows go to the back of the queue, so requests that arrived meanwhile are
in the next batch rather than behind the whole of a large one (round robin, one batch at a time).
A small request therefore waits about one batch for any large one, however large.

Batch independence is the scorer's contract (one forward whose per-row result ignores the
other rows: attention masks, no cross-row normalisation); the batcher only regroups rows, and never
mixes two scorers in one forward, which is what makes a hot model swap safe: a request that was
tokenized for the old model is scored by the old model.

    >>> import asyncio
    >>> def fake(ids):  # a deterministic stand-in for RewardModel.score_encoded
    ...     return [float(sum(row)) for row in ids]
    >>> async def demo():
    ...     batcher = Batcher(max_batch_tokens=64, max_batch_items=8, max_wait_s=0.001).start()
    ...     a, b = await asyncio.gather(batcher.score(fake, [[1, 2], [3]]), batcher.score(fake, [[4]]))
    ...     batcher.close()
    ...     return a, b, batcher.stats["batches"] <= 2
    >>> asyncio.run(demo())
    ([3.0, 3.0], [4.0], True)
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

Scorer = Callable[[list[list[int]]], Sequence]  # a result per row: its score (or a tuple of them)


class BatcherError(ValueError):
    """Base of the batcher's refusals; the HTTP edge turns these into 503 with Retry-After."""


class QueueFull(BatcherError):
    """More items are waiting than `max_queue_items`: the client should retry later."""


class ShuttingDown(BatcherError):
    """The server is draining its queue before exit and accepts no new work."""


@dataclass(eq=False)
class _Job:
    scorer: Scorer
    ids: list[list[int]]
    future: asyncio.Future
    loop: asyncio.AbstractEventLoop
    enqueued: float = field(default_factory=time.monotonic)
    taken: int = 0  # rows handed to batches so far (under the lock)
    done: int = 0   # rows scored or failed (the worker thread only)
    scores: list[float] = field(default_factory=list)
    error: BaseException | None = None

    def __post_init__(self):
        self.scores = [0.0] * len(self.ids)


Row = tuple[_Job, int]  # row k of a job


def plan_forwards(lengths: Sequence[int], max_tokens: int, max_items: int,
                  max_padding: float = float("inf")) -> list[list[int]]:
    """Split rows into forwards: rows sorted by length; each forward's padded size
    (rows x longest row) within `max_tokens`, its rows within `max_items`, and its padding within
    `max_padding` x its real tokens (on a CPU a padded token costs as much as a real one, so waste
    is worth avoiding; a GPU prefers big batches). A row longer than `max_tokens` gets a forward
    of its own. Returns the row indices of each forward.

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


class Batcher:
    """One queue, one worker thread. `await score(scorer, ids)` from any event loop."""

    def __init__(self, max_batch_tokens: int = 16384, max_batch_items: int = 256,
                 max_wait_s: float = 0.003, max_queue_items: int = 50_000,
                 max_padding: float = float("inf"),
                 on_forward: Callable[[int, int, int, float], None] | None = None):
        if max_batch_tokens < 1 or max_batch_items < 1 or max_wait_s < 0:
            raise ValueError("batch limits must be positive and max_wait_s non-negative")
        self.max_batch_tokens, self.max_batch_items = max_batch_tokens, max_batch_items
        self.max_wait_s, self.max_queue_items = max_wait_s, max_queue_items
        self.max_padding = max_padding
        self.on_forward = on_forward  # (rows, tokens, padded_tokens, seconds) after each forward
        self._queue: deque[_Job] = deque()
        self._queued_items = 0
        self._cond = threading.Condition()
        self._closing = False
        self._thread: threading.Thread | None = None
        self.stats = {"batches": 0, "forwards": 0, "items": 0}

    # -- client side (event loop) ----------------------------------------------------------------

    @property
    def queued_items(self) -> int:
        return self._queued_items

    async def score(self, scorer: Scorer, ids: list[list[int]]) -> list[float]:
        if not ids:
            return []
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self.submit(scorer, ids, future, loop)
        return await future

    def submit(self, scorer: Scorer, ids: list[list[int]], future: asyncio.Future,
               loop: asyncio.AbstractEventLoop) -> None:
        """Queue rows whose scores resolve `future` on `loop`; callable from any thread (the
        tokenizer thread hands its requests straight here: service/engine/encoder.py `then`). Raises
        QueueFull or ShuttingDown instead of queueing."""
        if not ids:
            loop.call_soon_threadsafe(_resolve, [(future, [])])
            return
        job = _Job(scorer, ids, future, loop)
        with self._cond:
            if self._closing:
                raise ShuttingDown("the server is shutting down; retry against another replica")
            if self._queued_items + len(ids) > self.max_queue_items:
                raise QueueFull(f"{self._queued_items} items are queued (limit "
                                f"{self.max_queue_items}); retry shortly or send smaller requests")
            self._queue.append(job)
            self._queued_items += len(ids)
            self._cond.notify()

    # -- lifecycle -------------------------------------------------------------------------------

    def start(self) -> Batcher:
        if self._thread is None:
            self._thread = threading.Thread(target=self._work, name="bradley-batcher", daemon=True)
            self._thread.start()
        return self

    def hurry(self) -> None:
        """Shutdown has begun: stop waiting for batches to fill, score what is queued now."""
        with self._cond:
            self.max_wait_s = 0.0
            self._cond.notify_all()

    def close(self, timeout: float | None = 30.0) -> bool:
        """Stop taking work, score everything already queued, then stop the worker.
        Returns False when the queue did not drain within `timeout` seconds."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout)
            return not self._thread.is_alive()
        return True

    # -- worker side -----------------------------------------------------------------------------

    def _work(self) -> None:
        while (rows := self._collect()) is not None:
            self._run(rows)
            del rows  # while waiting, hold no job: a swapped-out model goes

    def _run(self, rows: list[Row]) -> None:
        for scorer, forward in self._plan(rows):
            self._forward(scorer, forward)
            self._finish(forward)
        self.stats["batches"] += 1

    def _collect(self) -> list[Row] | None:
        """Block for the oldest job, then gather rows until a limit or its wait deadline. A job that
        does not fit whole gives the rows that do and goes to the back of the queue. None once
        closing and nothing is left."""
        with self._cond:
            while not self._queue:
                if self._closing:
                    return None
                self._cond.wait()
            first_arrival = self._queue[0].enqueued
            rows: list[Row] = []
            tokens = 0
            while True:
                while self._queue and len(rows) < self.max_batch_items and tokens < self.max_batch_tokens:
                    job = self._queue.popleft()
                    while (job.taken < len(job.ids) and len(rows) < self.max_batch_items
                           and tokens < self.max_batch_tokens):
                        tokens += len(job.ids[job.taken])
                        rows.append((job, job.taken))
                        job.taken += 1
                    if job.taken < len(job.ids):
                        self._queue.append(job)
                full = len(rows) >= self.max_batch_items or tokens >= self.max_batch_tokens
                remaining = first_arrival + self.max_wait_s - time.monotonic()
                if full or self._closing or remaining <= 0:
                    break
                self._cond.wait(remaining)
            self._queued_items -= len(rows)
            return rows

    def _plan(self, rows: list[Row]) -> list[tuple[Scorer, list[Row]]]:
        """The batch's forwards: rows grouped by scorer (two models never share a forward), each
        group cut by `plan_forwards`."""
        by_scorer: dict[Scorer, list[Row]] = {}
        for job, k in rows:
            by_scorer.setdefault(job.scorer, []).append((job, k))
        return [(scorer, [group[i] for i in forward]) for scorer, group in by_scorer.items()
                for forward in plan_forwards([len(job.ids[k]) for job, k in group],
                                             self.max_batch_tokens, self.max_batch_items,
                                             self.max_padding)]

    def _forward(self, scorer: Scorer, rows: list[Row]) -> None:
        pending = [(job, k) for job, k in rows if job.error is None]
        if not pending:
            return
        batch = [job.ids[k] for job, k in pending]
        started = time.perf_counter()
        try:
            scores = scorer(batch)
            if len(scores) != len(pending):
                raise RuntimeError(f"scorer returned {len(scores)} scores for {len(pending)} rows")
        except Exception as exc:  # noqa: BLE001 - one failing forward fails only its requests
            for job, _ in pending:
                job.error = exc
            return
        seconds = time.perf_counter() - started
        self.stats["forwards"] += 1
        self.stats["items"] += len(pending)
        if self.on_forward is not None:
            self.on_forward(len(batch), sum(map(len, batch)), max(map(len, batch)) * len(batch),
                            seconds)
        for (job, k), score in zip(pending, scores, strict=True):
            job.scores[k] = score  # a float, or an ensemble lane's tuple (service/engine/ensemble.py)

    def _finish(self, rows: list[Row]) -> None:
        finished = {}
        for job, _ in rows:
            job.done += 1
            if job.done == len(job.ids):
                finished[id(job)] = job
        deliver([(job.loop, job.future, job.error or job.scores) for job in finished.values()])


def deliver(results: list[tuple[asyncio.AbstractEventLoop, asyncio.Future, object]]) -> None:
    """Resolve each (loop, future, result or exception) with one thread-safe callback per event
    loop, not one per request."""
    by_loop: dict[asyncio.AbstractEventLoop, list] = {}
    for loop, future, result in results:
        by_loop.setdefault(loop, []).append((future, result))
    for loop, pairs in by_loop.items():
        try:
            loop.call_soon_threadsafe(_resolve, pairs)
        except RuntimeError:  # the loop was closed; nobody is waiting any more
            pass


def _resolve(pairs: list) -> None:
    for future, result in pairs:
        if future.done():  # the client went away and the request was cancelled
            continue
        if isinstance(result, BaseException):
            future.set_exception(result)
        else:
            future.set_result(result)
