"""The verifier worker process (`python -m rm.verify.worker`), the parent's handle on one
(`WorkerProcess`, used by rm/verify/pool.py), and the wire format both sides share.

Protocol: one line per message each way, encoded with orjson (C; `json` cost more than the gsm8k
checks themselves, issue 19's profile). The parent sends `[seq, [[name, response, ground_truth,
options], ...]]`; the worker answers `[seq, [[reward, correct, format_ok, status, extracted,
detail], ...]]`, in order. Before each call the worker writes (seq, index, CLOCK_MONOTONIC) into a
24-byte shared page, so the parent knows which call of a message is running and since when, and
kills the worker when that call passes its limit, though results travel only once per message.

A whole request (issue 19's load test: under load, decoding and answering in the parent cost 4x
the checks) travels as `[seq, {"whole": n, "context": {...}}]`, its n raw body bytes waiting in a
shared buffer (`SharedBuffer`, the inbox); the handler named by BRADLEY_VERIFIER_WHOLE
(`module:function`, set by the service) decodes it in place, runs its calls as above (index = call
number in the request) and answers `[seq, meta]`, the reply's `meta["body"]` bytes waiting in the
outbox (the parent relays them untouched). Through pipes, a 650 kB body and its reply cost more
than a microsecond per item in copies, 64 kB at a time, and the wake-ups between them.

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
PROGRESS_ENV, PLUGINS_ENV, LIMIT_ENV, WHOLE_ENV, BOXES_ENV = (
    "BRADLEY_VERIFIER_PROGRESS", "BRADLEY_VERIFIER_PLUGINS", "BRADLEY_VERIFIER_LIMIT_S",
    "BRADLEY_VERIFIER_WHOLE", "BRADLEY_VERIFIER_BOXES")
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


class BufferFull(RuntimeError):
    """No room for a shared buffer's growth (a small /dev/shm, e.g. Docker's 64 MiB): the request
    takes the main path instead. Not an OSError, which would get the worker replaced."""


def _reserve(fd: int, size: int) -> None:
    """Make the file `size` bytes with its memory taken now. A sparse file on a full tmpfs would
    kill the process with SIGBUS at the first write to a page it cannot get; this raises."""
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as exc:
        if exc.errno in (errno.EOPNOTSUPP, errno.EINVAL):  # a file system without fallocate
            os.ftruncate(fd, size)
            return
        raise BufferFull(f"no room for a {size:,}-byte verifier buffer in {_SHM or 'the temp dir'}"
                         f" ({exc.strerror})") from exc


class SharedBuffer:
    """Bytes one process writes and the other reads in place: an unlinked file in /dev/shm that
    both map, grown by the writer (to a power of two, its memory taken at once: `BufferFull`
    when there is none) when a message does not fit; the reader maps the new size when told of a
    longer message. One message at a time: the line that announces it
    is written after it, and the next is written only after the answer to this one.

    >>> box = SharedBuffer.create()
    >>> box.write(b"x" * 3_000_000), bytes(box.view(3)), len(box.mapping) >= 3_000_000
    (3000000, b'xxx', True)
    >>> box.close()
    """

    def __init__(self, fd: int):
        self.fd, self.mapping = fd, mmap.mmap(fd, os.fstat(fd).st_size)

    @classmethod
    def create(cls, size: int = 1 << 16) -> SharedBuffer:  # grown by the first large message
        fd, path = tempfile.mkstemp(prefix="bradley-verifier-box-", dir=_SHM)
        os.unlink(path)  # only the two processes' descriptors keep it
        try:
            _reserve(fd, size)
        except BaseException:
            os.close(fd)
            raise
        return cls(fd)

    def write(self, data) -> int:
        n = len(data)
        if n > len(self.mapping):
            _reserve(self.fd, 1 << (n - 1).bit_length())  # BufferFull: the old size is kept
            self._remap()
        self.mapping[:n] = data
        return n

    def view(self, n: int) -> memoryview:
        """The first n bytes in place; release the view before the next message (a remap)."""
        if n > len(self.mapping):
            self._remap()
        return memoryview(self.mapping)[:n]

    def _remap(self) -> None:
        self.mapping.close()
        self.mapping = mmap.mmap(self.fd, os.fstat(self.fd).st_size)

    def close(self) -> None:
        self.mapping.close()
        os.close(self.fd)


# -- the parent's side -----------------------------------------------------------------------------


class WorkerProcess:
    """One `python -m rm.verify.worker` process in its own process group, a 24-byte shared
    page where it notes which call it is running and since when (so results can travel one line
    per message while the parent still knows each call's start), and the two shared buffers of
    whole requests (inbox: bodies, outbox: replies)."""

    def __init__(self, plugins: dict[str, str], limit_s: float, whole: str | None = None):
        fd, path = tempfile.mkstemp(prefix="bradley-verifier-", dir=_SHM)
        self.inbox = self.outbox = None
        try:
            _reserve(fd, PROGRESS.size)
            self.progress = mmap.mmap(fd, PROGRESS.size)
        except BaseException:
            os.unlink(path)
            raise
        finally:
            os.close(fd)
        try:
            self._start(path, plugins, limit_s, whole)
        except BaseException:  # nothing of a worker that did not start stays open
            self.kill()
            raise
        finally:
            os.unlink(path)  # both sides hold the mapping; nothing is left on disk

    def _start(self, path: str, plugins: dict[str, str], limit_s: float, whole: str | None) -> None:
        self.inbox, self.outbox = SharedBuffer.create(), SharedBuffer.create()
        env = {**os.environ, PLUGINS_ENV: json.dumps(plugins), PROGRESS_ENV: path,
               LIMIT_ENV: str(limit_s), WHOLE_ENV: whole or "",
               BOXES_ENV: f"{self.inbox.fd},{self.outbox.fd}",
               "PYTHONPATH": os.pathsep.join(p for p in sys.path if p and os.path.isdir(p))}
        self.proc = subprocess.Popen([sys.executable, "-m", "rm.verify.worker"], env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     start_new_session=True, bufsize=0,
                                     pass_fds=(self.inbox.fd, self.outbox.fd))
        self.fd, self.buffer, self.seq = self.proc.stdout.fileno(), b"", 0
        ready = self.read_line(START_TIMEOUT_S)
        if ready != {"ready": True}:
            raise RuntimeError(f"verifier worker did not start (got {ready!r}); see its stderr")

    def send(self, calls: list) -> int:
        self.seq += 1
        write_all(self.proc.stdin.fileno(), encode([self.seq, calls]))
        return self.seq

    def send_whole(self, body: bytes, context: dict) -> int:
        n = self.inbox.write(body)  # BufferFull: nothing was sent
        self.seq += 1
        write_all(self.proc.stdin.fileno(), encode([self.seq, {"whole": n, "context": context}]))
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

    def reply(self, n: int) -> bytes:
        """A whole request's reply (its line has been read, so it is all in the outbox)."""
        with self.outbox.view(n) as view:
            return bytes(view)

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
        for box in (self.inbox, self.outbox):
            if box is not None:
                box.close()


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
    """Each call's verdict, noting (seq, index, start) in the shared page before it starts, and
    OUTSIDE after the last (what follows is not that call's time)."""
    mark, clock, verdicts = PROGRESS.pack_into, time.monotonic, []
    for index, (name, response, ground_truth, options) in enumerate(calls):
        mark(progress, 0, seq, index, clock())
        verdicts.append(run_verifier(name, response, ground_truth, options))
    mark(progress, 0, seq, OUTSIDE, clock())
    return verdicts


def _answer_whole(handler: Callable, progress: mmap.mmap, seq: int, body: memoryview,
                  context: dict, outbox: SharedBuffer) -> bytes:
    """The answer's line; the reply's bytes go to the outbox. The handler reads the body in place
    (a memoryview of the inbox, valid during the call)."""
    try:
        with body:
            meta, reply = handler(body, context, lambda calls: _run_calls(progress, seq, calls))
        size = outbox.write(reply)  # BufferFull on a full /dev/shm
    except Exception as exc:  # a bug here must not cost the request: the parent takes it instead
        print(f"verifier worker: whole request failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        meta, size = {"fallback": f"{type(exc).__name__}: {exc}"[:300]}, 0
    return encode([seq, {**meta, "body": size}])


def main() -> None:
    # Our protocol owns the real stdout; anything a verifier prints goes to stderr instead.
    out = os.dup(1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    with open(os.environ[PROGRESS_ENV], "r+b") as f:
        progress = mmap.mmap(f.fileno(), PROGRESS.size)
    _load_plugins()
    whole = _import(os.environ[WHOLE_ENV]) if os.environ.get(WHOLE_ENV) else None
    inbox, outbox = (SharedBuffer(int(fd)) for fd in os.environ[BOXES_ENV].split(","))
    _warm_up()
    gc.freeze()  # sympy's many objects out of the collector's way: each full pass walked them all
    # A whole request makes thousands of short-lived containers (items, checks, verdicts): at the
    # default 700 allocations per young collection they cost 0.2 µs per item, 5% of the worker.
    gc.set_threshold(10_000)
    write_all(out, b'{"ready": true}\n')
    stdin = sys.stdin.buffer
    for line in stdin:
        seq, message = decode(line)
        PROGRESS.pack_into(progress, 0, seq, OUTSIDE, time.monotonic())
        if isinstance(message, dict):
            body = inbox.view(message["whole"])
            write_all(out, _answer_whole(whole, progress, seq, body, message["context"], outbox))
            continue
        results = [(v.reward, v.correct, v.format_ok, v.status, v.extracted, v.detail)
                   for v in _run_calls(progress, seq, message)]
        write_all(out, encode([seq, results]))


if __name__ == "__main__":
    main()
