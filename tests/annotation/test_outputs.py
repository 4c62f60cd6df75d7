"""Outputs never replace what a path points to: `export` and `report --json/--html` write through a
symlink (the link stays), write a FIFO or standard output as a stream (`-` too), rename over a
regular file only, and give new files the mode the umask gives; model folders' weights too."""

from __future__ import annotations

import contextlib
import json
import os
import stat
import subprocess
import sys
import threading

import pyarrow.parquet as pq
import pytest

from annotation.export import export
from annotation.ingest.batch import ingest_records
from annotation.outputs import write_output

ROWS = [{"prompt": f"q{i}", "response_a": "short", "response_b": "a longer answer", "winner": "ab"[i % 2],
         "rater": f"human:{i % 3}"} for i in range(12)]
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture
def filled(store):
    ingest_records(store, ROWS)
    return store


@contextlib.contextmanager
def umask(mask: int):
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


def mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


@pytest.mark.parametrize("fmt,name", [("jsonl", "out.jsonl"), ("parquet", "out.parquet"),
                                      ("trl", "pairs.jsonl")])
def test_export_through_a_symlink_writes_the_target_and_keeps_the_link(filled, tmp_path, fmt, name):
    target = tmp_path / "data" / name
    target.parent.mkdir()
    target.write_text("old")
    link = tmp_path / name
    link.symlink_to(target)
    export(filled, fmt, link)
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert target.read_bytes() != b"old" and target.stat().st_size > 100
    assert [p.name for p in target.parent.iterdir()] == [name]  # no temporary file left


@pytest.mark.parametrize("mask,expected", [(0o022, 0o644), (0o027, 0o640), (0o077, 0o600)],
                         ids=["umask-022", "umask-027", "umask-077"])
def test_new_files_get_the_umask_mode_and_a_replaced_file_keeps_its_own(filled, tmp_path, mask, expected):
    with umask(mask):
        for fmt, name in (("jsonl", "j.jsonl"), ("parquet", "j.parquet"), ("trl", "pairs.jsonl")):
            export(filled, fmt, tmp_path / name)
            assert mode(tmp_path / name) == expected, name
    kept = tmp_path / "kept.jsonl"
    kept.write_text("")
    kept.chmod(0o604)
    export(filled, "jsonl", kept)
    assert mode(kept) == 0o604


def test_model_weights_are_readable_as_the_umask_says(tmp_path):
    from rm.model.reward_model import build_tiny_reward_model

    with umask(0o022):
        folder = build_tiny_reward_model(tmp_path / "m", ["a small example text"] * 8, vocab_size=300)
    assert mode(folder / "model.safetensors") == 0o644 == mode(folder / "config.json")


def test_export_to_a_fifo_streams_into_it(filled, tmp_path):
    fifo = tmp_path / "rows.pipe"
    os.mkfifo(fifo)
    got = []
    reader = threading.Thread(target=lambda: got.append(open(fifo, "rb").read()), daemon=True)
    reader.start()
    export(filled, "jsonl", fifo)
    reader.join(30)
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)  # still a FIFO, not replaced by a file
    assert sorted(json.loads(line)["prompt"] for line in got[0].decode().splitlines()) == \
        sorted(r["prompt"] for r in ROWS)


def run_cli(*args, db, stdout=subprocess.PIPE):
    return subprocess.run([sys.executable, "-m", "service.cli", "--db", str(db), *args], cwd=ROOT,
                          stdout=stdout, stderr=subprocess.PIPE, timeout=300)


def test_export_to_dash_and_dev_stdout_writes_the_stream_and_the_summary_to_stderr(filled, tmp_path):
    filled.close()
    db = filled.path
    # /dev/stdout by a link of the test's own: a writer that replaced the path would replace this
    # link, never the machine's /dev/stdout (tests may run as root)
    stdout = tmp_path / "stdout"
    stdout.symlink_to("/dev/stdout")
    for out in ("-", str(stdout)):
        done = run_cli("export", "--format", "jsonl", out, db=db)
        assert done.returncode == 0, done.stderr
        lines = done.stdout.decode().splitlines()
        assert len(lines) == len(ROWS) and all("response_a" in json.loads(line) for line in lines)
        assert json.loads(done.stderr.decode().splitlines()[-1])["rows"] == len(ROWS)
    parquet = run_cli("export", "--format", "parquet", "-", db=db)
    (tmp_path / "from_stdout.parquet").write_bytes(parquet.stdout)
    assert pq.read_table(tmp_path / "from_stdout.parquet").num_rows == len(ROWS)
    appended = tmp_path / "log.jsonl"  # a shell's `>> log`: appended to, not truncated or replaced
    appended.write_text("first line\n")
    with open(appended, "ab") as log:
        assert run_cli("export", "--format", "jsonl", str(stdout), db=db, stdout=log).returncode == 0
    assert appended.read_text().splitlines()[0] == "first line"
    assert len(appended.read_text().splitlines()) == 1 + len(ROWS)


def test_report_json_and_html_through_a_symlink_and_to_dash(filled, tmp_path):
    filled.close()
    db = filled.path
    (tmp_path / "r.json").symlink_to(tmp_path / "target.json")
    (tmp_path / "r.html").symlink_to(tmp_path / "target.html")
    done = run_cli("report", "--json", str(tmp_path / "r.json"), "--html", str(tmp_path / "r.html"), db=db)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "r.json").is_symlink() and (tmp_path / "r.html").is_symlink()
    assert json.loads((tmp_path / "target.json").read_text())["n_judgments"] == len(ROWS)
    assert (tmp_path / "target.html").read_text().lstrip().lower().startswith("<!doctype html")
    dashed = run_cli("report", "--json", "-", db=db)
    assert json.loads(dashed.stdout)["n_judgments"] == len(ROWS)  # the summary went to stderr
    assert b"agreement" in dashed.stderr


def test_a_failed_write_leaves_the_old_file(tmp_path):
    path = tmp_path / "keep.txt"
    path.write_text("old")

    def fail(fh):
        fh.write(b"half")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError):
        write_output(path, fail)
    assert path.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["keep.txt"]
