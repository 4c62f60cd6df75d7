"""Virtual environments of the tests' and benchmarks' own, for real third-party packages (TRL,
Label Studio, llama-cpp-python, ...) that must never become dependencies of bradley.

A venv lives in `~/.cache/bradley-tests/<name>/` (override the root with BRADLEY_TEST_CACHE; a name
may be nested, `llama-cpp-python-<v>/venv`) and is built once, under a file lock, so concurrent test
runs and benchmarks wait for one build instead of colliding; a build that fails leaves no half-made
venv behind (it is built under a temporary name and renamed). Every pip run of a build is appended to
`<name>.build.log` beside the venv, ending with the build's seconds (the set-up time a fresh machine
pays). A package PyPI ships as source only (`compile_first`) is compiled once into a wheel in
`wheels/` beside the venv, so a venv rebuild reuses it. `trl_venv()` is the one TRL environment:
torch 2.13.0 (the local CPU wheel pip finds here, see ENVIRONMENT.md) plus a pinned trl, nothing of
bradley; bench/train_vs_trl.py uses it too.

    >>> venv_dir("trl-1.16.0").name
    'trl-1.16.0'
    >>> print(spec(["fastapi", "uvicorn"], ("verl==0.9.1",), ("llama-cpp-python==0.3.16",)), end="")
    llama-cpp-python==0.3.16 fastapi uvicorn --no-deps verl==0.9.1
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

TRL_VERSION = "1.16.0"  # what bench/train_vs_trl.py measured; a bump builds a new venv
VERL_VERSION = "0.9.1"
OPENRLHF_VERSION = "0.11.2"
LLAMA_CPP_VERSION = "0.3.16"
TORCH = "torch==2.13.0"
READY = ".bradley-ready"  # written last, holding spec(): a venv without it is rebuilt


def cache_root() -> Path:
    return Path(os.environ.get("BRADLEY_TEST_CACHE", Path.home() / ".cache" / "bradley-tests"))


def venv_dir(name: str) -> Path:
    return cache_root() / name


def spec(packages: list[str], no_deps: tuple[str, ...] = (), compile_first: tuple[str, ...] = ()) -> str:
    """What a venv holds, as its READY marker records it."""
    return " ".join([*compile_first, *packages]) + (" --no-deps " + " ".join(no_deps) if no_deps else "") + "\n"


def ensure_venv(name: str, packages: list[str], python: str = "python3.11",
                no_deps: tuple[str, ...] = (), compile_first: tuple[str, ...] = (),
                env: dict | None = None) -> Path:
    """The python of venv `name` holding `packages` (and `no_deps`, installed without their
    declared dependencies, and `compile_first`, built into wheels once with `env` added to pip's
    environment, e.g. CMAKE_ARGS); built on first use (minutes). A cached venv made for a different
    package list gets the list installed into it (seconds)."""
    folder = venv_dir(name)
    wanted = spec(packages, no_deps, compile_first)
    if _ready(folder) == wanted:
        return folder / "bin" / "python"
    folder.parent.mkdir(parents=True, exist_ok=True)
    with open(folder.parent / f".{folder.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another process may be building it right now
        if _ready(folder) != wanted:
            with Build(folder, env) as build:
                build.venv(python, packages, no_deps, compile_first, fresh=_ready(folder) is None)
            (folder / READY).write_text(wanted)
    return folder / "bin" / "python"


def _ready(folder: Path) -> str | None:
    marker = folder / READY
    return marker.read_text() if marker.exists() else None


class Build:
    """One build of a cached venv: every command's output appended to `<name>.build.log`, the
    build's seconds written last; a failing command raises with the log's tail."""

    def __init__(self, folder: Path, env: dict | None = None):
        self.folder, self.env = folder, {**os.environ, **(env or {})}
        self.log_path = folder.with_name(folder.name + ".build.log")
        self.wheelhouse = folder.parent / "wheels"

    def __enter__(self) -> Build:
        self.log, self.start = open(self.log_path, "a"), time.monotonic()
        self.log.write(f"== {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())} build {self.folder}\n")
        return self

    def __exit__(self, kind, *_) -> None:
        done = "failed after" if kind else "built in"
        self.log.write(f"== {done} {time.monotonic() - self.start:.0f} s\n")
        self.log.close()

    def run(self, cmd: list[str]) -> None:
        self.log.write("$ " + " ".join(cmd) + "\n")
        self.log.flush()
        if subprocess.run(cmd, stdout=self.log, stderr=subprocess.STDOUT, env=self.env).returncode:
            self.log.flush()
            tail = self.log_path.read_text()[-2000:]
            raise RuntimeError(f"{cmd[0]} {' '.join(cmd[1:4])} ... failed; {self.log_path} ends:\n{tail}")

    def wheels(self, folder: Path, requirements: tuple[str, ...]) -> None:
        """Each source-only requirement compiled into wheels/ once, by the venv's own pip (so the
        wheel's tags fit it); a wheel already there is found through --find-links (pip prefers it
        to the sdist) and not compiled again."""
        for requirement in requirements:
            self.run([str(folder / "bin" / "python"), "-m", "pip", "wheel", "-q", "--no-deps",
                      "--find-links", str(self.wheelhouse), "-w", str(self.wheelhouse), requirement])

    def venv(self, python: str, packages: list[str], no_deps: tuple[str, ...],
             compile_first: tuple[str, ...], fresh: bool) -> None:
        if not fresh:  # the venv exists with another package list: install the new one into it
            self.wheels(self.folder, compile_first)
            return self.pip(self.folder, [*compile_first, *packages], no_deps)
        tmp = self.folder.with_name(self.folder.name + ".building")
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(self.folder, ignore_errors=True)
        try:
            self.run([python, "-m", "venv", str(tmp)])
            self.wheels(tmp, compile_first)
            self.pip(tmp, [*compile_first, *packages], no_deps)
            os.replace(tmp, self.folder)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        # the venv's scripts keep the temporary folder in their shebangs; only bin/python (which
        # works from any folder) and `python -m` are used

    def pip(self, folder: Path, packages: list[str], no_deps: tuple[str, ...] = ()) -> None:
        pip = [str(folder / "bin" / "python"), "-m", "pip", "install", "-q"]
        if self.wheelhouse.is_dir():
            pip += ["--find-links", str(self.wheelhouse)]
        self.run(pip + packages)
        if no_deps:
            self.run(pip + ["--no-deps", *no_deps])


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


def llama_cpp_venv() -> Path:
    """The python of a venv that runs llama-cpp-python's OpenAI-compatible server
    (`python -m llama_cpp.server`). PyPI carries llama-cpp-python as source only: its wheel is
    compiled once (cmake + g++, 511 s on two quiet cores; ENVIRONMENT.md) without host-specific
    instructions (GGML_NATIVE=OFF), so the cached wheel runs on any x86-64 CI machine."""
    name = f"llama-cpp-python-{LLAMA_CPP_VERSION}/venv"
    compiled = (f"llama-cpp-python=={LLAMA_CPP_VERSION}",)
    server = ["sse-starlette", "starlette-context", "pydantic-settings", "fastapi", "uvicorn"]
    folder = venv_dir(name)
    if (folder / ".installed").exists() and _ready(folder) is None:
        # built by the former tests/rm/llama_cpp_venv.py: the same wheel and server packages
        (folder / READY).write_text(spec(server, compile_first=compiled))
    return ensure_venv(name, server, compile_first=compiled,
                       env={"CMAKE_ARGS": "-DGGML_NATIVE=OFF", "CMAKE_BUILD_PARALLEL_LEVEL": "2"})


VENVS = {"trl": trl_venv, "verl": verl_venv, "openrlhf": openrlhf_venv, "llama-cpp": llama_cpp_venv}

if __name__ == "__main__":  # `python tests/cached_venv.py [trl|verl|openrlhf|llama-cpp]` builds one ahead of a test run
    print(VENVS[sys.argv[1] if len(sys.argv) > 1 else "trl"]())
