"""The verifier worker process (`python -m rm.verify.worker`), the parent's handle on one
(`WorkerProcess`, used by rm/verify/pool.py), and the wire format both sides share.

Protocol: one line per message each way, encoded with orjson (in C: `json`, in Python, cost more than
cheap checks themselves). The parent sends `[seq, [[name, response, ground_truth,
options], ...]]`; the worker answers `[seq, [[reward, correct, format_ok, status, extracted,
detail], ...]]`, in order. Before each call the worker writes (seq, index, CLOCK_MONOTONIC) into a
24-byte shared page, so the parent knows which call of a message is running and since when, and
kills the worker when that call passes its limit, though results travel only once per message.

    >>> decode(encode([1, [["gsm8k", "#### 10", 10, None]]]))
    [1, [['gsm8k', '#### 10', 10, None]]]
    >>> decode(encode([2, [["exact", "x", 10 ** 30, None]]]))[1][0][2]  # beyond orjson's 64 bits
    1000000000000000000000000000000
"""

from __future__ import annotations

import errno
import gc
import importlib
import json
import logging
import mmap
import os
import select
import signal
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable

import orjson

from rm.verify.rules import VERIFIERS, run_verifier

PROGRESS = struct.Struct("qqd")  # message number, call index within it, CLOCK_MONOTONIC at its start
PROGRESS_ENV, PLUGINS_ENV, LIMIT_ENV = (
    "BRADLEY_VERIFIER_PROGRESS", "BRADLEY_VERIFIER_PLUGINS", "BRADLEY_VERIFIER_LIMIT_S")
START_TIMEOUT_S = 120.0  # importing sympy (math-verify) on a busy 2-core machine takes seconds
OUTSIDE = -1  # the call index noted while a message is decoded or answered, between calls


def encode(value) -> bytes:
    """One protocol line. orjson refuses integers beyond 64 bits (a ground truth of 10**30 is
    valid) and types it does not know (a plugin's numpy float): `json` takes those, in a line
    marked `j` (orjson would read such an integer back as a float)."""
    try:
        return orjson.dumps(value) + b"\n"
    except TypeError:
        return b"j" + json.dumps(value, default=float).encode() + b"\n"


def decode(line: bytes):
    return json.loads(line[1:]) if line[:1] == b"j" else orjson.loads(line)


def write_all(fd: int, data: bytes) -> None:
    """All of `data`: a write to a pipe may stop part-way (a signal, a tracer such as py-spy
    attaching), and a message is up to a few hundred kB, several pipe buffers."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


_SHM = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None


def _reserve(fd: int, size: int) -> None:
    """Make the file `size` bytes with its memory taken now. A sparse file on a full tmpfs would
    kill the process with SIGBUS at the first write to a page it cannot get; this raises OSError."""
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as exc:
        if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL):  # a file system without fallocate
            raise
        os.ftruncate(fd, size)


# -- the parent's side -----------------------------------------------------------------------------


class WorkerProcess:
    """One `python -m rm.verify.worker` process in its own process group, and a 24-byte shared
    page where it notes which call it is running and since when (so results can travel one line
    per message while the parent still knows each call's start)."""

    def __init__(self, plugins: dict[str, str], limit_s: float):
        fd, path = tempfile.mkstemp(prefix="bradley-verifier-", dir=_SHM)
        try:
            _reserve(fd, PROGRESS.size)
            self.progress = mmap.mmap(fd, PROGRESS.size)
        except BaseException:
            os.unlink(path)
            raise
        finally:
            os.close(fd)
        try:
            self._start(path, plugins, limit_s)
        except BaseException:  # nothing of a worker that did not start stays open
            self.kill()
            raise
        finally:
            os.unlink(path)  # both sides hold the mapping; nothing is left on disk

    def _start(self, path: str, plugins: dict[str, str], limit_s: float) -> None:
        env = {**os.environ, PLUGINS_ENV: json.dumps(plugins), PROGRESS_ENV: path,
               LIMIT_ENV: str(limit_s),
               "PYTHONPATH": os.pathsep.join(p for p in sys.path if p and os.path.isdir(p))}
        self.proc = subprocess.Popen([sys.executable, "-m", "rm.verify.worker"], env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     start_new_session=True, bufsize=0)
        self.fd, self.buffer, self.seq = self.proc.stdout.fileno(), b"", 0
        ready = self.read_line(START_TIMEOUT_S)
        if ready != {"ready": True}:
            raise RuntimeError(f"verifier worker did not start (got {ready!r}); see its stderr")

    def send(self, calls: list) -> int:
        self.seq += 1
        write_all(self.proc.stdin.fileno(), encode([self.seq, calls]))
        return self.seq

    def running(self, seq: int) -> tuple[int, float] | None:
        """(index, start) of the call of message `seq` in progress (index OUTSIDE: decoding or
        answering it); None before the worker reads it. Read until two reads agree: the worker
        may be writing the page meanwhile."""
        seen = PROGRESS.unpack_from(self.progress, 0)
        while (again := PROGRESS.unpack_from(self.progress, 0)) != seen:
            seen = again
        at, index, started = seen
        return (index, started) if at == seq else None

    def read_line(self, timeout: float):
        """The next message, None at the deadline, EOFError when the worker is gone."""
        if not self._fill(lambda: self.buffer.find(b"\n") + 1, timeout):
            return None
        end = self.buffer.find(b"\n")
        line, self.buffer = self.buffer[:end], self.buffer[end + 1:]
        return decode(line)

    def _fill(self, enough: Callable[[], object], timeout: float) -> bool:
        """Read until `enough()`; False at the deadline."""
        deadline = time.monotonic() + timeout
        while not enough():
            left = max(0.0, deadline - time.monotonic())
            if not select.select([self.fd], [], [], left)[0]:  # polls once even when left is 0
                return False
            data = os.read(self.fd, 1 << 20)
            if not data:
                raise EOFError("verifier worker exited")
            self.buffer += data
        return True

    def kill(self) -> None:
        """Kill the process group and close everything this handle holds (also what a worker
        that failed to start got as far as opening)."""
        if (proc := getattr(self, "proc", None)) is not None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            proc.wait()
            for stream in (proc.stdin, proc.stdout):
                try:
                    stream.close()
                except OSError:
                    pass
        self.progress.close()


# -- the worker's side ----------------------------------------------------------------------------


def _load_plugins() -> None:
    for name, path in json.loads(os.environ.get(PLUGINS_ENV) or "{}").items():
        VERIFIERS[name] = _import(path)


def _warm_up() -> None:
    """Import math-verify (sympy: seconds) before announcing readiness, so no call pays for it.
    Its once-per-process warning that timeouts are off is expected here: the pool is the timeout."""
    logging.getLogger("math_verify").setLevel(logging.ERROR)
    try:
        run_verifier("math", "\\boxed{1}", "1")
    except Exception:
        pass


def _import(path: str) -> Callable:
    module, _, attr = path.partition(":")
    return getattr(importlib.import_module(module), attr)


def _run_calls(progress: mmap.mmap, seq: int, calls: list) -> list:
    """Each call's check, noting (seq, index, start) in the shared page before it starts, and
    OUTSIDE after the last (what follows is not that call's time)."""
    mark, clock, checks = PROGRESS.pack_into, time.monotonic, []
    for index, (name, response, ground_truth, options) in enumerate(calls):
        mark(progress, 0, seq, index, clock())
        checks.append(run_verifier(name, response, ground_truth, options))
    mark(progress, 0, seq, OUTSIDE, clock())
    return checks


def main() -> None:
    # Our protocol owns the real stdout; anything a verifier prints goes to stderr instead.
    out = os.dup(1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    with open(os.environ[PROGRESS_ENV], "r+b") as f:
        progress = mmap.mmap(f.fileno(), PROGRESS.size)
    _load_plugins()
    _warm_up()
    gc.freeze()  # sympy's many objects out of the collector's way: each full pass walked them all
    # a message of many calls makes many short-lived containers: fewer young collections
    gc.set_threshold(10_000)
    write_all(out, b'{"ready": true}\n')
    stdin = sys.stdin.buffer
    for line in stdin:
        seq, message = decode(line)
        PROGRESS.pack_into(progress, 0, seq, OUTSIDE, time.monotonic())
        results = [(v.reward, v.correct, v.format_ok, v.status, v.extracted, v.detail)
                   for v in _run_calls(progress, seq, message)]
        write_all(out, encode([seq, results]))


if __name__ == "__main__":
    main()
