"""A cached venv holding llama-cpp-python's OpenAI-compatible server, built once per machine.

PyPI carries llama-cpp-python as source only, so the first build compiles llama.cpp (about 500 s on
two cores with ``CMAKE_ARGS=-DGGML_NATIVE=OFF``, ENVIRONMENT.md). The wheel and the venv live under
``~/.cache/bradley-tests/llama-cpp-python-<version>/``; a file lock makes concurrent test runs wait
for one build instead of racing, and a stamp file marks a finished venv so reruns cost nothing.

Run as a script to build ahead of the tests: ``nice -n 10 python tests/rm/llama_cpp_venv.py``.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
from pathlib import Path

VERSION = "0.3.16"
SERVER_DEPS = ("sse-starlette", "starlette-context", "pydantic-settings", "fastapi", "uvicorn")
ROOT = Path(os.environ.get("BRADLEY_TEST_CACHE", Path.home() / ".cache" / "bradley-tests"))


def cache_dir() -> Path:
    return ROOT / f"llama-cpp-python-{VERSION}"


def venv_python() -> Path:
    return cache_dir() / "venv" / "bin" / "python"


def ready() -> bool:
    return (cache_dir() / "venv" / ".installed").exists()


def _run(cmd: list[str], log) -> None:
    env = {**os.environ, "CMAKE_ARGS": "-DGGML_NATIVE=OFF", "CMAKE_BUILD_PARALLEL_LEVEL": "2"}
    subprocess.run(cmd, check=True, stdout=log, stderr=subprocess.STDOUT, env=env)


def ensure() -> Path:
    """Build (once, under a lock) and return the venv's python that can run ``llama_cpp.server``."""
    base = cache_dir()
    base.mkdir(parents=True, exist_ok=True)
    with open(base / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # a second run waits for the first build
        if ready():
            return venv_python()
        with open(base / "build.log", "a") as log:
            wheels = base / "wheels"
            if not list(wheels.glob("llama_cpp_python-*.whl")):
                _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-w", str(wheels),
                      f"llama-cpp-python=={VERSION}"], log)
            venv = base / "venv"
            _run([sys.executable, "-m", "venv", "--clear", str(venv)], log)
            wheel = next(wheels.glob("llama_cpp_python-*.whl"))
            _run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", str(wheel),
                  *SERVER_DEPS], log)
            (venv / ".installed").write_text(VERSION + "\n")
    return venv_python()


if __name__ == "__main__":
    print(ensure())
