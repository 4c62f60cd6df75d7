"""What a user expects to find: every option's default in `--help`, a word when training cut
sequences to --max-length, and a progress bar on stderr when it is a terminal (eval, report,
`--server ingest`)."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import struct
import subprocess
import sys
import termios

import pytest

from service.cli.main import DefaultsShown, build_parser, leaves, main
from tests.service.conftest import API_KEY, ROOT

ENV = {**os.environ, "PYTHONPATH": str(ROOT)}
LEAVES = list(leaves(build_parser()))


@pytest.mark.parametrize("path,parser", LEAVES, ids=[" ".join(p) for p, _ in LEAVES])
def test_every_help_shows_every_default(path, parser):
    formatter = DefaultsShown(prog="bradley")
    for action in parser._actions:
        default = action.default
        if not action.option_strings or default is None or default is False or action.help == "==SUPPRESS==":
            continue
        if default == "==SUPPRESS==":
            continue
        shown = formatter._get_help_string(action)
        assert "default" in shown.lower(), f"bradley {' '.join(path)} {action.option_strings[-1]}"


def test_the_training_help_names_the_defaults_people_look_for():
    train_rm = dict(LEAVES)[("train", "rm")].format_help()
    for line in ("(default: 8)", "(default: 512)", "(default: 3)", "default: 1e-3 for tiny"):
        assert line in " ".join(train_rm.split()), line


def _pairs(path, n: int, words: int):
    rows = [{"prompt": f"question {i} " + "word " * words + "?", "chosen": f"yes {i}",
             "rejected": f"no {i}"} for i in range(n)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_training_says_how_many_pairs_were_cut(tmp_path, capsys):
    db = str(tmp_path / "store.duckdb")
    assert main(["--db", db, "ingest", str(_pairs(tmp_path / "long.jsonl", 10, 60))]) == 0
    assert main(["--db", db, "train", "rm", "--base-model", "tiny", "--device", "cpu", "--steps",
                 "1", "--batch-size", "2", "--max-length", "24", "--out", str(tmp_path / "rm")]) == 0
    captured = capsys.readouterr()
    metrics = json.loads(captured.out.strip().splitlines()[-1])
    assert metrics["n_truncated"] == 10
    assert "10 of 10 pairs were longer than --max-length 24 tokens and were cut" in captured.err


def _on_a_terminal(argv, env=None) -> tuple[int, str, str]:
    """Run bradley with stderr on a pseudo-terminal; (status, stdout, what the terminal got)."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 120, 0, 0))  # a window's size
    process = subprocess.Popen([sys.executable, "-m", "service.cli", *argv], cwd=ROOT,
                               env={**ENV, **(env or {})}, stdout=subprocess.PIPE, stderr=slave)
    os.close(slave)
    seen = b""
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        seen += chunk
    os.close(master)
    out = process.stdout.read().decode()
    return process.wait(timeout=300), out, seen.decode(errors="replace")


def test_eval_shows_progress_on_a_terminal(tiny_models, tmp_path):
    data = _pairs(tmp_path / "pairs.jsonl", 6, 3)
    status, out, terminal = _on_a_terminal(["eval", tiny_models["rm-tiny-a"], "--data", str(data),
                                            "--device", "cpu"])
    assert status == 0 and json.loads(out.strip().splitlines()[-1])["n_pairs"] == 6
    assert "eval: 100%" in terminal and "12/12" in terminal


def test_report_shows_progress_on_a_terminal(tmp_path):
    db = str(tmp_path / "store.duckdb")
    assert main(["--db", db, "ingest", str(_pairs(tmp_path / "p.jsonl", 6, 3))]) == 0
    status, _, terminal = _on_a_terminal(["--db", db, "report"])
    assert status == 0 and "%" in terminal


def test_server_ingest_shows_progress_on_a_terminal(live, tmp_path):
    data = _pairs(tmp_path / "p.jsonl", 30, 3)
    status, out, terminal = _on_a_terminal(["--server", live.url, "ingest", str(data)],
                                           {"BRADLEY_API_KEY": API_KEY})
    assert status == 0 and "30 rows in 1 upload(s)" in out
    assert f"sending {data}" in terminal and "/30" in terminal
