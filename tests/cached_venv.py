"""Virtual environments of the tests' and benchmarks' own, for real third-party packages (TRL, ...)
that must never become dependencies of bradley.

A venv lives in `~/.cache/bradley-tests/<name>/` (override the root with BRADLEY_TEST_CACHE) and is
built once, under a file lock, so concurrent test runs and benchmarks wait for one build instead of
colliding; a build that fails leaves no half-made venv behind (it is built under a temporary name
and renamed). `trl_venv()` is the one TRL environment: torch 2.13.0 (the local CPU wheel pip finds
here, see ENVIRONMENT.md) plus a pinned trl, nothing of bradley.

    >>> venv_dir("trl-1.13.0").name
    'trl-1.13.0'
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
from pathlib import Path

TRL_VERSION = "1.13.0"  # the release whose wheel lies on this machine; a bump builds a new venv
TORCH = "torch==2.13.0"
READY = ".bradley-ready"  # written last: a venv without it is rebuilt


def cache_root() -> Path:
    return Path(os.environ.get("BRADLEY_TEST_CACHE", Path.home() / ".cache" / "bradley-tests"))


def venv_dir(name: str) -> Path:
    return cache_root() / name


def ensure_venv(name: str, packages: list[str], python: str = "python3.11") -> Path:
    """The python of venv `name` holding exactly `packages`; built on first use (minutes)."""
    folder = venv_dir(name)
    if (folder / READY).exists():
        return folder / "bin" / "python"
    folder.parent.mkdir(parents=True, exist_ok=True)
    with open(folder.parent / f".{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another process may be building it right now
        if not (folder / READY).exists():
            _build(folder, packages, python)
    return folder / "bin" / "python"


def _build(folder: Path, packages: list[str], python: str) -> None:
    tmp = folder.with_name(folder.name + ".building")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.rmtree(folder, ignore_errors=True)
    try:
        subprocess.run([python, "-m", "venv", str(tmp)], check=True)
        subprocess.run([str(tmp / "bin" / "pip"), "install", "-q", *packages], check=True,
                       stdout=sys.stderr)
        os.replace(tmp, folder)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    # a venv's scripts name their own folder: rebuild entry points would be wrong, but `python -m`
    # and the interpreter symlink are path-independent, which is all the tests and benches use
    (folder / READY).write_text(" ".join(packages) + "\n")


def trl_venv() -> Path:
    """The python of the TRL venv (torch + trl only)."""
    return ensure_venv(f"trl-{TRL_VERSION}", [TORCH, f"trl=={TRL_VERSION}"])


if __name__ == "__main__":  # `python tests/cached_venv.py` builds the TRL venv ahead of a test run
    print(trl_venv())
