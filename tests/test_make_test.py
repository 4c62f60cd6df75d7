"""`make test` is CI's run on a fresh machine: the Makefile's test target sets up the system tools the
suite needs first (.ci/system-tools: Debian's prometheus for promtool, headless Chromium), and
.ci/run is `make test` and nothing else. The set-up installs what is missing when it can (apt-get
as root, or sudo without a password) and otherwise stops with one line naming what to install."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SETUP = ROOT / ".ci" / "system-tools"


def test_make_test_sets_up_the_system_tools_before_the_suite():
    # --no-print-directory: under CI, make runs this suite and a nested make would name its directory
    dry = subprocess.run(["make", "-n", "--no-print-directory", "test"], cwd=ROOT, capture_output=True,
                         text=True, check=True)
    commands = dry.stdout.splitlines()
    assert commands[0] == ".ci/system-tools"
    assert any("pytest" in c for c in commands[1:])


def test_ci_is_make_test():
    lines = [line for line in (ROOT / ".ci" / "run").read_text().splitlines()
             if line.strip() and not line.startswith("#")]
    assert lines[-1] == "exec make test"
    assert not any("apt-get" in line or "export" in line for line in lines)


def _bin(tmp_path: Path, fakes: dict[str, str]) -> dict:
    """An environment whose PATH holds only bash, env and the given fake commands."""
    folder = tmp_path / "bin"
    folder.mkdir()
    for name in ("bash", "env"):
        (folder / name).symlink_to(shutil.which(name))
    for name, body in fakes.items():
        (folder / name).write_text(f"#!{shutil.which('bash')}\n{body}\n")
        (folder / name).chmod(0o755)
    return {"PATH": str(folder), "HOME": str(tmp_path)}


def _setup(env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([shutil.which("bash"), str(SETUP)], env=env, capture_output=True, text=True,
                          timeout=60)


def test_missing_tools_that_cannot_be_installed_stop_with_one_line(tmp_path):
    run = _setup(_bin(tmp_path, {"id": "echo 1000", "sudo": "exit 1"}))  # no root, no sudo
    assert run.returncode == 1
    assert run.stderr.strip().splitlines() == [
        "make test needs prometheus chromium (promtool for tests/deploy, chromium for tests/docs): "
        "install them, e.g. `sudo apt-get install prometheus chromium`, then run make test again"]


def test_missing_tools_are_installed_as_root(tmp_path):
    log = tmp_path / "apt.log"
    run = _setup(_bin(tmp_path, {"id": "echo 0", "apt-get": f'echo "$*" >> {log}'}))
    assert run.returncode == 0, run.stderr
    assert log.read_text().splitlines() == [
        "update -qq", "install -y -qq --no-install-recommends prometheus chromium"]

