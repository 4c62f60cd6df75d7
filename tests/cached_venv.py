"""Virtual environments of the tests' and benchmarks' own, for real third-party packages (TRL, ...)
that must never become dependencies of bradley.

A venv lives in `~/.cache/bradley-tests/<name>/` (override the root with BRADLEY_TEST_CACHE) and is
built once, under a file lock, so concurrent test runs and benchmarks wait for one build instead of
colliding; a build that fails leaves no half-made venv behind (it is built under a temporary name
and renamed). `trl_venv()` is the one TRL environment: torch 2.13.0 (the local CPU wheel pip finds
here, see ENVIRONMENT.md) plus a pinned trl, nothing of bradley; bench/train_vs_trl.py uses it too.

    >>> venv_dir("trl-1.16.0").name
    'trl-1.16.0'
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
from pathlib import Path

TRL_VERSION = "1.16.0"  # what bench/train_vs_trl.py measured; a bump builds a new venv
VERL_VERSION = "0.9.1"
OPENRLHF_VERSION = "0.11.2"
TORCH = "torch==2.13.0"
READY = ".bradley-ready"  # written last: a venv without it is rebuilt


def cache_root() -> Path:
    return Path(os.environ.get("BRADLEY_TEST_CACHE", Path.home() / ".cache" / "bradley-tests"))


def venv_dir(name: str) -> Path:
    return cache_root() / name


def ensure_venv(name: str, packages: list[str], python: str = "python3.11",
                no_deps: tuple[str, ...] = ()) -> Path:
    """The python of venv `name` holding `packages` (and `no_deps`, installed without their
    declared dependencies); built on first use (minutes). A cached venv made for a different package
    list gets the list installed into it (seconds)."""
    folder = venv_dir(name)
    wanted = " ".join(packages) + (" --no-deps " + " ".join(no_deps) if no_deps else "") + "\n"
    if _ready(folder) == wanted:
        return folder / "bin" / "python"
    folder.parent.mkdir(parents=True, exist_ok=True)
    with open(folder.parent / f".{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another process may be building it right now
        if _ready(folder) is None:
            _build(folder, packages, python, no_deps)
        elif _ready(folder) != wanted:
            _pip(folder, packages, no_deps)
        (folder / READY).write_text(wanted)
    return folder / "bin" / "python"


def _ready(folder: Path) -> str | None:
    marker = folder / READY
    return marker.read_text() if marker.exists() else None


def _pip(folder: Path, packages: list[str], no_deps: tuple[str, ...] = ()) -> None:
    pip = [str(folder / "bin" / "python"), "-m", "pip", "install", "-q"]
    subprocess.run(pip + packages, check=True, stdout=sys.stderr)
    if no_deps:
        subprocess.run(pip + ["--no-deps", *no_deps], check=True, stdout=sys.stderr)


def _build(folder: Path, packages: list[str], python: str, no_deps: tuple[str, ...]) -> None:
    tmp = folder.with_name(folder.name + ".building")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.rmtree(folder, ignore_errors=True)
    try:
        subprocess.run([python, "-m", "venv", str(tmp)], check=True)
        _pip(tmp, packages, no_deps)
        os.replace(tmp, folder)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    # the venv's scripts keep the temporary folder in their shebangs; only bin/python (which works
    # from any folder) and `python -m` are used


def trl_venv() -> Path:
    """The python of the TRL venv: torch + trl, and requests, which trl's GRPO module imports
    (trl/generation/vllm_client.py) without declaring it."""
    return ensure_venv(f"trl-{TRL_VERSION}", [TORCH, f"trl=={TRL_VERSION}", "requests"])


def verl_venv() -> Path:
    """The python of a venv where verl's reward loader and reward managers import: verl itself
    without its declared dependencies (vLLM, wandb, ... are not needed to compute rewards), plus
    the modules those imports reach: torch, transformers, ray, tensordict, omegaconf, psutil."""
    return ensure_venv(f"verl-{VERL_VERSION}", [TORCH, "transformers<5.11", "ray", "tensordict",
                                                "numpy", "omegaconf", "psutil", "packaging",
                                                "codetiming"], no_deps=(f"verl=={VERL_VERSION}",))


def openrlhf_venv() -> Path:
    """The python of a venv where OpenRLHF's remote-RM client (openrlhf/utils/agent.py) runs:
    OpenRLHF without its declared dependencies (DeepSpeed, vLLM, ...), plus what that module's
    rollout and HTTP code use: torch, transformers, aiohttp."""
    return ensure_venv(f"openrlhf-{OPENRLHF_VERSION}", [TORCH, "transformers", "aiohttp"],
                       no_deps=(f"openrlhf=={OPENRLHF_VERSION}",))


if __name__ == "__main__":  # `python tests/cached_venv.py [trl|verl|openrlhf]` builds a venv ahead of a test run
    print({"trl": trl_venv, "verl": verl_venv, "openrlhf": openrlhf_venv}[sys.argv[1] if len(sys.argv) > 1 else "trl"]())
