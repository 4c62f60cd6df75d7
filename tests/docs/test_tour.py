"""The README's ten-minute tour, run end to end as a user would: its code blocks in order, in one
bash, in a scratch checkout folder beside a `../shared/data` that points at the real data, against a
real `bradley serve` that the tour starts and stops. Two changes make it fit a test: the server
listens on a free port instead of 8000, and `train rm` stops after 10 steps (`--steps 10` appended)
instead of a whole epoch."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from service.ports import free_port
from tests.docs.pages import ROOT, blocks, section

HEADING = "A ten-minute tour on real data"
STEPS = "--steps 10"


def tour_script(readme: str, port: int) -> str:
    """The tour's blocks as one bash script: shell blocks as they are, Python blocks as heredocs."""
    parts = ["set -euo pipefail"]
    for block in blocks(section(readme, HEADING)):
        body = block.body.replace(":8000", f":{port}")
        if block.lang == "python":
            parts.append(f"python - <<'PY'\n{body}PY")
        else:
            parts.append(re.sub(r"^(bradley train rm .*)$", rf"\1 {STEPS}", body, flags=re.M))
    return "\n".join(parts) + "\nwait\n"  # the server's own exit, after the tour's SIGTERM


def _bradley_on_path(bin_dir: Path) -> str:
    """A `bradley` that runs this checkout's CLI with this interpreter, ahead of the venv's."""
    bin_dir.mkdir()
    shim = bin_dir / "bradley"
    shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m service.cli "$@"\n')
    shim.chmod(0o755)
    return os.pathsep.join([str(bin_dir), str(Path(sys.executable).parent), "/usr/bin", "/bin"])


def test_the_tour_script_keeps_the_readmes_commands():
    readme = (ROOT / "README.md").read_text()
    script = tour_script(readme, 8123)
    assert "bradley ingest ../shared/data/hh-rlhf/harmless-base-test.jsonl.gz" in script
    assert re.search(rf"^bradley train rm .* {STEPS}$", script, re.M)
    assert "bradley serve" in script and "curl -s localhost:8123/score" in script
    assert "trl_reward_func" in script and "kill %1" in script
    assert ":8000" not in script


def test_the_readme_tour_runs_end_to_end(tmp_path, shared_data):
    checkout = tmp_path / "checkout"
    checkout.mkdir()
    (tmp_path / "shared").mkdir()
    (tmp_path / "shared" / "data").symlink_to(shared_data)
    port = free_port()
    env = {"PATH": _bradley_on_path(tmp_path / "bin"), "HOME": str(tmp_path), "PYTHONPATH": str(ROOT),
           "BRADLEY_PORT": str(port), "BRADLEY_TORCH_THREADS": "1", "OMP_NUM_THREADS": "1",
           "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    script = tour_script((ROOT / "README.md").read_text(), port)
    tour = subprocess.Popen(["bash", "-c", script], cwd=checkout, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        out, err = tour.communicate(timeout=600)
    except subprocess.TimeoutExpired:
        os.killpg(tour.pid, signal.SIGKILL)  # the tour's server too
        out, err = tour.communicate()
        pytest.fail(f"the tour did not finish in 600 s:\n{out[-2000:]}\n{err[-2000:]}")
    assert tour.returncode == 0, f"{out[-3000:]}\n{err[-3000:]}"

    assert "2,312 rows: 2,307 ok, 5 rejected" in out
    assert "shorter answer" in out  # the report's length finding, as the README says
    assert (checkout / "demo" / "hh-report.html").is_file()
    trained = json.loads(next(line for line in out.splitlines() if line.startswith('{"model_id"')))
    assert trained["steps"] == 10 and trained["path"] == str(checkout / "demo" / "rm-hh")
    scored = _json_at(out, '{"scores"')
    assert len(scored["scores"]) == 2 and len(scored["advantages"]) == 2
    assert scored["model"] == trained["model_id"]
    rewards = _json_at(out, "[", last=True)  # the trainer's two rewards, printed last
    assert len(rewards) == 2 and all(isinstance(r, float) for r in rewards)


def _json_at(text: str, start: str, last: bool = False):
    """The JSON value that begins at the first (or last) `start` in `text` (curl ends its answer
    without a newline, so the next output may follow on the same line)."""
    index = text.rindex(start) if last else text.index(start)
    return json.JSONDecoder().raw_decode(text, index)[0]
