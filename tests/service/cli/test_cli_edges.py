"""The CLI's smaller edges, each one line on stderr and a documented exit status, never a traceback:
a row too large for the server is 413 with its limit; a closed stdout (`| head -1`) ends quietly
with 0; a port in use is exit 4; `--server ingest` lists its batches one a line and, when the server
goes away, says how many uploads it had acknowledged; a training run says when it stopped early
and why the reference pass covers more than --steps uses."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest

from service.api.settings import load_settings
from service.cli.main import EXIT_PORT_IN_USE, main
from service.remote import commands as cli_server
from tests.service.conftest import API_KEY, ROOT, free_port, make_db, start_live, stop_live

ENV = {**os.environ, "PYTHONPATH": str(ROOT)}
TINY = ["--base-model", "tiny", "--device", "cpu", "--max-length", "48", "--batch-size", "2"]


@pytest.fixture
def keyed(monkeypatch):
    monkeypatch.setenv("BRADLEY_API_KEY", API_KEY)


def _pairs(path, n: int, tag: str, width: int = 0):
    rows = [{"prompt": f"edges {tag} {i:03d}?" + "x" * width, "chosen": f"a fine answer {i}",
             "rejected": f"no {i}"} for i in range(n)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture
def pairs_db(tmp_path) -> str:
    db = str(tmp_path / "store.duckdb")
    assert main(["--db", db, "ingest", str(_pairs(tmp_path / "p.jsonl", 12, "db"))]) == 0
    return db


def test_a_row_over_the_body_limit_is_413_with_the_limit(live, keyed, tmp_path, capsys):
    path = _pairs(tmp_path / "big.jsonl", 3, "big", width=2 * 1024 * 1024)
    assert main(["--server", live.url, "ingest", str(path)]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err and "reset" not in err
    assert "HTTP 413" in err and "limit of 65,536" in err and "BRADLEY_MAX_BODY_BYTES" in err


@pytest.mark.parametrize("argv", [["report"], ["models", "list"]])
def test_a_closed_stdout_ends_quietly_with_0(pairs_db, tiny_models, argv):
    from annotation.store import Store

    with Store(pairs_db) as store:
        for i in range(3):
            store.register_model("rm", "tiny", tiny_models["rm-tiny-a"], None, {}, {},
                                 model_id=f"rm-edge-{i}")
    process = subprocess.Popen([sys.executable, "-m", "service.cli", "--db", pairs_db, *argv],
                               cwd=ROOT, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    process.stdout.close()  # `| head -1` that has already read its line
    err = process.stderr.read().decode()
    assert process.wait(timeout=120) == 0 and err == ""


def test_a_port_in_use_is_exit_4_before_anything_loads(pairs_db, capsys):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["--db", pairs_db, "serve", "--port", str(port)]) == EXIT_PORT_IN_USE == 4
    err = capsys.readouterr().err.strip()
    assert err == (f"bradley serve: error: port {port} on 127.0.0.1 is already in use by another "
                   "process; stop it, or pass --port N (env BRADLEY_PORT)")


@pytest.fixture
def doomed(tmp_path, tiny_models):
    """A server of its own, which a test may stop half-way through an ingest."""
    settings = load_settings(db=make_db(tmp_path / "doomed.duckdb", tiny_models), api_keys=API_KEY,
                             port=free_port(), device="cpu")
    server = start_live(settings)
    yield server
    if server.server.thread.is_alive():
        stop_live(server)


def test_server_ingest_lists_its_batches_one_a_line(doomed, keyed, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(cli_server, "UPLOAD_BYTES", 2_000)
    assert main(["--server", doomed.url, "ingest", str(_pairs(tmp_path / "p.jsonl", 60, "list"))]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    uploads = int(lines[0].split(" rows in ")[1].split(" upload")[0])
    assert uploads > 2 and lines[0].endswith("60 ok, 0 rejected, 0 already there")
    assert len(lines) == 1 + uploads and all(line.startswith("batch ") for line in lines[1:])


def test_a_server_gone_half_way_says_what_was_acknowledged(doomed, keyed, tmp_path, capsys,
                                                           monkeypatch):
    monkeypatch.setattr(cli_server, "UPLOAD_BYTES", 2_000)
    posted, real_post = [], cli_server.post

    def post_then_die(client, path, upload):
        if len(posted) == 2:
            stop_live(doomed)  # the server is killed after two acknowledged uploads
        answers = real_post(client, path, upload)
        posted.append(len(upload))
        return answers

    monkeypatch.setattr(cli_server, "post", post_then_die)
    assert main(["--server", doomed.url, "ingest", str(_pairs(tmp_path / "p.jsonl", 60, "gone"))]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert f"acknowledged 2 upload(s) of {tmp_path / 'p.jsonl'} ({sum(posted)} rows" in err


def test_policy_training_says_why_its_reference_pass_covers_the_snapshot(pairs_db, tmp_path, capsys):
    argv = ["--db", pairs_db, "train", "po", "--loss", "dpo", *TINY, "--steps", "2",
            "--val-fraction", "0", "--out", str(tmp_path / "po")]
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert "the reference pass covers all 12 rows of the snapshot, though --steps 2 uses about 4" in err


def test_training_says_when_early_stopping_ended_it(pairs_db, tmp_path, capsys):
    argv = ["--db", pairs_db, "train", "rm", *TINY, "--steps", "40", "--eval-every", "1",
            "--patience", "1", "--lr", "1e-12", "--val-fraction", "0.5", "--out", str(tmp_path / "rm")]
    assert main(argv) == 0
    captured = capsys.readouterr()
    metrics, err = json.loads(captured.out.strip().splitlines()[-1]), captured.err
    assert metrics["stopped"] == "early_stopping" and metrics["steps"] < 40
    assert (f"early stopping ended the run at step {metrics['steps']} of 40: the validation loss did "
            "not improve for 1 evaluations (--patience)") in err
