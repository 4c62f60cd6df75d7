"""A real Prometheus (Debian's package) on 127.0.0.1 scrapes a real `bradley serve` and evaluates
deploy/prometheus/rules.yml: its query API returns bradley_ series, a series for every recording
rule, every rule healthy, and data for every Grafana panel's query.

The scrape job is the one in deploy/prometheus/prometheus.yml with its target pointed at the test
server and its interval shortened to 1 s; the rule groups are evaluated every second for the same
reason. The server runs with BRADLEY_METRICS_REQUIRE_KEY=true, so the job also sends one of its keys
as a bearer token read from a file (Prometheus's `authorization.credentials_file`), as a deployment
that keeps /metrics private would.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from tests.deploy.conftest import DEPLOY, ROOT, RULES, recording_rules, tool
from tests.deploy.test_grafana import panel_queries

API_KEY = "deploy-test-key-0123"
UPLOADS = itertools.count()
TEXTS = [f"question {i}: which answer is better? answer {i} is short and answer {i * 3} is long"
         for i in range(60)]


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for(url: str, proc: subprocess.Popen, log: Path, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"{proc.args[0]} exited ({proc.returncode}): {log.read_text()[-2000:]}")
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    raise AssertionError(f"{url} not ready in {timeout} s: {log.read_text()[-2000:]}")


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """`bradley serve` (the CLI, its own process) with a tiny reward model, its reference statistics
    (so the watch's gauges exist) and a store."""
    from rm.model.reference_stats import compute_reference_stats, write_reference_stats
    from rm.model.reward_model import RewardModel, build_tiny_reward_model

    tmp = tmp_path_factory.mktemp("served")
    model = build_tiny_reward_model(tmp / "rm", TEXTS, hidden=32, layers=1, vocab_size=300)
    items = [(text, text[::-1]) for text in TEXTS]
    write_reference_stats(model, compute_reference_stats(RewardModel.load(model, device="cpu"),
                                                         items[:40], items[40:], rank=4))
    port, log = free_port(), tmp / "serve.log"
    env = {**os.environ, "BRADLEY_API_KEYS": API_KEY, "BRADLEY_METRICS_REQUIRE_KEY": "true",
           "BRADLEY_DEVICE": "cpu",
           "BRADLEY_TORCH_THREADS": "1", "OMP_NUM_THREADS": "1", "BRADLEY_LOG_LEVEL": "warning"}
    proc = subprocess.Popen([sys.executable, "-m", "service.cli", "--db", str(tmp / "s.duckdb"),
                             "serve", "--port", str(port), "--model", str(model)],
                            cwd=ROOT, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT)
    try:
        wait_for(f"http://127.0.0.1:{port}/readyz", proc, log)
        yield f"127.0.0.1:{port}"
    finally:
        stop(proc)


def scrape_config(target: str, tmp: Path, rules: dict | None = None, key: str | None = API_KEY) -> Path:
    """deploy/prometheus/prometheus.yml scraping `target` every second (with `key` as its bearer
    token, when given), and `rules` (default rules.yml) beside it, evaluated every second."""
    config = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    config["global"] |= {"scrape_interval": "1s", "evaluation_interval": "1s"}
    (job,) = config["scrape_configs"]
    job["static_configs"] = [{"targets": [target]}]
    if key is not None:
        (tmp / "bradley-key").write_text(key)
        job["authorization"] = {"type": "Bearer", "credentials_file": str(tmp / "bradley-key")}
    rules = rules or yaml.safe_load(RULES.read_text())
    for group in rules["groups"]:
        group["interval"] = "1s"
    (tmp / "rules.yml").write_text(yaml.safe_dump(rules))
    path = tmp / "prometheus.yml"
    path.write_text(yaml.safe_dump(config))
    return path


@contextlib.contextmanager
def running_prometheus(config: Path, tmp: Path) -> Iterator[str]:
    """Prometheus on `config`, its data and log in `tmp`, until the block ends: its URL."""
    port, log = free_port(), tmp / "prometheus.log"
    proc = subprocess.Popen([tool("prometheus"), f"--config.file={config}",
                             f"--storage.tsdb.path={tmp / 'data'}",
                             f"--web.listen-address=127.0.0.1:{port}"],
                            cwd=tmp, stdout=log.open("wb"), stderr=subprocess.STDOUT)
    try:
        wait_for(f"http://127.0.0.1:{port}/-/ready", proc, log, timeout=60)
        yield f"http://127.0.0.1:{port}"
    finally:
        stop(proc)


@pytest.fixture(scope="module")
def prometheus(served, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("prometheus")
    with running_prometheus(scrape_config(served, tmp), tmp) as url:
        yield url


def traffic(target: str) -> None:
    """Scores, one GRPO group checked by the gsm8k verifier, one upload with a good and a bad row,
    and a 404."""
    url = f"http://{target}"
    for i in range(5):
        body = {"items": [{"prompt": TEXTS[i], "response": TEXTS[i + k][:20 + 9 * k]} for k in range(4)]}
        assert httpx.post(f"{url}/score", json=body, timeout=30).status_code == 200
    group = [{"prompt": "3 + 7 apples?", "response": r, "ground_truth": 10, "verifier": "gsm8k"}
             for r in ("#### 10", "#### 7", "3+7 = 10\n#### 10", "ten")]
    graded = httpx.post(f"{url}/score", json={"items": group, "group_size": 4}, timeout=30)
    assert graded.status_code == 200 and graded.json()["correct"] == [True, False, True, False], graded.text
    prompt = f"upload {next(UPLOADS)}"   # a new batch each time (the same content is a no-op)
    rows = [{"prompt": prompt, "response_a": "x", "response_b": "yy", "winner": "a", "rater": "human:1"},
            {"prompt": prompt, "response_a": "x", "response_b": "yy", "winner": "maybe",
             "rater": "human:2"}]
    upload = httpx.post(f"{url}/judgments?on_error=skip", json=rows, timeout=30,
                        headers={"Authorization": f"Bearer {API_KEY}"})
    assert upload.status_code == 201 and upload.json()["rows_rejected"] == 1, upload.text
    httpx.get(f"{url}/nowhere", timeout=5)


def query(prometheus: str, expr: str) -> list[dict]:
    body = httpx.get(f"{prometheus}/api/v1/query", params={"query": expr}, timeout=10).json()
    assert body["status"] == "success", body
    return body["data"]["result"]


def poll(prometheus: str, target: str, expr: str, timeout: float = 60) -> list[dict]:
    deadline = time.monotonic() + timeout
    while not (found := query(prometheus, expr)) and time.monotonic() < deadline:
        traffic(target)
        time.sleep(1)
    return found


def test_prometheus_scrapes_bradley_and_records_every_rule(prometheus, served):
    assert httpx.get(f"http://{served}/metrics", timeout=5).status_code == 401   # the key matters
    traffic(served)
    series = poll(prometheus, served, '{__name__=~"bradley_.+"}')
    names = {s["metric"]["__name__"] for s in series}
    assert {"bradley_scored_items_total", "bradley_request_seconds_bucket", "bradley_queue_items",
            "bradley_model_ready", "bradley_model_info"} <= names
    ready = query(prometheus, "bradley_model_ready")
    assert [float(s["value"][1]) for s in ready] == [1.0]
    scored = query(prometheus, "bradley_scored_items_total")
    assert float(scored[0]["value"][1]) >= 20
    for record in sorted(recording_rules()):
        assert poll(prometheus, served, record), f"no series for recording rule {record}"


def test_every_rule_is_healthy_and_loaded(prometheus, served):
    poll(prometheus, served, "job:bradley_scored_items:rate1m")
    groups = httpx.get(f"{prometheus}/api/v1/rules", timeout=10).json()["data"]["groups"]
    rules = [r for g in groups for r in g["rules"]]
    loaded = {r["name"] for r in rules}
    expected = recording_rules() | {r["alert"] for g in yaml.safe_load(RULES.read_text())["groups"]
                                    for r in g["rules"] if "alert" in r}
    assert loaded == expected
    assert all(r["health"] == "ok" for r in rules), [(r["name"], r.get("lastError")) for r in rules]


def test_every_grafana_panel_query_returns_data(prometheus, served):
    poll(prometheus, served, "job:bradley_ingest_rows_rejected_ratio:rate15m")
    for where, expr in panel_queries():
        assert poll(prometheus, served, expr, timeout=20), f"{where}: {expr!r} returned nothing"
