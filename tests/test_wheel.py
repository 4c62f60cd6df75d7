"""The distribution as a user installs it: `pip install .` (not editable) carries every sub-package,
the schema and the constitutions, and `bradley --help` and `bradley demo` run from outside the
checkout with nothing of the checkout on the path."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("annotation", "analysis", "rm", "service")


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """The wheel built from this checkout, installed (without its dependencies, which this venv
    has) into a folder of its own: (wheel, site folder)."""
    work = tmp_path_factory.mktemp("wheel")
    source = work / "source"  # the checkout's files as git sees them: no build/ or stale outputs
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, text=True, check=True).stdout.splitlines()
    for name in listed:
        if (ROOT / name).is_file():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, source / name)
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                            "-w", str(work / "dist"), str(source)], capture_output=True, text=True)
    assert built.returncode == 0, built.stderr[-3000:]
    assert "warning" not in built.stderr.lower(), built.stderr[-3000:]
    (wheel,) = (work / "dist").glob("bradley-*.whl")
    site = work / "site"
    done = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-index",
                           "--target", str(site), str(wheel)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    return wheel, site


def test_the_wheel_holds_every_package_and_its_data(installed):
    wheel, _ = installed
    names = set(zipfile.ZipFile(wheel).namelist())
    packages = {str(p.parent.relative_to(ROOT)) for pkg in PACKAGES for p in (ROOT / pkg).rglob("__init__.py")}
    missing = sorted(p for p in packages if f"{p}/__init__.py" not in names)
    assert missing == []
    assert "annotation/schema.sql" in names
    assert {"annotation/rlaif/constitutions/default.toml",
            "annotation/rlaif/constitutions/helpful.toml"} <= names
    assert not any(n.startswith("tests/") for n in names)
    import annotation.ids

    if annotation.ids.native is not None:  # built here, so the wheel's build has it too
        assert any(n.startswith("annotation/_sha256.") and n.endswith((".so", ".pyd")) for n in names)


def _outside(site: Path, tmp_path: Path, *argv: str, timeout: float) -> subprocess.CompletedProcess:
    """`bradley ARGV` in an empty folder, importing bradley from the installed wheel only."""
    env = {**os.environ, "PYTHONPATH": str(site), "PYTHONSAFEPATH": "1"}
    probe = ("import sys, service, rm; from service.cli.main import main; "
             "assert all(str(m.__file__).startswith(sys.argv[1]) for m in (service, rm)), "
             "(service.__file__, rm.__file__); sys.argv[1:2] = []; sys.exit(main(sys.argv[1:]))")
    return subprocess.run([sys.executable, "-c", probe, str(site), *argv], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=timeout)


def test_help_from_the_installed_wheel(installed, tmp_path):
    done = _outside(installed[1], tmp_path, "--help", timeout=60)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "ingest" in done.stdout and "serve" in done.stdout


@pytest.mark.slow
def test_demo_from_the_installed_wheel(installed, tmp_path):
    done = _outside(installed[1], tmp_path, "demo", "--workdir", "demo", timeout=900)
    assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-3000:])
    assert (tmp_path / "demo" / "report.html").is_file()
    assert "demo finished" in done.stdout and "reward 1.1" in done.stdout
