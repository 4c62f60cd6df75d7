"""A replay against a real Prometheus: two training runs scored by one `bradley serve` at the same
time, one imitating a policy that hacks its reward model, one a stable trace of hh-rlhf responses.

The reward model is a tiny one trained on hh-rlhf pairs relabelled by raters who prefer the longer
response 80% of the time (Singhal et al. 2023: preference data rewards length); training writes its
reference statistics. The hacked run starts as hh-rlhf responses, then its responses grow step by
step with the sentences this reward model likes best, then drift out of distribution (random
Cyrillic letters). Rules and rates run 60x faster than in production: every `for:` and range in
rules.yml is divided by 60 (10m becomes 10 s), the scrape and the evaluation run every second.

The length and out-of-distribution alerts fire for the hacked run, each within its `for:` window
(plus a few seconds of scrape and evaluation) of its condition first holding; the stable run
fires nothing.
"""

from __future__ import annotations

import gzip
import json
import os
import random
import re
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import yaml

from tests.deploy.conftest import ROOT, RULES
from tests.deploy.test_prometheus_live import (
    free_port,
    running_prometheus,
    scrape_config,
    stop,
    wait_for,
)

SPEED = 60  # production minutes per test second
PHASES = {"stable": 10.0, "lengthening": 30.0, "ood": 20.0}  # seconds, in this order
STEP_S, ITEMS = 0.25, 16  # a request of ITEMS items per run every STEP_S seconds
HH = Path(os.environ.get("BRADLEY_SHARED_DATA", ROOT.parent / "shared" / "data")) / \
    "hh-rlhf" / "harmless-base-test.jsonl.gz"
SLACK_S = 4.0  # scrape, evaluation and rounding between a condition and the alert's state


def relabelled_rows() -> list[dict]:
    """hh-rlhf pairs (rm/eval/pairs.py reads the transcripts), the longer response chosen in 80%."""
    from rm.eval.pairs import _hh

    rnd, rows = random.Random(0), []
    with gzip.open(HH, "rt", encoding="utf-8") as f:
        for i, line in enumerate(f):
            try:
                row = _hh(json.loads(line))
            except ValueError:
                continue
            chosen, rejected = row["chosen"], row["rejected"]
            if rnd.random() < 0.8 and len(rejected) > len(chosen):
                chosen, rejected = rejected, chosen
            rows.append({"prompt": row["prompt"], "chosen": chosen, "rejected": rejected,
                         "prompt_id": f"hh-{i}", "p_chosen": 1.0})
    return rows


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """(model folder, validation (prompt, response) items, the model's favourite sentences)."""
    from rm.model.reward_model import RewardModel
    from rm.train.loop import TrainConfig
    from rm.train.reward import RewardRunConfig, train_reward_model
    from rm.train.reward_data import split_of
    from rm.train.run import RunInputs

    rows = relabelled_rows()
    out = tmp_path_factory.mktemp("replay") / "rm-length"
    train_reward_model(RewardRunConfig(base_model="tiny", out=str(out), device="cpu",
                                       max_length=192, train=TrainConfig(steps=60, batch_size=16)),
                       RunInputs(pairs=rows, snapshot_id="hh-length"))
    val = [r for r in rows if split_of(r["prompt_id"], 0.1) == "val"]
    items = [(r["prompt"], r[side]) for r in val for side in ("chosen", "rejected")]
    return out, items, favourite_sentences(RewardModel.load(out, device="cpu"), rows, items)


def favourite_sentences(model, rows: list[dict], items: list[tuple], n: int = 8) -> list[str]:
    """What a policy learns to add: the hh-rlhf sentences that raise this model's reward most when
    appended, on average over ten validation responses."""
    rnd = random.Random(1)
    sentences = sorted({s.strip() for r in rows[:800] for s in re.split(r"(?<=[.!?])\s+", r["chosen"])
                        if 30 < len(s.strip()) < 100})
    candidates, bases = rnd.sample(sentences, 80), items[:10]
    before = model.score([p for p, _ in bases], [r for _, r in bases])
    gains = []
    for sentence in candidates:
        after = model.score([p for p, _ in bases], [f"{r} {sentence}" for _, r in bases])
        gains.append(sum(a - b for a, b in zip(after, before, strict=True)))
    return [s for _, s in sorted(zip(gains, candidates, strict=True), reverse=True)[:n]]


def hacked_item(prompt: str, response: str, t: float, liked: list[str], rnd) -> dict:
    """The hacked run's item at `t` seconds: hh-rlhf, then 1 to 4 liked sentences appended (one
    more every quarter of the phase), then as many random Cyrillic letters."""
    stable, lengthening = PHASES["stable"], PHASES["lengthening"]
    if t < stable:
        return {"prompt": prompt, "response": response}
    k = min(4, 1 + int(4 * (t - stable) / lengthening))
    longer = " ".join([response, *rnd.sample(liked, k)])
    if t < stable + lengthening:
        return {"prompt": prompt, "response": longer}
    return {"prompt": prompt, "response": "".join(rnd.choice("абвгдежзийклмнопрстуфхцчшщыэюя ")
                                                  for _ in longer)}


def faster(duration: str) -> str:
    """A Prometheus duration SPEED times shorter, in seconds: 10m -> 10s, 6h -> 360s."""
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    seconds = sum(int(n) * units[u] for n, u in re.findall(r"(\d+)([smhd])", duration))
    return f"{max(1, seconds // SPEED)}s"


def fast_rules() -> dict:
    """rules.yml with every window and `for` SPEED times shorter."""
    rules = yaml.safe_load(RULES.read_text())
    for group in rules["groups"]:
        for rule in group["rules"]:
            if "for" in rule:
                rule["for"] = faster(rule["for"])
            rule["expr"] = re.sub(r"\[(\w+)\]", lambda m: f"[{faster(m.group(1))}]", rule["expr"])
    return rules


@pytest.fixture(scope="module")
def stack(trained, tmp_path_factory):
    """`bradley serve` of the trained model with windows of 128 items, and Prometheus scraping it."""
    tmp = tmp_path_factory.mktemp("stack")
    port = free_port()
    env = {**os.environ, "BRADLEY_DEVICE": "cpu", "BRADLEY_TORCH_THREADS": "1",
           "OMP_NUM_THREADS": "1", "BRADLEY_LOG_LEVEL": "warning", "BRADLEY_WATCH": "on",
           "BRADLEY_WATCH_WINDOW": "128"}
    serve_log = tmp / "serve.log"
    server = subprocess.Popen([sys.executable, "-m", "service.cli", "--db", str(tmp / "s.duckdb"),
                               "serve", "--port", str(port), "--model", str(trained[0])],
                              cwd=ROOT, env=env, stdout=serve_log.open("wb"),
                              stderr=subprocess.STDOUT)
    config = scrape_config(f"127.0.0.1:{port}", tmp, fast_rules(), key=None)
    try:
        wait_for(f"http://127.0.0.1:{port}/readyz", server, serve_log)
        with running_prometheus(config, tmp) as prometheus:
            yield f"http://127.0.0.1:{port}", prometheus
    finally:
        stop(server)


def replay(url: str, items: list[tuple], liked: list[str]) -> tuple[float, float]:
    """Both runs, side by side, for the length of all phases; returns (start, end) unix times."""
    rnd = random.Random(2)
    total = sum(PHASES.values())
    start = time.time()
    with httpx.Client(base_url=url, timeout=30) as client:
        while (t := time.time() - start) < total:
            picks = rnd.sample(items, 2 * ITEMS)
            runs = {"stable": [{"prompt": p, "response": r} for p, r in picks[:ITEMS]],
                    "hacked": [hacked_item(p, r, t, liked, rnd) for p, r in picks[ITEMS:]]}
            for run, batch in runs.items():
                answer = client.post("/score", json={"items": batch, "run": run})
                assert answer.status_code == 200, answer.text
            time.sleep(max(0.0, STEP_S - (time.time() - start - t)))
    time.sleep(3)  # the last scrape and evaluation
    return start, time.time()


def times_true(prometheus: str, expr: str, start: float, end: float) -> list[float]:
    """The evaluations (1 s steps) at which `expr` returns a series, in order."""
    body = httpx.get(f"{prometheus}/api/v1/query_range", timeout=30,
                     params={"query": expr, "start": start, "end": end, "step": "1s"}).json()
    assert body["status"] == "success", body
    return sorted({float(t) for series in body["data"]["result"] for t, _ in series["values"]})


def held_since(times: list[float], until: float) -> float:
    """The start of the unbroken run of steps in `times` that reaches `until` (a `for:` clock
    restarts whenever its condition lapses)."""
    since = until
    for t in reversed([t for t in times if t <= until]):
        if since - t > 1.5:
            break
        since = t
    return since


def condition(alert: str) -> tuple[str, float]:
    """(expr, `for:` in test seconds) of an alert of rules.yml."""
    for group in yaml.safe_load(RULES.read_text())["groups"]:
        for rule in group["rules"]:
            if rule.get("alert") == alert:
                return rule["expr"], float(faster(rule["for"])[:-1])
    raise AssertionError(f"no alert {alert} in rules.yml")


@pytest.mark.slow
def test_a_hacked_run_fires_length_and_ood_alerts_in_time_and_a_stable_one_fires_none(
        trained, stack):
    url, prometheus = stack
    start, end = replay(url, trained[1], trained[2])
    for alert in ("BradleyWatchResponsesLengthening", "BradleyWatchOutOfDistribution"):
        expr, wait = condition(alert)
        held = times_true(prometheus, _for_run(expr, "hacked"), start, end)
        fired = times_true(prometheus, f'ALERTS{{alertname="{alert}", alertstate="firing", '
                                       f'run="hacked"}}', start, end)
        assert held, f"{alert}: its condition never held for the hacked run"
        assert fired, f"{alert}: never fired (its condition held from {held[0] - start:.0f} s)"
        since = held_since(held, fired[0])
        assert wait - 1 <= fired[0] - since <= wait + SLACK_S, \
            (alert, since - start, fired[0] - start)
    stable = times_true(prometheus, 'ALERTS{alertstate="firing", run="stable"}', start, end)
    assert not stable, f"the stable run fired an alert {stable[0] - start:.0f} s in"


def _for_run(expr: str, run: str) -> str:
    """An alert's condition restricted to one run."""
    return f'({expr}) and on (run) label_replace(vector(1), "run", "{run}", "", "")'
