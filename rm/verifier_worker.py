"""The verifier worker process (`python -m rm.verifier_worker`), started and killed by
rm/verifier_pool.py, and the wire format both sides share.

Protocol: one line per message each way, encoded with orjson (C; `json` cost more than the gsm8k
checks themselves, issue 19's profile). The parent sends `[seq, [[name, response, ground_truth,
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

import importlib
import json
import logging
import mmap
import os
import struct
import sys
import time

import orjson

from rm.verifiers import VERIFIERS, run_verifier

PROGRESS = struct.Struct("qqd")  # message number, call index within it, CLOCK_MONOTONIC at its start
PROGRESS_ENV, PLUGINS_ENV, LIMIT_ENV = ("BRADLEY_VERIFIER_PROGRESS", "BRADLEY_VERIFIER_PLUGINS",
                                        "BRADLEY_VERIFIER_LIMIT_S")


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


def _load_plugins() -> None:
    for name, path in json.loads(os.environ.get(PLUGINS_ENV) or "{}").items():
        module, _, attr = path.partition(":")
        VERIFIERS[name] = getattr(importlib.import_module(module), attr)


def _warm_up() -> None:
    """Import math-verify (sympy: seconds) before announcing readiness, so no call pays for it.
    Its once-per-process warning that timeouts are off is expected here: the pool is the timeout."""
    logging.getLogger("math_verify").setLevel(logging.ERROR)
    try:
        run_verifier("math", "\\boxed{1}", "1")
    except Exception:
        pass


def main() -> None:
    # Our protocol owns the real stdout; anything a verifier prints goes to stderr instead.
    out = os.dup(1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    with open(os.environ[PROGRESS_ENV], "r+b") as f:
        progress = mmap.mmap(f.fileno(), PROGRESS.size)
    _load_plugins()
    _warm_up()
    write_all(out, b'{"ready": true}\n')
    mark, clock = PROGRESS.pack_into, time.monotonic
    for line in sys.stdin.buffer:
        seq, calls = decode(line)
        results = []
        for index, (name, response, ground_truth, options) in enumerate(calls):
            mark(progress, 0, seq, index, clock())
            v = run_verifier(name, response, ground_truth, options)
            results.append((v.reward, v.correct, v.format_ok, v.status, v.extracted, v.detail))
        write_all(out, encode([seq, results]))


if __name__ == "__main__":
    main()
