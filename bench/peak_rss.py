"""Run a Python script or module, then write its peak resident set (VmHWM, in MB) to a file.

A benchmark's children are measured with this rather than with ru_maxrss from wait4, which also
counts the image a child had between fork and exec, its parent's resident set: a benchmark that
trained a model in-process first would see its own peak in every child. VmHWM is the high-water
mark of the address space the child got at exec, so it is the child's alone.

Usage: python bench/peak_rss.py OUT_FILE (-m MODULE | SCRIPT) [ARGS...]
"""

from __future__ import annotations

import atexit
import runpy
import sys
from pathlib import Path


def write_peak(path: str) -> None:
    status = Path("/proc/self/status").read_text()
    kb = next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmHWM:"))
    Path(path).write_text(f"{kb / 1024:.1f}\n")


def main() -> None:
    out, target, *rest = sys.argv[1:]
    sys.path.pop(0)  # this folder: the target resolves its imports as if it were run directly
    atexit.register(write_peak, out)
    if target == "-m":
        sys.argv = rest
        runpy.run_module(rest[0], run_name="__main__", alter_sys=True)
    else:
        sys.argv = [target, *rest]
        sys.path.insert(0, str(Path(target).resolve().parent))
        runpy.run_path(target, run_name="__main__")


if __name__ == "__main__":
    main()
