"""Dynamic micro-batching for /score: many small requests, one model worker, few large forwards.

Requests arrive already tokenized (token-id lists) together with the scorer they were tokenized for,
and wait in one queue. A worker thread takes the oldest request, keeps collecting until the
pool holds `max_batch_items` items or `max_batch_tokens` tokens per worker, or `max_wait_s` has
passed since that request arrived, sorts the pool's rows by length (so rows of similar length share
a forward and padding stays small), cuts them into forwards of at most `max_batch_tokens` padded
tokens (rows x longest row), and queues those forwards. Where to cut (service/engine/forward_plan.py):
with `learn_cost`, where the model's own timed forwards say a cut saves more padding than a forward
costs; until they say, and without it, at `max_padding` wasted tokens per real one. A scorer
whose forwards pack their rows (`packs_rows`, rm/model/packed.py) computes no padding: its forwards are
timed and counted by their real tokens, and still cut as if padded, a heuristic kept because it
measured faster: it keeps forwards small, and smaller packed forwards ran faster per token on
this CPU (service/engine/forward_plan.py).
Every worker takes the next planned forward when it is free, and collects a new pool only when none
is left. There is one worker unless the scorer runs forwards elsewhere (on a CPU,
service/engine/forward_pool.py: a process per worker); then the workers share one plan, so the rows of all
waiting requests are sorted together rather than split between workers first (tiny model, 64
single-sample clients, 2 forward processes: 5.1 rows per forward where a pool per worker gave 3.1).
Scores go back to each request's event loop in one call per forward, for the requests whose every
row is scored.

Fairness: a request bigger than what is left of a pool's budget gives the pool only the rows that
fit, and its remaining rows go to the back of the queue, so requests that arrived meanwhile are
in the next pool rather than behind the whole of a large one (round robin, one pool at a time).
A small request therefore waits about one pool for any large one, however large.

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
    ...     return a, b, batcher.stats["pools"] <= 2
    >>> asyncio.run(demo())
    ([3.0, 3.0], [4.0], True)
"""

from __future__ import annotations

import asyncio
import math
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from service.engine.forward_plan import ForwardCost, cut_pool

Scorer = Callable[[list[list[int]]], Sequence[float]]


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
    taken: int = 0  # rows handed to pools so far (under the lock)
    done: int = 0   # rows scored or failed
    scores: list[float] = field(default_factory=list)
    error: BaseException | None = None

    def __post_init__(self):
        self.scores = [0.0] * len(self.ids)


Row = tuple[_Job, int]  # row k of a job


class Batcher:
    """One queue, one worker thread. `await score(scorer, ids)` from any event loop."""

    def __init__(self, max_batch_tokens: int = 16384, max_batch_items: int = 256,
                 max_wait_s: float = 0.003, max_queue_items: int = 50_000,
                 max_padding: float = float("inf"), learn_cost: bool = False,
                 on_forward: Callable[[int, int, int, float], None] | None = None):
        if max_batch_tokens < 1 or max_batch_items < 1 or max_wait_s < 0:
            raise ValueError("batch limits must be positive and max_wait_s non-negative")
        self.max_batch_tokens, self.max_batch_items = max_batch_tokens, max_batch_items
        self.max_wait_s, self.max_queue_items = max_wait_s, max_queue_items
        self.max_padding, self.learn_cost = max_padding, learn_cost
        self._costs: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # scorer -> ForwardCost
        self.on_forward = on_forward  # (rows, tokens, padded_tokens, seconds) after each forward
        self._queue: deque[_Job] = deque()
        self._queued_items = 0
        lock = threading.RLock()
        self._cond = threading.Condition(lock)  # a job was queued, or closing began
        self._planned_cond = threading.Condition(lock)  # forwards were planned, or none will be
        self._planned: deque[tuple[Scorer, list[Row]]] = deque()
        self._planning = False  # a worker is collecting a pool; the others wait for its plan
        self._closing = False
        self._threads: list[threading.Thread] = []
        self._workers = 0  # how many workers a pool is collected for
        self.stats = {"pools": 0, "forwards": 0, "items": 0}  # updated under the lock

    # -- client side (event loop) ----------------------------------------------------------------

    @property
    def queued_items(self) -> int:
        return self._queued_items

    def overhead_tokens(self, scorer: Scorer) -> float:
        """What a forward of `scorer` costs before its first token, in padded tokens, as learned so
        far (NaN until then, or without `learn_cost`)."""
        with self._cond:
            known = self._known_overhead(scorer)
        return math.nan if known is None else known

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

    def start(self, workers: int = 1) -> Batcher:
        """Run `workers` worker threads (more than one only for a scorer that forwards outside this
        process); a later call with more starts the missing ones."""
        self._workers = max(self._workers, workers)
        while len(self._threads) < workers:
            thread = threading.Thread(target=self._work, daemon=True,
                                      name=f"bradley-batcher-{len(self._threads)}")
            thread.start()
            self._threads.append(thread)
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
        deadline = None if timeout is None else time.monotonic() + timeout
        for thread in self._threads:
            thread.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
        return not any(thread.is_alive() for thread in self._threads)

    # -- worker side -----------------------------------------------------------------------------

    def _work(self) -> None:
        while (forward := self._next_forward()) is not None:
            scorer, rows = forward
            self._forward(scorer, rows)
            self._finish(rows)
            del forward, scorer, rows  # while waiting, hold no job: a swapped-out model goes

    def _next_forward(self) -> tuple[Scorer, list[Row]] | None:
        """The next planned forward; when none is left, this worker collects and plans a pool
        while the others wait for its plan. None once closing and nothing is left."""
        with self._cond:
            while not self._planned:
                if self._planning:
                    self._planned_cond.wait()
                    continue
                self._planning = True
                try:
                    rows = self._collect()
                    if rows is not None:
                        self._planned.extend(self._plan(rows))
                        self.stats["pools"] += 1
                finally:
                    self._planning = False
                    self._planned_cond.notify_all()
                if rows is None:
                    return None
            return self._planned.popleft()

    def _finish(self, rows: list[Row]) -> None:
        finished = {}
        with self._cond:  # another worker may be scoring other rows of the same job
            for job, _ in rows:
                job.done += 1
                if job.done == len(job.ids):
                    finished[id(job)] = job
        _deliver(list(finished.values()))

    def _collect(self) -> list[Row] | None:
        """Block (lock held, released while waiting) for the oldest job, then gather rows until
        the pool's limits or the oldest job's wait deadline. A job that does not fit whole gives
        the rows that do and goes to the back of the queue."""
        max_items, max_tokens = self._workers * self.max_batch_items, self._workers * self.max_batch_tokens
        while not self._queue:
            if self._closing:
                return None
            self._cond.wait()
        first_arrival = self._queue[0].enqueued
        rows: list[Row] = []
        tokens = 0
        while True:
            while self._queue and len(rows) < max_items and tokens < max_tokens:
                job = self._queue.popleft()
                while job.taken < len(job.ids) and len(rows) < max_items and tokens < max_tokens:
                    tokens += len(job.ids[job.taken])
                    rows.append((job, job.taken))
                    job.taken += 1
                if job.taken < len(job.ids):
                    self._queue.append(job)
            full = len(rows) >= max_items or tokens >= max_tokens
            remaining = first_arrival + self.max_wait_s - time.monotonic()
            if full or self._closing or remaining <= 0:
                break
            self._cond.wait(remaining)
        self._queued_items -= len(rows)
        return rows

    def _plan(self, rows: list[Row]) -> list[tuple[Scorer, list[Row]]]:
        """The pool's forwards: rows grouped by scorer (two models never share a forward), each
        group cut by what its forwards cost when that is known, else by the padding limit. Called
        with the lock held; the cutting itself runs without it (the other workers wait for this
        plan anyway, and new requests need not)."""
        by_scorer: dict[Scorer, list[Row]] = {}
        for job, k in rows:
            by_scorer.setdefault(job.scorer, []).append((job, k))
        groups = [(scorer, group, self._known_overhead(scorer)) for scorer, group in by_scorer.items()]
        self._cond.release()
        try:
            return [(scorer, [group[i] for i in forward]) for scorer, group, overhead in groups
                    for forward in self._cut([len(job.ids[k]) for job, k in group], overhead)]
        finally:
            self._cond.acquire()

    def _cut(self, lengths: list[int], overhead_tokens: float | None) -> list[list[int]]:
        return cut_pool(lengths, self.max_batch_tokens, self.max_batch_items, self.max_padding,
                        overhead_tokens, self._workers)

    def _known_overhead(self, scorer: Scorer) -> float | None:
        cost = self._cost(scorer)
        return cost.overhead_tokens if cost is not None else None

    def _cost(self, scorer: Scorer) -> ForwardCost | None:
        """The scorer's learned forward cost (lock held); None without `learn_cost`, or for a scorer
        nothing can refer to weakly. Kept by the object the scorer is a method of, so it goes with
        a swapped-out model."""
        if not self.learn_cost:
            return None
        owner = getattr(scorer, "__self__", scorer)
        try:
            cost = self._costs.get(owner)
            if cost is None:
                cost = self._costs[owner] = ForwardCost()
        except TypeError:
            return None
        return cost

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
        tokens = sum(map(len, batch))
        padded = tokens if _packs(scorer) else max(map(len, batch)) * len(batch)
        with self._cond:
            self.stats["forwards"] += 1
            self.stats["items"] += len(pending)
            if (cost := self._cost(scorer)) is not None:
                cost.observe(padded, seconds)
        if self.on_forward is not None:
            self.on_forward(len(batch), tokens, padded, seconds)
        for (job, k), score in zip(pending, scores, strict=True):
            job.scores[k] = float(score)


def _packs(scorer: Scorer) -> bool:
    """Whether `scorer` packs a forward's rows into one unpadded row (rm/model/packed.py): it costs its
    real tokens, however its rows' lengths differ."""
    return bool(getattr(getattr(scorer, "__self__", scorer), "packs_rows", False))


def _deliver(jobs: list[_Job]) -> None:
    """One thread-safe callback per event loop per forward, not one per request."""
    by_loop: dict[asyncio.AbstractEventLoop, list] = {}
    for job in jobs:
        by_loop.setdefault(job.loop, []).append((job.future, job.error or job.scores))
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
