"""What a newcomer hit. `make demo` ends by saying what to run next (and how to put
`bradley` on the PATH), the demo's last step scores texts the simulated signal separates and says
what the scores mean, the README says so too, and pyproject.toml uses the SPDX license string."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from annotation.simulate import BAD_WORDS, GOOD_WORDS
from service.cli import demo

ROOT = Path(__file__).resolve().parents[3]


def _good_share(text: str) -> float:
    words = re.findall(r"[a-z]+", text.lower())
    good, bad = sum(w in GOOD_WORDS for w in words), sum(w in BAD_WORDS for w in words)
    return good / (good + bad)


def test_demo_scores_texts_that_differ_only_in_the_simulated_signal():
    # simulate.py: quality shows as the share of good vs bad words, and length carries none
    assert _good_share(demo.GOOD_ANSWER) == 1.0 and _good_share(demo.BAD_ANSWER) == 0.0
    assert len(demo.GOOD_ANSWER) == len(demo.BAD_ANSWER)
    neutral = re.compile("|".join(sorted(GOOD_WORDS + BAD_WORDS, key=len, reverse=True)))
    assert neutral.sub("_", demo.GOOD_ANSWER) == neutral.sub("_", demo.BAD_ANSWER)
    assert "word signal" in demo.SCORE_NOTE and "not advice" in demo.SCORE_NOTE


def test_demo_ends_with_the_next_command_and_the_path_line(monkeypatch):
    monkeypatch.setattr(demo.shutil, "which", lambda name: None)  # a fresh shell: not on the PATH
    text = demo.next_steps("demo/bradley.duckdb", Path("demo"))
    bin_dir = Path(sys.executable).parent
    assert f'export PATH="{bin_dir}:$PATH"' in text and "activate" in text
    assert "bradley --db demo/bradley.duckdb report --html demo/report.html" in text
    monkeypatch.setattr(demo.shutil, "which", lambda name: str(bin_dir / name))
    assert "activate" not in demo.next_steps("demo/bradley.duckdb", Path("demo"))


def test_readme_gives_the_path_line_and_the_first_install_time():
    text = (ROOT / "README.md").read_text()
    assert "source .venv/bin/activate" in text and 'export PATH="$PWD/.venv/bin:$PATH"' in text
    assert re.search(r"first `make demo`[^.]*1\.5.2\.5 min", text)


def test_pyproject_license_is_an_spdx_string_with_a_setuptools_that_reads_it():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert project["project"]["license"] == "Apache-2.0"
    (requirement,) = [r for r in project["build-system"]["requires"] if r.startswith("setuptools")]
    assert int(re.search(r">=\s*(\d+)", requirement)[1]) >= 77  # PEP 639 support came in 77.0


def test_the_demo_grades_a_grpo_group_by_the_gsm8k_verifier(live):
    """Demo step 7's group: rewards by the gsm8k rule (docs/verifiable-rewards.md), and the hand-computed advantages
    (rewards 1.1, 0.1, 0.0, 1.1: mean 0.575, sample std 0.6076, eps 1e-4)."""
    from service.client import ScoreClient

    with ScoreClient(live.url) as client:
        lines = demo.grade_group(client)
    rewards = [float(line.split()[1]) for line in lines[:4]]
    advantages = [float(line.split()[3]) for line in lines[:4]]
    assert rewards == [1.1, 0.1, 0.0, 1.1]
    assert advantages == pytest.approx([0.864, -0.782, -0.946, 0.864], abs=1e-3)
    assert lines[4].startswith("accuracy 0.50;")
