"""Forward processes: on a CPU, `/score`'s forwards run in worker processes of one thread each.

Why (issue 20, tiny model, 2 cores, forwards cut from 64-item windows as the batcher cuts them): in
the server process a forward ran at 0.64 of the same forward offline. One forward on 2 OpenMP
threads waits at each of its ~500 ops for both threads, so when the event loop or the load
generator holds a core, every op waits for a descheduled thread: 584 items/s alone, 234-350 beside
a competitor busy half the time. And its Python (module dispatch) takes turns with the event loop
for the interpreter lock. Two processes of one thread, each running whole forwards of their own:
730-747 items/s alone, 472-746 beside the same competitor.

The pool is a scorer like `RewardModel.score_encoded` (rows of token ids in, one score per row
out); the batcher runs one worker thread per process, and a thread waiting for its process holds
no lock. Each process loads the model folder itself (safetensors, as `RewardModel.load` does).

Wire format, one `multiprocessing` Pipe per process (bytes only, nothing is pickled): a request is
int32 [rows, length of each row, the ids of every row]; the answer is b"S" + float64 scores, or
b"E" + the error's text. An empty request asks the process to exit. A loaded process says b"R" +
its model's layout (`RewardModel.layout`, decided by a probe forward at load).

    >>> unpack_rows(pack_rows([[1, 2, 3], [4]]))
    [[1, 2, 3], [4]]
"""

from __future__ import annotations

import itertools
import logging
import multiprocessing
import queue
import signal
import threading
import weakref
from array import array

log = logging.getLogger("bradley.service")
START_TIMEOUT_S = 300.0  # import torch and transformers, load the weights


class ForwardProcessError(RuntimeError):
    """A forward process could not start, or a forward failed in it; the message says why."""


class ForwardProcessExited(ForwardProcessError):
    """The process died during this forward and was replaced: retrying works (the HTTP edge
    answers 503 with Retry-After)."""


def pack_rows(rows: list[list[int]]) -> bytes:
    packed = array("i", [len(rows)])
    packed.extend(len(row) for row in rows)
    packed.extend(itertools.chain.from_iterable(rows))
    return packed.tobytes()


def unpack_rows(message: bytes) -> list[list[int]]:
    flat = array("i")
    flat.frombytes(message)
    rows, start = [], 1 + flat[0]
    for length in flat[1:start]:
        rows.append(flat[start:start + length].tolist())
        start += length
    return rows


def _serve(conn, path: str, threads: int) -> None:
    """A forward process: load the model, then answer requests until told to stop or orphaned."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's: it drains through us
    try:
        import torch

        from rm.model.reward_model import RewardModel

        torch.set_num_threads(threads)
        model = RewardModel.load(path, device="cpu")
        layout = model.layout  # decided now (a probe forward), so the parent knows how to cut
    except Exception as exc:  # noqa: BLE001 - sent to the parent, which raises it
        conn.send_bytes(b"E" + f"{type(exc).__name__}: {exc}".encode())
        return
    conn.send_bytes(b"R" + layout.encode())
    while True:
        try:
            message = conn.recv_bytes()
        except (EOFError, OSError):  # the parent is gone
            return
        if not message:
            return
        try:
            answer = b"S" + array("d", model.score_encoded(unpack_rows(message))).tobytes()
        except Exception as exc:  # noqa: BLE001 - a bad forward fails its rows, not the process
            answer = b"E" + f"{type(exc).__name__}: {exc}".encode()
        conn.send_bytes(answer)


class ForwardPool:
    """`processes` forward processes for the model folder `path`, `threads` torch threads each."""

    def __init__(self, path: str, processes: int, threads: int = 1):
        if processes < 1:
            raise ValueError("a forward pool needs at least one process")
        self.path, self.threads = str(path), threads
        self._context = multiprocessing.get_context("spawn")  # fork would copy torch's threads
        self._idle: queue.SimpleQueue = queue.SimpleQueue()
        self.layout = ""  # how the processes lay out a forward's rows (RewardModel.layout)
        self._workers: list = []  # [process, connection]; the finalizer closes what is here
        # a swapped-out model's pool goes when its last request does, often on the event loop:
        # the processes are reaped on a thread of their own
        self._finalizer = weakref.finalize(self, _shutdown_in_background, self._workers)
        try:
            started = [self._start(n) for n in range(processes)]  # they load in parallel
            for worker in started:
                self._idle.put(self._wait_ready(worker))
        except BaseException:
            self.close()
            raise

    @property
    def processes(self) -> int:
        return len(self._workers)

    @property
    def packs_rows(self) -> bool:
        """Whether a forward costs its real tokens only (the batcher cuts by this)."""
        return self.layout == "packed"

    def score_encoded(self, ids: list[list[int]]) -> list[float]:
        """Scores of `ids` from an idle process (waits for one); a process that died is replaced."""
        if not ids:
            return []
        worker = self._idle.get()
        try:
            worker[1].send_bytes(pack_rows(ids))
            answer = worker[1].recv_bytes()
        except (EOFError, OSError):
            worker, failed = self._replace(worker)
            raise failed or ForwardProcessExited("a forward process exited during a forward; it "
                                                 "was replaced, retry the request") from None
        finally:
            self._idle.put(worker)
        if answer[:1] != b"S":
            raise ForwardProcessError(answer[1:].decode(errors="replace"))
        return array("d", answer[1:]).tolist()

    def close(self) -> None:
        """Ask every process to exit (they finish the forward they are in) and reap them."""
        if self._finalizer.detach() is not None:
            _shutdown(self._workers)

    def _start(self, n: int) -> list:
        ours, theirs = self._context.Pipe()
        process = self._context.Process(target=_serve, args=(theirs, self.path, self.threads),
                                        name=f"bradley-forward-{n}", daemon=True)
        process.start()
        theirs.close()
        worker = [process, ours]
        self._workers.append(worker)
        return worker

    def _wait_ready(self, worker: list) -> list:
        process, conn = worker
        try:
            late = f"Edid not start within {START_TIMEOUT_S:.0f} s".encode()
            ready = conn.recv_bytes() if conn.poll(START_TIMEOUT_S) else late
        except (EOFError, OSError):
            ready = f"Eexited with code {process.exitcode} while loading".encode()
        if ready[:1] != b"R":
            raise ForwardProcessError(f"forward process {process.name} for {self.path}: "
                                      f"{ready[1:].decode(errors='replace')}")
        self.layout = ready[1:].decode()
        return worker

    def _replace(self, dead: list) -> tuple[list, ForwardProcessError | None]:
        """A new process in place of `dead`, and the error when it did not start (it stays in
        the pool then, so the next forward tries again instead of waiting for a process forever)."""
        log.error("forward process %s exited (code %s); starting another", dead[0].name,
                  dead[0].exitcode)
        self._workers.remove(dead)
        _shutdown([dead])
        fresh = self._start(len(self._workers))
        try:
            return self._wait_ready(fresh), None
        except ForwardProcessError as exc:
            return fresh, exc


def _shutdown_in_background(workers: list) -> None:
    threading.Thread(target=_shutdown, args=(workers,), name="bradley-forward-reaper",
                     daemon=True).start()


def _shutdown(workers: list, timeout_s: float = 10.0) -> None:
    for _, conn in workers:
        try:
            conn.send_bytes(b"")
        except OSError:
            pass
    for process, conn in workers:
        process.join(timeout_s)
        if process.is_alive():
            process.kill()
            process.join()
        conn.close()
    workers.clear()
