"""The manual's trainer recipes, run: each "Check" block of docs/trainers.md (what OpenRLHF posts,
what TRL's GRPOTrainer calls, what verl's reward manager calls) against a live server, its address
put where the page has 127.0.0.1:8000. Every trainer gets the reward the model gives offline, as the
page promises."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.docs.pages import DOCS, ROOT, blocks

PAGE = (DOCS / "trainers.md").read_text()
CHECKS = {block.info.split('"')[1]: block for block in blocks(PAGE)
          if block.info.startswith('title="Check')}
ADDRESS = "http://127.0.0.1:8000"


def test_the_page_has_a_check_per_trainer():
    assert sorted(CHECKS) == ["Check: what GRPOTrainer calls", "Check: what OpenRLHF posts",
                              "Check: what verl's naive reward manager calls"]
    assert all(ADDRESS in block.body for block in CHECKS.values())


def _run(block, url: str) -> str:
    code = block.body.replace(ADDRESS, url)
    argv = ["bash", "-c", code] if block.lang == "sh" else [sys.executable, "-c", code]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=ROOT,
                          env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


@pytest.fixture(scope="module")
def expected(offline):
    model = offline["rm-tiny-a"]
    return lambda prompts, responses: model.score(prompts, responses)


def test_openrlhf_check(live, expected):
    reply = json.loads(_run(CHECKS["Check: what OpenRLHF posts"], live.url))
    # the query "What is 2+2? 4" cut after its prompt
    assert reply["rewards"] == pytest.approx(expected(["What is 2+2?"], [" 4"]), abs=1e-4)
    assert reply["extra_logs"]["unsplit"] == [0.0]


def test_trl_check(live, expected):
    rewards = json.loads(_run(CHECKS["Check: what GRPOTrainer calls"], live.url))
    assert rewards == pytest.approx(expected(["What is 2+2?"] * 2, ["4", "5"]), abs=1e-4)


def test_verl_check(live, expected):
    reward = float(_run(CHECKS["Check: what verl's naive reward manager calls"], live.url))
    assert reward == pytest.approx(expected(["What is 2+2?"], ["4"])[0], abs=1e-4)
