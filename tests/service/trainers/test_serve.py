"""`bradley serve` as a real process: SIGTERM drains requests in flight; start-up errors are messages."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import httpx

from service.cli import main as cli
from service.client import ScoreClient
from service.ports import free_port
from tests.service.conftest import ROOT, make_db


def _queued(url: str) -> float:
    text = httpx.get(f"{url}/metrics").text
    return float(re.search(r"^bradley_queue_items (\S+)$", text, re.M).group(1))


def _wait_ready(server: subprocess.Popen, url: str) -> None:
    client = ScoreClient(url, retries=0)
    while server.poll() is None:
        try:
            client.wait_ready(timeout=1)
            return
        except TimeoutError:
            continue
    raise AssertionError(f"the server exited with status {server.returncode} before it was ready")


def test_sigterm_drains_in_flight_requests(tmp_path, tiny_models, hh_items):
    db = make_db(tmp_path / "serve.duckdb", tiny_models)
    port = free_port()
    log = open(tmp_path / "server.log", "wb")
    # batches wait up to 10 s to fill, so the requests below are surely still queued at SIGTERM;
    # the clients give up after 8 s, so only a shutdown that flushes the queue at once passes
    env = {**os.environ, "BRADLEY_MAX_WAIT_MS": "10000", "BRADLEY_MAX_BATCH_ITEMS": "1000",
           "BRADLEY_DEVICE": "cpu"}
    server = subprocess.Popen(
        [sys.executable, "-m", "service.cli", "--db", db, "serve", "--port", str(port),
         "--model", "rm-tiny-a"], env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_ready(server, url)
        body = {"items": [{"prompt": hh_items[0][0], "response": hh_items[0][1]}]}
        with ThreadPoolExecutor(12) as pool:
            futures = [pool.submit(httpx.post, f"{url}/score", json=body, timeout=8)
                       for _ in range(12)]
            deadline = time.monotonic() + 30
            while _queued(url) < 12 and time.monotonic() < deadline:
                time.sleep(0.05)
            assert _queued(url) == 12
            server.send_signal(signal.SIGTERM)
            responses = [f.result() for f in futures]
        assert [r.status_code for r in responses] == [200] * 12
        assert len({r.json()["scores"][0] for r in responses}) == 1
        # uvicorn re-raises the signal once it has shut down, so supervisors see a SIGTERM exit
        assert server.wait(timeout=60) == -signal.SIGTERM
        assert "Traceback" not in (tmp_path / "server.log").read_text()
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
        log.close()


def test_serve_with_an_unknown_model_is_an_error_message(tmp_path, tiny_models, capsys):
    db = make_db(tmp_path / "err.duckdb", tiny_models)
    status = cli.main(["--db", db, "serve", "--port", str(free_port()), "--model", "no-such-model"])
    err = capsys.readouterr().err
    assert status == cli.EXIT_ERROR
    assert "no-such-model" in err and "not found" in err and "Traceback" not in err


def test_serve_with_bad_settings_names_the_variable(monkeypatch, capsys):
    monkeypatch.setenv("BRADLEY_MAX_BATCH_ITEMS", "0")
    assert cli.main(["serve"]) == cli.EXIT_ERROR
    assert "BRADLEY_MAX_BATCH_ITEMS" in capsys.readouterr().err
