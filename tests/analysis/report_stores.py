"""Stores whose reports are pinned in tests/analysis/fixtures/report_before/: simulated data with an
AI judge asked in both orders and self-comparisons (the bootstrap runs), a simulated store above the
bootstrap's budget, and the real MT-Bench and hh-rlhf files (written row for row, not ingested, so
the stores stay what they are whatever ingest makes of repeated rows).

The pinned reports were written by the in-memory report (one verdict table, all analyses on it) that
the streamed report replaced, run on the verdict table in canonical order (prompt, then the item's
two response ids): that report read the table in whatever order DuckDB returned it, and the order
moved its Bradley-Terry gauge, its bootstrap draws and its choice among equally bad cycles from one
run to the next. `python -m tests.analysis.report_stores` rewrites them from the report as it is now,
also in that order (run it only for a change meant to move them).
"""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path

import numpy as np
import pyarrow as pa

from annotation.simulate import SimulationConfig, load_into, store_tables

FIXTURES = Path(__file__).with_name("fixtures") / "report_before"


def _second_batch(store) -> None:
    """The AI judge again, in the other order (a third of the time it picks the response shown
    first whatever it is), and 40 self-comparisons: one batch written like an ingest's. Rows are
    taken in content order, so the batch does not depend on how judgment ids are made."""
    rng = np.random.default_rng(5)
    table = canonical_order(store.judgments())
    ai = table.filter(pa.compute.starts_with(table["rater"], "ai:"))
    winner = np.array(ai["winner"].to_pylist(), dtype=object)
    flip = {"a": "b", "b": "a", "tie": "tie"}
    biased = rng.random(len(winner)) < 1 / 3
    again = np.where(biased, "a", [flip[w] for w in winner])
    firsts = {}  # one self-comparison per (prompt, response, rater): each a judgment of its own
    for k, key in enumerate(zip(*(table[c].to_pylist() for c in ("prompt_id", "response_a", "rater")),
                                strict=True)):
        firsts.setdefault(key, k)
    same = table.take(sorted(firsts.values())[:40])
    judgments = pa.table({
        "id": [f"again-{k}" for k in range(ai.num_rows)] + [f"self-{k}" for k in range(40)],
        "prompt_id": ai["prompt_id"].to_pylist() + same["prompt_id"].to_pylist(),
        "response_a": ai["response_b"].to_pylist() + same["response_a"].to_pylist(),
        "response_b": ai["response_a"].to_pylist() + same["response_a"].to_pylist(),
        "winner": again.tolist() + ["a"] * 40,
        "rater": ai["rater"].to_pylist() + same["rater"].to_pylist(),
        "source": ["judgments"] * (ai.num_rows + 40)})
    store.write_batch("both-orders", "both-orders", judgments.num_rows, {"judgments": judgments})


def simulated_small(store) -> None:
    load_into(store, SimulationConfig(prompts=400, raters=8, cycle_rate=0.2, seed=11))
    _second_batch(store)


def simulated_medium(store) -> None:
    # the benchmark's shape (10 judgments per prompt), above the bootstrap's budget
    load_into(store, SimulationConfig(prompts=6_000, responses=4, pairs_per_prompt=5,
                                      raters_per_pair=2, raters=8, seed=7))


def _write_rows(store, rows: list[dict], source: str) -> None:
    """Judgment rows (prompt, response_a, response_b, winner, rater, model_a, model_b texts) as one
    batch with an id per row, as annotation.simulate writes its own: the store holds every row,
    whatever ingest makes of repeats."""
    columns = {name: np.array([r.get(name) for r in rows], dtype=object)
               for name in ("prompt", "response_a", "response_b", "winner", "rater", "model_a",
                            "model_b")}
    sha, tables = store_tables(columns, source=source)
    store.write_batch(source, sha, len(rows), tables)


def mtbench(store, shared_data: Path) -> None:
    path = shared_data / "mtbench_human" / "mtbench_turn1_judgments.jsonl.gz"
    with gzip.open(path, "rt", encoding="utf-8") as f:
        _write_rows(store, [json.loads(line) for line in f], "mtbench")


def hh_rlhf(store, shared_data: Path) -> None:
    """hh-rlhf's test split: the shared transcript is the prompt, the chosen answer response a."""
    rows = []
    with gzip.open(shared_data / "hh-rlhf" / "harmless-base-test.jsonl.gz", "rt", encoding="utf-8") as f:
        for n, line in enumerate(f):
            r = json.loads(line)
            cut = r["chosen"].rfind("\n\nAssistant:")
            rows.append({"prompt": r["chosen"][:cut], "response_a": r["chosen"][cut:],
                         "response_b": r["rejected"][cut:], "winner": "a", "rater": f"human:crowd{n % 50}"})
    _write_rows(store, rows, "hh-rlhf")


# name -> (builder, needs shared data, raters filters reported)
CASES = {
    "simulated_small": (simulated_small, False, (None, "human")),
    "simulated_medium": (simulated_medium, False, (None,)),
    "mtbench": (mtbench, True, (None, "human", "ai:gpt-4")),
    "hh_rlhf": (hh_rlhf, True, (None,)),
}


def canonical_order(table: pa.Table) -> pa.Table:
    """Verdicts sorted by prompt, the item's lower and higher response id, then rater and winner."""
    import pandas as pd

    a, b = (np.array(table[c].to_pylist(), dtype=object) for c in ("response_a", "response_b"))
    frame = pd.DataFrame({"p": table["prompt_id"].to_pylist(), "lo": np.minimum(a, b),
                          "hi": np.maximum(a, b), "r": table["rater"].to_pylist(), "a": a,
                          "w": table["winner"].to_pylist()})
    return table.take(frame.sort_values(list(frame.columns), kind="stable").index.to_numpy())


def fixture_name(case: str, raters: str | None) -> str:
    return f"{case}-{raters or 'all'}".replace(":", "_") + ".json"


def _write_fixtures() -> None:
    import tempfile

    from analysis.report import build_report
    from annotation.store import Store

    unordered = Store.verdict_arrays
    Store.verdict_arrays = lambda self, *a, **k: canonical_order(unordered(self, *a, **k))

    shared = Path(os.environ.get("BRADLEY_SHARED_DATA", "../shared/data"))
    FIXTURES.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as folder:
        for case, (build, needs_data, filters) in CASES.items():
            with Store(Path(folder) / f"{case}.duckdb") as store:
                build(store, shared) if needs_data else build(store)
                for raters in filters:
                    built = build_report(store, raters=raters)
                    built.pop("snapshot_id")
                    (FIXTURES / fixture_name(case, raters)).write_text(json.dumps(built, indent=1))


if __name__ == "__main__":
    _write_fixtures()
