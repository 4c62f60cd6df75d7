"""Verifier calls in worker processes, each call under a wall-clock limit.

Why processes: a checker can hang (a catastrophic regex, a sympy simplification, a program stuck in
`while True`) and Python cannot interrupt a thread; math-verify's own timeouts use `signal.alarm`,
which only works on the main thread, so inside a server's threads it either raises or (with its
timeouts off) runs unbounded. A worker process can always be killed.

How: `workers` subprocesses (`python -m rm.verify.worker`), each fed by one dispatcher thread. A
request is cut into chunks (one per worker for a small request, at most `chunk` calls each) so an
idle pool spreads it over every worker; a dispatcher sends everything queued, up to `batch` calls,
as ONE message and reads back one message of checks (orjson both ways), so under load the pipe
round trips and thread wake-ups are paid per batch of requests, not per call or per request. A
call's clock starts when the worker starts it: before each call the worker writes (message, call,
start time) to a small shared page, so when the parent's wait runs out it knows which call is
running and since when, and waits on until that call's own deadline. A call past its deadline: the
worker's process group is killed (taking any program it ran with it), the call gets reward 0 and
`status: timeout`, a fresh worker starts, and the message's other calls go back on the queue (to
be run again: their checks died with the worker). A worker that dies on its own gives the call in
progress `status: error`. Nothing becomes a silent zero: every status is counted (`counts`, and the
`on_status` callback for /metrics).

    >>> with VerifierPool(workers=1, timeout_s=5) as pool:
    ...     [v.reward for v in pool.verify([("gsm8k", "#### 10", "10", None),
    ...                                     ("exact", "no", "yes", None)])]
    [1.1, 0.0]

Extra verifiers (tests, site-specific checkers) are named by import path, `{"slow": "pkg.mod:fn"}`:
the workers import them at start, since functions cannot travel to another process.
"""

from __future__ import annotations

import asyncio
import itertools
import queue
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import Future, InvalidStateError

from rm.verify.rules import VERIFIERS, Check
from rm.verify.worker import START_TIMEOUT_S, WorkerProcess

DEFAULT_TIMEOUT_S = 5.0
CHUNK = 64    # calls per chunk of a big request: each worker gets a share while others wait
BATCH = 512   # calls per message: queued chunks of many requests travel together under load
OUTSIDE_CALLS_S = 30.0  # decoding a message or answering it, between calls: bounded too

Call = tuple  # (verifier name, response, ground truth, options dict or None)


class _Request:
    """The checks of one submit(); its future completes when its last chunk is answered."""

    def __init__(self, n_chunks: int, out: list):
        self.left, self.out, self.future, self.lock = n_chunks, out, Future(), threading.Lock()

    def add_chunk(self) -> None:
        with self.lock:
            self.left += 1

    def chunk_done(self) -> None:
        with self.lock:
            self.left -= 1
            done = self.left == 0
        if done:
            try:
                self.future.set_result(self.out)
            except InvalidStateError:  # its waiter was cancelled (a client that went away)
                pass


class _Job:
    """A chunk of a request: its calls and where their checks go in the request's list."""

    def __init__(self, calls: Sequence[Call], where: Sequence[int], request: _Request):
        self.calls, self.where, self.request = calls, where, request
        self.retried = False  # sent again whole after its worker died before starting it


_tuple_new = tuple.__new__  # Check(*row) would run NamedTuple's Python-level __new__


class VerifierPool:
    def __init__(self, workers: int = 2, timeout_s: float = DEFAULT_TIMEOUT_S,
                 plugins: dict[str, str] | None = None,
                 on_status: Callable[[str, str, int], None] | None = None, chunk: int = CHUNK,
                 batch: int = BATCH):
        if workers < 1 or timeout_s <= 0 or chunk < 1:
            raise ValueError("workers and chunk must be >= 1 and timeout_s > 0")
        self.n_workers, self.timeout_s, self.chunk = workers, timeout_s, chunk
        self.batch = max(batch, chunk)
        self.plugins, self.on_status = dict(plugins or {}), on_status
        self.counts: Counter = Counter()
        self.restarts = 0
        # (priority, order, job): calls sent back after a timeout jump the queue (0), new chunks
        # wait their turn (1), the stop signals come last (2).
        self._jobs: queue.PriorityQueue = queue.PriorityQueue()
        self._order = itertools.count()
        self._threads: list[threading.Thread] = []
        self._workers: list[WorkerProcess | None] = [None] * workers
        self._ready = [threading.Event() for _ in range(workers)]
        self._lock, self._closed = threading.Lock(), False

    def __enter__(self) -> VerifierPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def names(self) -> set[str]:
        return set(VERIFIERS) | set(self.plugins)

    # -- submitting ------------------------------------------------------------------------------

    def submit(self, calls: Sequence[Call]) -> Future:
        """A Future of the checks of `calls`, in order. A request is cut into one chunk per
        worker (at most `chunk` calls each), so alone it runs on every worker at once."""
        self._ensure_started()
        n = len(calls)
        out: list = [None] * n
        size = min(self.chunk, -(-n // self.n_workers)) or 1
        starts = range(0, n, size)
        request = _Request(len(starts), out)
        if not calls:
            request.future.set_result(out)
        for start in starts:
            end = min(start + size, n)
            self._put(1, _Job(calls[start:end], range(start, end), request))
        return request.future

    def verify(self, calls: Sequence[Call]) -> list[Check]:
        return self.submit(calls).result()

    async def averify(self, calls: Sequence[Call]) -> list[Check]:
        """For the event loop: it only waits; the calls run in the worker processes."""
        return await asyncio.wrap_future(self.submit(calls))

    # -- the dispatcher threads -------------------------------------------------------------------

    def _ensure_started(self) -> None:
        with self._lock:
            if self._threads:
                return
            for slot in range(self.n_workers):
                thread = threading.Thread(target=self._serve, args=(slot,), daemon=True,
                                          name=f"bradley-verifier-{slot}")
                thread.start()
                self._threads.append(thread)

    def wait_ready(self, timeout: float = START_TIMEOUT_S) -> bool:
        """Start the workers now (rather than on the first call) and wait until all are up."""
        self._ensure_started()
        deadline = time.monotonic() + timeout
        return all(e.wait(max(0.0, deadline - time.monotonic())) for e in self._ready)

    def _spawn(self, slot: int) -> None:
        """Start this slot's worker ahead of need: a replacement must not delay the next call."""
        try:
            self._worker(slot)
        except Exception:
            pass  # the next call retries and reports the failure as `status: error`
        self._ready[slot].set()

    def _take(self) -> list[_Job] | None:
        """The next job and whatever else is queued behind it, up to `batch` calls and this
        worker's share of the queue (so slow checkers do not end a burst on one busy worker while
        the other idles); None: stop."""
        jobs = [self._jobs.get()[2]]
        if jobs[0] is None:
            return None
        size, share = len(jobs[0].calls), -(-self._jobs.qsize() // self.n_workers)
        while size < self.batch and len(jobs) <= share:
            try:
                entry = self._jobs.get_nowait()
            except queue.Empty:
                break
            if entry[2] is None or size + len(entry[2].calls) > self.batch:
                self._jobs.put(entry)  # for the next round (or the next thread to stop)
                break
            jobs.append(entry[2])
            size += len(entry[2].calls)
        return jobs

    def _serve(self, slot: int) -> None:
        self._spawn(slot)
        while (jobs := self._take()) is not None:
            try:
                self._run(slot, jobs)
            except Exception as exc:  # worker would not start: answer, do not hang the request
                why = Check(0.0, None, False, "error", detail=str(exc)[:300])
                self._answer([(job, i, why) for job in jobs for i in range(len(job.calls))
                              if job.request.out[job.where[i]] is None])
            for job in jobs:
                job.request.chunk_done()
            if self._workers[slot] is None and not self._closed:
                self._spawn(slot)

    def _worker(self, slot: int) -> WorkerProcess:
        if self._workers[slot] is None:
            self._workers[slot] = WorkerProcess(self.plugins, self.timeout_s)
        return self._workers[slot]

    def _run(self, slot: int, jobs: list[_Job]) -> None:
        """Send the jobs as one message, wait for its one answer. The deadline follows the call
        in progress: when the wait ends without an answer, the shared page says which call runs
        and since when; only a call running past the limit gets the worker killed."""
        calls = [c for job in jobs for c in job.calls]
        worker = self._worker(slot)
        try:
            seq = worker.send(calls)
        except OSError:  # it died between messages (e.g. the OOM killer): a fresh one, once
            self._replace(slot)
            worker = self._worker(slot)
            seq = worker.send(calls)
        deadline = time.monotonic() + self.timeout_s
        while True:
            try:
                line = worker.read_line(max(0.0, deadline - time.monotonic()))
            except EOFError:
                return self._lost(slot, jobs, worker.running(seq), "error", "verifier worker died")
            if line is not None:
                return self._answered(jobs, line[1])
            deadline = self._deadline(slot, jobs, worker.running(seq))
            if deadline is None:
                return None

    def _deadline(self, slot: int, jobs: list[_Job], running) -> float | None:
        """When to look again, from what the worker's page says; None: it was past its limit."""
        now = time.monotonic()
        if running is None:  # not read yet (the clock runs from a call's start)
            return now + self.timeout_s
        limit = self.timeout_s if running[0] >= 0 else OUTSIDE_CALLS_S
        if running[1] + limit > now:
            return running[1] + limit
        if running[0] < 0:
            self._lost(slot, jobs, None, "error", f"decoding or answering took over {limit:g} s")
        else:
            self._lost(slot, jobs, running, "timeout",
                       f"over the {self.timeout_s:g} s limit; worker replaced")
        return None

    def _lost(self, slot: int, jobs: list[_Job], running, status: str, detail: str) -> None:
        """Kill the worker; the call it was running gets `status`; the message's other calls
        (their results died with it) go back on the queue for whichever worker is free first."""
        self._replace(slot)
        if running is not None and running[0] >= 0:
            k = running[0]
            for job in jobs:
                culprit = k if 0 <= k < len(job.calls) else None
                self._requeue(job, culprit, status, detail, retried=False)
                k -= len(job.calls)
            return
        for job in jobs:  # it died outside any call: nobody to blame, unless it happens again
            self._requeue(job, 0 if job.retried else None, status, detail, retried=True)

    def _requeue(self, job: _Job, culprit: int | None, status: str, detail: str, retried: bool
                 ) -> None:
        if culprit is not None:
            self._answer([(job, culprit, Check(0.0, None, False, status, detail=detail))])
        rest = [i for i in range(len(job.calls)) if i != culprit]
        for start in range(0, len(rest), self.chunk):  # in chunks: the other workers share them
            part = rest[start:start + self.chunk]
            job.request.add_chunk()
            again = _Job([job.calls[i] for i in part], [job.where[i] for i in part], job.request)
            again.retried = retried
            self._put(0, again)

    def _put(self, priority: int, job: _Job | None) -> None:
        self._jobs.put((priority, next(self._order), job))

    def _answered(self, jobs: list[_Job], rows: list[list]) -> None:
        """A whole message's checks, in order (per item only C-level work: tuple.__new__ builds
        each Check, Counter counts (name, status) pairs)."""
        start = 0
        seen: Counter = Counter()
        for job in jobs:
            end = start + len(job.calls)
            out, checks = job.request.out, [_tuple_new(Check, r) for r in rows[start:end]]
            for w, v in zip(job.where, checks, strict=True):
                out[w] = v
            seen.update(zip([c[0] for c in job.calls], [v[3] for v in checks], strict=True))
            start = end
        self._count(seen)

    def _answer(self, checks: list[tuple[_Job, int, Check]]) -> None:
        seen: Counter = Counter()
        for job, i, check in checks:
            job.request.out[job.where[i]] = check
            seen[job.calls[i][0], check.status] += 1
        self._count(seen)

    def _count(self, seen: Counter) -> None:
        with self._lock:
            for (name, status), n in seen.items():
                self.counts[status] += n
                if self.on_status is not None:
                    self.on_status(name, status, n)

    def _replace(self, slot: int) -> None:
        worker, self._workers[slot] = self._workers[slot], None
        if worker is not None:
            worker.kill()
        self.restarts += 1

    def close(self) -> None:
        with self._lock:
            self._closed = True
            threads, self._threads = self._threads, []
        for _ in threads:
            self._put(2, None)
        for thread in threads:
            thread.join(timeout=10)
        for slot in range(self.n_workers):
            if self._workers[slot] is not None:
                self._replace(slot)
        with self._lock:  # a later submit starts afresh (a service that is stopped and started)
            self._ready = [threading.Event() for _ in range(self.n_workers)]
            self._closed = False
