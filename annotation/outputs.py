"""Where a command's output file goes, so that writing it never replaces what the path points to.

- `-`, `/dev/stdout`, `/dev/stderr`, `/dev/fd/N`, `/proc/self/fd/N`, or a symlink to one: written
  to that open stream as the shell set it up (a pipe, a terminal, `>> log`), never reopened or
  replaced.
- A symlink: followed; its target is written and the link stays a link.
- A special file (a FIFO, a character device): opened and written as it is.
- A regular file, or a new one: written to a temporary name in its folder, then renamed over it,
  so a failed write leaves the old file as it was. A new file gets the mode `open()` would give it
  (0666 less the user's umask), a replaced one keeps its mode.

`write_output(out, write)` calls `write(fh)` with a binary file object; `is_stdout(out)` says
whether the output is the process's standard output (so a summary goes to stderr instead).

    >>> import tempfile, os
    >>> folder = tempfile.mkdtemp()
    >>> os.symlink("target.txt", os.path.join(folder, "link.txt"))
    >>> write_output(os.path.join(folder, "link.txt"), lambda fh: fh.write(b"hi"))
    >>> open(os.path.join(folder, "target.txt")).read(), os.path.islink(os.path.join(folder, "link.txt"))
    ('hi', True)
"""

from __future__ import annotations

import contextlib
import os
import re
import stat
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO

STDOUT = "-"
MAX_LINKS = 40  # as the kernel's own limit on a chain of symlinks
# paths that name a descriptor the process already holds: /dev/stdout, /dev/fd/N, /proc/self/fd/N
_OPEN_STREAM = re.compile(r"^/(?:dev/(stdout|stderr|fd/(\d+))|proc/(self|\d+)/fd/(\d+))$")


def open_stream(out) -> int | None:
    """The descriptor an output path names, itself or through symlinks (`-` is 1), or None for an
    ordinary path.

    >>> open_stream("-"), open_stream("/dev/stderr"), open_stream("/proc/self/fd/7"), open_stream("x")
    (1, 2, 7, None)
    """
    if str(out) == STDOUT:
        return 1
    path = os.path.abspath(str(out))
    for _ in range(MAX_LINKS):
        match = _OPEN_STREAM.match(path)
        if match is not None:
            name, fd_dev, pid, fd_proc = match.groups()
            if pid in (None, "self", str(os.getpid())):
                return {"stdout": 1, "stderr": 2}.get(name) or int(fd_dev or fd_proc)
        if not os.path.islink(path):
            return None
        path = os.path.join(os.path.dirname(path), os.readlink(path))
    return None


def is_stdout(out) -> bool:
    return open_stream(out) == 1


def write_output(out, write: Callable[[BinaryIO], object]) -> None:
    """Write an output file through `write(fh)` as the module docstring says."""
    fd = open_stream(out)
    if fd is not None:
        if fd == 1:
            sys.stdout.flush()  # what was printed before comes first
        with os.fdopen(os.dup(fd), "wb") as fh:
            write(fh)
        return
    target = Path(os.path.realpath(out))
    try:
        mode = os.stat(target).st_mode
    except FileNotFoundError:
        mode = None
    if mode is not None and not stat.S_ISREG(mode):  # a FIFO or a device: write into it
        with open(target, "wb") as fh:
            write(fh)
        return
    with _replacing(target, mode) as fh:
        write(fh)


@contextlib.contextmanager
def _replacing(target: Path, mode: int | None) -> Iterator[BinaryIO]:
    """A temporary file beside `target`, renamed over it when the block ends without an error."""
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    try:
        os.fchmod(fd, stat.S_IMODE(mode) if mode is not None else 0o666 & ~current_umask())
        with os.fdopen(fd, "wb") as fh:
            yield fh
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def current_umask() -> int:
    """The process's umask, read without changing it where Linux tells it (/proc), else set and
    restored at once."""
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    mask = os.umask(0o022)
    os.umask(mask)
    return mask
