"""A real Label Studio server for tests: installed once into a cached venv of its own
(`~/.cache/bradley-tests/label-studio-<version>/`, tests/cached_venv.py: built under a file lock so
concurrent runs build it once), migrated once into a template data folder beside it
(`label-studio-<version>-template/`: the first start's ~50 s of migrations), then started per test
session from a copy of that template on 127.0.0.1 with SQLite, no network calls and
non-interactive credentials (shared/ENVIRONMENT.md), and stopped by its PID. It runs as
`python -m label_studio.server` (cached venvs keep only bin/python usable). Label Studio is never a
dependency of bradley.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import signal
import socket
import subprocess
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

from tests.cached_venv import cache_root, ensure_venv

VERSION = "1.23.2"
TEMPLATE = cache_root() / f"label-studio-{VERSION}-template"
EMAIL, PASSWORD = "admin@bradley.test", "bradley-test-password"
TOKEN = "b7a1d9e0c3f2a4b6d8e0f1a2b3c4d5e6f7a8b9c0"  # 40 hex: --user-token
START_TIMEOUT_S = 240
# Label Studio 1.23.2 asks for sentry-sdk>=2.16.0 and passes sentry_sdk.init(send_default_pii=...),
# an option sentry-sdk 3.0.0 refuses ("Unknown option"): the server then exits at start-up
PINS = ("sentry-sdk<3",)
TIMINGS: dict[str, float] = {}  # what the set-up cost in this session (reported by the tests)


@contextmanager
def _locked(name: str):
    cache_root().mkdir(parents=True, exist_ok=True)
    with open(cache_root() / f".label-studio-{VERSION}-{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def ensure_installed() -> Path:
    """The cached venv's python, building it when missing (~75 s on an idle machine)."""
    start = time.monotonic()
    python = ensure_venv(f"label-studio-{VERSION}", [f"label-studio=={VERSION}", *PINS])
    if time.monotonic() - start > 5:
        TIMINGS["install_s"] = round(time.monotonic() - start, 1)
    return python


def _env(data: Path) -> dict:
    return {**os.environ, "LABEL_STUDIO_BASE_DATA_DIR": str(data), "LATEST_VERSION_CHECK": "false",
            "COLLECT_ANALYTICS": "false", "DJANGO_DB": "sqlite",
            "LABEL_STUDIO_ENABLE_LEGACY_API_TOKEN": "true",
            # webhooks must reach `bradley serve` on 127.0.0.1 (tests only)
            "SSRF_PROTECTION_ENABLED": "false"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Server:
    url: str
    data: Path
    process: subprocess.Popen
    python: Path

    def stop(self) -> None:
        """SIGTERM to its process group (label-studio runs Django in child processes), by PID."""
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()

    def shell(self, code: str) -> str:
        """Run Python in Label Studio's Django shell (e.g. to create a second user)."""
        manage = _package_dir(self.python) / "manage.py"
        out = subprocess.run([str(self.python), str(manage), "shell", "-c", code], env=_env(self.data),
                             capture_output=True, text=True, timeout=120, cwd=manage.parent)
        if out.returncode:
            raise RuntimeError(f"label-studio shell failed: {out.stderr[-2000:]}")
        return out.stdout


def _package_dir(python: Path) -> Path:
    out = subprocess.run([str(python), "-c", "import label_studio, os; "
                          "print(os.path.dirname(label_studio.__file__))"],
                         capture_output=True, text=True, check=True)
    return Path(out.stdout.strip())


def start(data: Path, python: Path, port: int | None = None) -> Server:
    port = port or free_port()
    data.mkdir(parents=True, exist_ok=True)
    command = [str(python), "-m", "label_studio.server", "start", "--no-browser", "--internal-host",
               "127.0.0.1", "-p", str(port), "--data-dir", str(data), "--username", EMAIL,
               "--password", PASSWORD, "--user-token", TOKEN, "--enable-legacy-api-token"]
    log = open(data / "server.log", "ab")
    process = subprocess.Popen(command, env=_env(data), stdout=log, stderr=subprocess.STDOUT,
                               start_new_session=True)
    server = Server(f"http://127.0.0.1:{port}", data, process, python)
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"label-studio exited ({process.returncode}); see {data / 'server.log'}")
        try:
            if httpx.get(server.url + "/health", timeout=2).status_code == 200:
                return server
        except httpx.HTTPError:
            pass
        time.sleep(1)
    server.stop()
    raise RuntimeError(f"label-studio did not answer /health in {START_TIMEOUT_S} s; see "
                       f"{data / 'server.log'}")


def template(python: Path) -> Path:
    """A data folder migrated once (the first start's ~50 s), copied for every session."""
    folder = TEMPLATE
    with _locked("template"):
        if not (folder / ".ready").exists():
            began = time.monotonic()
            shutil.rmtree(folder, ignore_errors=True)
            start(folder, python).stop()
            (folder / "server.log").unlink(missing_ok=True)
            (folder / ".ready").touch()
            TIMINGS["first_start_s"] = round(time.monotonic() - began, 1)
    return folder


def launch(workdir: Path) -> Server:
    """Install (cached), migrate (cached), copy the template and start a server."""
    began = time.monotonic()
    python = ensure_installed()
    source = template(python)
    data = workdir / "label-studio-data"
    shutil.copytree(source, data, ignore=shutil.ignore_patterns(".ready", "*.lock"))
    began_start = time.monotonic()
    server = start(data, python)
    TIMINGS["start_s"] = round(time.monotonic() - began_start, 1)
    TIMINGS["ready_s"] = round(time.monotonic() - began, 1)
    return server
