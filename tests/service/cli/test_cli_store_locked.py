"""A store another process holds, and a store that is not there: `train rm` that finds the file
locked when it ends says where the weights are and how to register them (and `models register`
then does), the lock message shows the holder's whole command and suggests `--server` only when
the holder is a `bradley serve`, and commands that read a store refuse a missing `--db`."""

from __future__ import annotations

import gzip
import itertools
import json
import os
import subprocess
import sys
import time
from contextlib import redirect_stdout
from io import StringIO

import httpx
import pytest

from service.cli.main import main
from service.ports import free_port
from tests.service.conftest import HH_FILE, ROOT

TRAIN = ["--base-model", "tiny", "--device", "cpu", "--steps", "2", "--batch-size", "4",
         "--max-length", "64"]
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}
HOLD = "import duckdb, sys, time; con = duckdb.connect(sys.argv[1]); print('HOLDING', flush=True); time.sleep(120)"


@pytest.fixture
def hh_db(tmp_path, shared_data) -> str:
    with gzip.open(shared_data / HH_FILE, "rt", encoding="utf-8") as f:
        rows = [json.loads(line) for line in itertools.islice(f, 30)]
    data = tmp_path / "hh.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    db = str(tmp_path / "store.duckdb")
    assert main(["--db", db, "ingest", str(data)]) == 0
    return db


def _hold(db: str) -> subprocess.Popen:
    holder = subprocess.Popen([sys.executable, "-c", HOLD, db], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "HOLDING"
    return holder


def _stop(process: subprocess.Popen) -> None:
    process.kill()
    process.wait(timeout=30)


def test_train_rm_that_finds_the_store_locked_at_the_end_says_how_to_register(hh_db, tmp_path,
                                                                             monkeypatch, capsys):
    from rm.train import reward

    holders, trained = [], reward.train_reward_model

    def then_locked(config, inputs):
        metrics = trained(config, inputs)
        holders.append(_hold(hh_db))  # a server started while the run trained
        return metrics

    monkeypatch.setattr(reward, "train_reward_model", then_locked)
    folder = tmp_path / "rm-out"
    try:
        status = main(["--db", hh_db, "train", "rm", "--out", str(folder), *TRAIN])
    finally:
        for holder in holders:
            _stop(holder)
    err = capsys.readouterr().err.strip().splitlines()
    errors = [line for line in err if ": error: " in line]  # the others: notices of the run
    assert status == 1 and len(errors) == 1 and errors == err[-1:]
    assert not any("Traceback" in line for line in err)
    assert f"saved in {folder}" in errors[0] and f"models register {folder}" in errors[0]
    assert (folder / "model.safetensors").is_file()
    buf = StringIO()
    with redirect_stdout(buf):
        assert main(["models", "register", str(folder), "--db", hh_db]) == 0
    registered = json.loads(buf.getvalue())
    assert registered["registered"] is True and registered["path"] == str(folder)
    from annotation.store import Store

    with Store(hh_db, read_only=True) as store:
        assert store.model(registered["id"])["path"] == str(folder)


def test_the_lock_message_shows_the_whole_command_and_no_server_for_a_non_server(hh_db, capsys):
    holder = _hold(hh_db)
    try:
        assert main(["--db", hh_db, "snapshots"]) == 1
    finally:
        _stop(holder)
    err = capsys.readouterr().err
    assert f"PID {holder.pid}: {sys.executable} -c {HOLD} {hh_db}" in err
    assert "--server" not in err and len(err.strip().splitlines()) == 1


def test_the_lock_message_sends_the_work_to_a_bradley_serve_holder(hh_db, capsys):
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "service.cli", "--db", hh_db, "serve", "--port",
                               str(port)], cwd=ROOT, env=ENV, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/healthz").status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.2)
        assert main(["--db", hh_db, "export", "--format", "jsonl", "out.jsonl"]) == 1
    finally:
        _stop(server)
    err = capsys.readouterr().err
    assert "held by a running `bradley serve`" in err and f"serve --port {port}" in err
    assert "bradley --server URL" in err


@pytest.mark.parametrize("argv", [["train", "rm", *TRAIN], ["export", "--format", "jsonl", "o.jsonl"],
                                  ["snapshots"], ["models", "list"], ["eval", "rm-x"]])
def test_commands_that_read_a_store_refuse_a_missing_db(tmp_path, capsys, argv):
    db = tmp_path / "typo.duckdb"
    assert main(["--db", str(db), *argv]) == 1
    err = capsys.readouterr().err
    assert f"no store at {db}" in err and len(err.strip().splitlines()) == 1
    assert not db.exists() and not list(tmp_path.glob("models*"))
