"""Clients that stall or hang up mid-request, against a real uvicorn server on 127.0.0.1: a body
that stops arriving is answered 408 within BRADLEY_BODY_READ_TIMEOUT_S and gives its anonymous slot
back, and a client that closes its connection is counted as 499 with one log line, never as a 500."""

from __future__ import annotations

import json
import logging
import socket
import time

import httpx
import pytest

from service.api.settings import load_settings
from tests.service.conftest import API_KEY, free_port, make_db, start_live, stop_live

GOOD = {"items": [{"prompt": "What is 2+2?", "response": "4"}]}
DEADLINE_S = 1.0


@pytest.fixture(scope="module")
def stalled(tmp_path_factory, tiny_models):
    """Two anonymous requests in flight per client, and a one-second body deadline."""
    db = make_db(tmp_path_factory.mktemp("slow") / "slow.duckdb", tiny_models)
    settings = load_settings(db=db, model="rm-tiny-a", api_keys=API_KEY, port=free_port(),
                             device="cpu", anon_max_concurrent=2, body_read_timeout_s=DEADLINE_S)
    server = start_live(settings)
    yield server
    stop_live(server)


def _half_sent(url: str, path: str = "/score", key: str | None = None) -> socket.socket:
    """A connection that sent its headers and the start of a 1,000-byte body, and then nothing."""
    host, port = url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=10)
    auth = f"Authorization: Bearer {key}\r\n" if key else ""
    sock.sendall(f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
                 f"{auth}Content-Length: 1000\r\n\r\n".encode() + b'{"items": [')
    return sock


def _status_line(sock: socket.socket) -> bytes:
    return sock.recv(65536).split(b"\r\n", 1)[0]


def test_a_stalled_body_gets_408_and_frees_its_anonymous_slot(stalled):
    held = [_half_sent(stalled.url) for _ in range(2)]
    try:
        time.sleep(0.2)
        assert httpx.post(stalled.url + "/score", json=GOOD).status_code == 429  # both slots held
        started = time.monotonic()
        lines = [_status_line(sock) for sock in held]
        waited = time.monotonic() - started
    finally:
        for sock in held:
            sock.close()
    assert all(b" 408 " in line for line in lines), lines
    assert waited < DEADLINE_S + 1.0
    answer = httpx.post(stalled.url + "/score", json=GOOD)
    assert answer.status_code == 200 and len(answer.json()["scores"]) == 1


def test_the_408_says_which_setting_bounds_it(stalled):
    sock = _half_sent(stalled.url)
    try:
        reply = b""
        while b"}" not in reply:
            chunk = sock.recv(65536)
            if not chunk:
                break
            reply += chunk
    finally:
        sock.close()
    assert b"connection: close" in reply.lower()
    body = json.loads(reply.split(b"\r\n\r\n", 1)[1])
    assert body["field"] == "body" and "BRADLEY_BODY_READ_TIMEOUT_S" in body["error"]


def _responses(url: str, status: str) -> float:
    text = httpx.get(url + "/metrics").text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("bradley_responses_total{") and f'status="{status}"' in line)


@pytest.mark.parametrize("path", ["/score", "/judgments"])
def test_a_client_that_hangs_up_is_499_not_500(stalled, caplog, path):
    before_500, before_499 = _responses(stalled.url, "500"), _responses(stalled.url, "499")
    with caplog.at_level(logging.INFO, logger="bradley.service"):
        sock = _half_sent(stalled.url, path, key=API_KEY if path == "/judgments" else None)
        time.sleep(0.2)
        sock.close()
        deadline = time.monotonic() + 5
        while _responses(stalled.url, "499") == before_499 and time.monotonic() < deadline:
            time.sleep(0.05)
    assert _responses(stalled.url, "499") == before_499 + 1
    assert _responses(stalled.url, "500") == before_500
    lines = [r for r in caplog.records if r.name == "bradley.service" and "closed" in r.getMessage()]
    assert len(lines) == 1 and lines[0].exc_info is None
    assert not any(r.exc_info for r in caplog.records)

