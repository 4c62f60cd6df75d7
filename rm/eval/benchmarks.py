"""The leaderboards' files read as published, and scored by their rules (leaderboards.py) with any
scorer `score(prompts, responses) -> rewards`: a local RewardModel's `score`, or a running server's.

Files: Parquet (as the Hugging Face Hub serves allenai/reward-bench and allenai/reward-bench-2),
JSONL (optionally gzipped) or a JSON list. Rows:
- rewardbench: `prompt, chosen, chosen_model, rejected, rejected_model, subset, id`, one pair each;
  prompt, chosen, rejected and subset are needed, the rest is carried along.
- rewardbench2: `id, prompt, chosen (list), rejected (list), num_correct, num_incorrect,
  total_completions, models, subset, additional_metadata`; id, prompt, chosen, rejected, num_correct
  and subset are needed, and the counts, where given, must agree with the lists (the reference pairs
  rewards with responses by them). Subset names match whatever their case, spaces, `-` and `_`.

A bad row raises BenchmarkFileError naming the row (`FILE:LINE` in JSON lines, `FILE row N`, counted
from 0 as `datasets` counts, in Parquet and JSON lists) and the field, e.g.
`rb.jsonl:3: field 'chosen' must be text, got a list`.

    >>> read_rewardbench_row({"prompt": "2+2?", "chosen": "4", "rejected": "5",
    ...                       "subset": "math-prm"}, "rb.jsonl:1")["subset"]
    'math-prm'
"""

from __future__ import annotations

import gzip
import json
import re
from collections.abc import Callable, Iterator
from itertools import pairwise
from pathlib import Path

from rm.eval.leaderboards import (
    REWARDBENCH2_SUBSETS,
    REWARDBENCH_WEIGHTS,
    TIES,
    rewardbench2_summary,
    rewardbench_summary,
)

Scorer = Callable[[list, list], list]


class BenchmarkFileError(ValueError):
    """A benchmark file or row that cannot be scored; the message names the row and the field."""


def _kind(value) -> str:
    """How a JSON reader would name a value's type, for error messages."""
    names = {str: "text", list: "a list", dict: "an object", bool: "a boolean", type(None): "null"}
    return names.get(type(value), "a number" if isinstance(value, int | float) else type(value).__name__)


def _field(row: dict, name: str, where: str, columns: str):
    if name not in row:
        raise BenchmarkFileError(f"{where}: missing column '{name}' (rows of this benchmark have "
                                 f"{columns})")
    return row[name]


def _text(row: dict, name: str, where: str, columns: str) -> str:
    value = _field(row, name, where, columns)
    if not isinstance(value, str):
        raise BenchmarkFileError(f"{where}: field '{name}' must be text, got {_kind(value)}")
    return value


def _texts(row: dict, name: str, where: str, columns: str) -> list[str]:
    value = _field(row, name, where, columns)
    if not isinstance(value, list | tuple):
        raise BenchmarkFileError(f"{where}: field '{name}' must be a list of texts, got {_kind(value)}")
    for i, item in enumerate(value):
        if not isinstance(item, str):
            raise BenchmarkFileError(f"{where}: field '{name}' item {i} must be text, got {_kind(item)}")
    return list(value)


def _count(row: dict, name: str, where: str, columns: str) -> int:
    value = _field(row, name, where, columns)
    if isinstance(value, bool) or not (isinstance(value, int)
                                       or isinstance(value, float) and value.is_integer()):
        raise BenchmarkFileError(f"{where}: field '{name}' must be a whole number, got {value!r}")
    return int(value)


# --- rows of each benchmark ---------------------------------------------------------------------

RB_COLUMNS = "prompt, chosen, chosen_model, rejected, rejected_model, subset, id"
RB2_COLUMNS = ("id, prompt, chosen (list), rejected (list), num_correct, num_incorrect, "
               "total_completions, models, subset, additional_metadata")
RB2_NAMES = {re.sub(r"[\s_-]", "", s.lower()): s for s in REWARDBENCH2_SUBSETS}
TIES_ID = re.compile(r"^[^:]+:\d+$")


def read_rewardbench_row(row: dict, where: str) -> dict:
    """One RewardBench row checked: {prompt, chosen, rejected, subset, id}."""
    out = {name: _text(row, name, where, RB_COLUMNS) for name in ("prompt", "chosen", "rejected",
                                                                   "subset")}
    if out["subset"] not in REWARDBENCH_WEIGHTS:
        raise BenchmarkFileError(f"{where}: field 'subset': {out['subset']!r} is not a RewardBench "
                                 f"subset (one of {', '.join(REWARDBENCH_WEIGHTS)})")
    return {**out, "id": row.get("id")}


def read_rewardbench2_row(row: dict, where: str) -> dict:
    """One RewardBench 2 row checked: {prompt, chosen, rejected, num_correct, subset, id}, the
    subset under its canonical name."""
    prompt = _text(row, "prompt", where, RB2_COLUMNS)
    chosen, rejected = (_texts(row, name, where, RB2_COLUMNS) for name in ("chosen", "rejected"))
    num_correct = _count(row, "num_correct", where, RB2_COLUMNS)
    subset_text = _text(row, "subset", where, RB2_COLUMNS)
    subset = RB2_NAMES.get(re.sub(r"[\s_-]", "", subset_text.lower()))
    row_id = _field(row, "id", where, RB2_COLUMNS)
    if subset is None:
        raise BenchmarkFileError(f"{where}: field 'subset': {subset_text!r} is not a RewardBench 2 "
                                 f"subset (one of {', '.join(REWARDBENCH2_SUBSETS)})")
    if not chosen:
        raise BenchmarkFileError(f"{where}: field 'chosen' is empty; a row needs a chosen response")
    expected = {"num_correct": len(chosen), "num_incorrect": len(rejected),
                "total_completions": len(chosen) + len(rejected)}
    for name, size in expected.items():
        if row.get(name) is not None and _count(row, name, where, RB2_COLUMNS) != size:
            raise BenchmarkFileError(f"{where}: field '{name}' is {row[name]} but the row holds {size} "
                                     f"such responses ({len(chosen)} chosen, {len(rejected)} rejected)")
    if subset == TIES and not (isinstance(row_id, str) and TIES_ID.match(row_id) and rejected):
        raise BenchmarkFileError(f"{where}: field 'id': a Ties row needs an id 'ref:N' or 'tied:N' "
                                 f"and rejected responses, got id {row_id!r}")
    return {"prompt": prompt, "chosen": chosen, "rejected": rejected, "num_correct": num_correct,
            "subset": subset, "id": str(row_id)}


BENCHMARKS = {"rewardbench": read_rewardbench_row, "rewardbench2": read_rewardbench2_row}


# --- files --------------------------------------------------------------------------------------


def _parquet_rows(path: Path) -> Iterator[tuple[str, object]]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except (pa.ArrowInvalid, OSError) as exc:
        raise BenchmarkFileError(f"{path}: not a Parquet file ({exc})") from None
    for i, row in enumerate(table.to_pylist()):
        yield f"{path} row {i}", row


def _json_rows(path: Path) -> Iterator[tuple[str, object]]:
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rt", encoding="utf-8") as f:
            text = f.read()
    except (UnicodeDecodeError, gzip.BadGzipFile) as exc:
        raise BenchmarkFileError(f"{path}: not JSON, JSONL or Parquet ({exc})") from None
    if text.lstrip().startswith("["):
        try:
            rows = json.loads(text)
        except json.JSONDecodeError as exc:
            raise BenchmarkFileError(f"{path}: not a JSON list ({exc})") from None
        yield from ((f"{path} row {i}", row) for i, row in enumerate(rows))
        return
    for number, line in enumerate(text.splitlines(), 1):
        if line.strip():
            try:
                yield f"{path}:{number}", json.loads(line)
            except json.JSONDecodeError as exc:
                raise BenchmarkFileError(f"{path}:{number}: not a JSON object ({exc})") from None


def read_benchmark(path: str | Path, benchmark: str) -> list[dict]:
    """Every row of a benchmark file, checked; BenchmarkFileError at the first bad one."""
    if benchmark not in BENCHMARKS:
        raise BenchmarkFileError(f"unknown benchmark {benchmark!r}; one of {', '.join(BENCHMARKS)}")
    path = Path(path)
    if not path.is_file():
        raise BenchmarkFileError(f"--data {path}: no such file (the benchmark's Parquet or JSONL)")
    records = _parquet_rows(path) if path.suffix == ".parquet" else _json_rows(path)
    rows = []
    for where, row in records:
        if not isinstance(row, dict):
            raise BenchmarkFileError(f"{where}: a row must be an object with named fields, got "
                                     f"{_kind(row)}")
        rows.append(BENCHMARKS[benchmark](row, where))
    if not rows:
        raise BenchmarkFileError(f"{path}: no rows to evaluate")
    return rows


# --- scoring ------------------------------------------------------------------------------------


def _score_all(score: Scorer, prompts: list, responses: list) -> list[float]:
    rewards = [float(r) for r in score(prompts, responses)]
    if len(rewards) != len(responses):
        raise ValueError(f"the scorer returned {len(rewards)} rewards for {len(responses)} responses")
    return rewards


def evaluate_benchmark(score: Scorer, rows: list[dict], benchmark: str) -> dict:
    """Score every response of every row in one call of `score`, then apply the benchmark's rules:
    {benchmark, n_rows, n_responses, per_subset, score, missing_subsets[, sections]}."""
    if benchmark == "rewardbench":
        responses = [r["chosen"] for r in rows] + [r["rejected"] for r in rows]
        rewards = _score_all(score, [r["prompt"] for r in rows] * 2, responses)
        n = len(rows)
        summary = rewardbench_summary([r["subset"] for r in rows], rewards[:n], rewards[n:])
    else:
        prompts, responses, bounds = [], [], [0]
        for r in rows:
            candidates = r["chosen"] + r["rejected"]
            prompts += [r["prompt"]] * len(candidates)
            responses += candidates
            bounds.append(len(responses))
        flat = _score_all(score, prompts, responses)
        summary = rewardbench2_summary([r["subset"] for r in rows], [r["id"] for r in rows],
                                       [flat[a:b] for a, b in pairwise(bounds)],
                                       [r["num_correct"] for r in rows])
    return {"benchmark": benchmark, "n_rows": len(rows), "n_responses": len(responses), **summary}
