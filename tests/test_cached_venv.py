"""tests/cached_venv.py, offline: a venv is built once (locked, logged, reused), a source-only
package's wheel already in wheels/ is installed instead of compiled, a failing build leaves nothing
half-made, and a llama-cpp venv built by the former helper is adopted without a rebuild.

pip runs with PIP_NO_INDEX=1, so nothing here reaches a registry: the only package is a wheel this
test writes (the wheel format, PEP 427: a zip with the package, METADATA, WHEEL and RECORD).
"""

import base64
import hashlib
import zipfile
from pathlib import Path

import pytest

from tests import cached_venv

OFFLINE = {"PIP_NO_INDEX": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}


@pytest.fixture
def root(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("BRADLEY_TEST_CACHE", str(tmp_path))
    return tmp_path


def write_wheel(folder: Path, name: str = "bradleydemo", version: str = "0.1") -> Path:
    """A pure-Python wheel whose module says `VALUE = 7`."""
    files = {f"{name}/__init__.py": "VALUE = 7\n",
             f"{name}-{version}.dist-info/METADATA":
                 f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
             f"{name}-{version}.dist-info/WHEEL":
                 "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    record = [f"{path},sha256={base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b'=').decode()},"
              f"{len(text.encode())}" for path, text in files.items()]
    files[f"{name}-{version}.dist-info/RECORD"] = "\n".join(record + [f"{name}-{version}.dist-info/RECORD,,"]) + "\n"
    folder.mkdir(parents=True, exist_ok=True)
    wheel = folder / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        for path, text in files.items():
            z.writestr(path, text)
    return wheel


def test_a_venv_is_built_once_from_its_cached_wheel_logged_and_reused(root):
    import subprocess

    write_wheel(root / "demo" / "wheels")  # as if compiled by an earlier build: no sdist exists
    python = cached_venv.ensure_venv("demo/venv", [], compile_first=("bradleydemo==0.1",), env=OFFLINE)
    assert python == root / "demo" / "venv" / "bin" / "python"
    out = subprocess.run([str(python), "-c", "import bradleydemo; print(bradleydemo.VALUE)"],
                         capture_output=True, text=True, check=True).stdout
    assert out == "7\n"
    assert (root / "demo" / "venv" / cached_venv.READY).read_text() == "bradleydemo==0.1\n"
    log = root / "demo" / "venv.build.log"
    text = log.read_text()
    assert "pip wheel" in text and text.rstrip().splitlines()[-1].startswith("== built in ")
    again = cached_venv.ensure_venv("demo/venv", [], compile_first=("bradleydemo==0.1",), env=OFFLINE)
    assert again == python and log.read_text() == text  # nothing ran the second time


def test_a_failing_build_leaves_no_venv_and_names_its_log(root):
    with pytest.raises(RuntimeError, match=r"bad\.build\.log ends:"):
        cached_venv.ensure_venv("bad", ["no-such-package-for-bradley"], env=OFFLINE)
    assert not (root / "bad").exists() and not (root / "bad.building").exists()
    assert "== failed after" in (root / "bad.build.log").read_text()


def test_a_llama_cpp_venv_of_the_former_helper_is_adopted_without_a_rebuild(root):
    venv = root / f"llama-cpp-python-{cached_venv.LLAMA_CPP_VERSION}" / "venv"
    venv.mkdir(parents=True)
    (venv / ".installed").write_text(cached_venv.LLAMA_CPP_VERSION + "\n")  # its marker
    assert cached_venv.llama_cpp_venv() == venv / "bin" / "python"
    assert not list(venv.parent.glob("*.build.log"))  # nothing was built
    assert (venv / cached_venv.READY).read_text().startswith("llama-cpp-python==0.3.16 sse-starlette")
