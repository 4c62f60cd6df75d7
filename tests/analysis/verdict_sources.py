"""Real data sets as verdict tables (the columns of `Store.verdict_arrays()`), read straight from the
files so the statistics tests do not depend on ingest."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pyarrow as pa

COLUMNS = ("prompt_id", "response_a", "response_b", "winner", "rater")


def verdict_table(rows: list[tuple]) -> pa.Table:
    """Rows of (prompt_id, response_a, response_b, winner, rater) as a verdict table."""
    columns = list(zip(*rows, strict=True)) if rows else [()] * len(COLUMNS)
    return pa.table({name: pa.array(list(col), pa.string()) for name, col in zip(COLUMNS, columns,
                                                                               strict=True)})


def mtbench(path: Path) -> pa.Table:
    """MT-Bench turn-1 votes: prompt id = question_id, response ids = model names."""
    rows = []
    with gzip.open(path, "rt", encoding="utf-8") as f:
        for line in f:
            r = json.loads(line)
            rows.append((str(r["question_id"]), r["model_a"], r["model_b"], r["winner"], r["rater"]))
    return verdict_table(rows)


def hh_rlhf(path: Path) -> pa.Table:
    """hh-rlhf: one crowdworker per pair, who preferred `chosen` (shown as response a)."""
    rows = []
    with gzip.open(path, "rt", encoding="utf-8") as f:
        for n, line in enumerate(f):
            r = json.loads(line)
            cut = r["chosen"].rfind("\n\nAssistant:")
            prompt = r["chosen"][:cut]
            rows.append((prompt, "chosen:" + r["chosen"][cut:], "rejected:" + r["rejected"][cut:],
                         "a", f"human:crowd{n}"))
    return verdict_table(rows)


def preflib_soc(path: Path) -> pa.Table:
    """A PrefLib .soc profile (`count: a,b,c,d` strict orders): every voter's ranking becomes a
    verdict on each pair of alternatives, with the voter as rater and the file as the prompt."""
    rows, voter = [], 0
    for line in path.read_text().splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        count, order = line.split(":")
        ranking = [f"alt{x.strip()}" for x in order.split(",")]
        for _ in range(int(count)):
            voter += 1
            rows.extend((path.stem, ranking[i], ranking[j], "a", f"human:voter{voter}")
                        for i in range(len(ranking)) for j in range(i + 1, len(ranking)))
    return verdict_table(rows)
