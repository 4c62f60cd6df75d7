"""How big the DuckDB store gets, and what a Parquet snapshot of it costs: the numbers behind the
manual's "one writer, Parquet snapshots for training elsewhere" (docs/operations.md). Prints one JSON line.

Generates ROWS judgments of natural text: each prompt and response strings together 1-4 random
sentences of the hh-rlhf test transcripts (../shared/data; ~250 characters a text on average), a
prompt per 4 rows, fresh responses on every row. Text made of a few repeated chunks would compress
far better than real text and flatter both formats. Then it ingests them with `bradley ingest`'s code into a fresh store,
closes it (checkpoint) and measures the file; then exports the judgments as Parquet (`bradley export
--format parquet`) and measures the export's size and time; then times what a training run's rank 0
does with the store (a snapshot and its resolved pairs) against reading the Parquet file.
`bytes_per_judgment_*` scale linearly with the text per row; ratios are in the same run.

    nice -n 10 .venv/bin/python bench/store_size.py --rows 200000
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench.common import hh_rlhf_rows  # noqa: E402


def sentences() -> list[str]:
    found = set()
    for row in hh_rlhf_rows():
        for text in (row["chosen"], row["rejected"]):
            text = text.replace("\n\nHuman:", " ").replace("\n\nAssistant:", " ")
            found.update(s.strip() + "." for s in text.split(".") if len(s.strip()) > 20)
    return sorted(found)


def generate(path: Path, rows: int, seed: int = 0) -> int:
    """JSONL judgments (prompt, response_a, response_b, winner, rater); returns bytes written."""
    rng, pool = random.Random(seed), sentences()
    text = lambda: " ".join(rng.choices(pool, k=rng.randint(1, 4)))  # noqa: E731
    with open(path, "w", encoding="utf-8") as fh:
        prompt = ""
        for i in range(rows):
            if i % 4 == 0:
                prompt = f"[{i}] {text()}"
            fh.write(json.dumps({"prompt": prompt, "response_a": text(), "response_b": text(),
                                 "winner": rng.choice("ab"), "rater": f"human:r{i % 50}"}) + "\n")
    return path.stat().st_size


def timed(fn):
    started = time.perf_counter()
    value = fn()
    return value, time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=200_000)
    args = parser.parse_args()
    import pyarrow.parquet as pq

    from annotation.export import export
    from annotation.ingest.batch import ingest_file
    from annotation.store import Store

    with tempfile.TemporaryDirectory() as tmp:
        source, db, out = Path(tmp) / "rows.jsonl", Path(tmp) / "s.duckdb", Path(tmp) / "j.parquet"
        jsonl_bytes = generate(source, args.rows)
        with Store(db) as store:
            _, ingest_s = timed(lambda: ingest_file(store, str(source)))
        db_bytes = db.stat().st_size
        with Store(db) as store:
            _, export_s = timed(lambda: export(store, "parquet", out))
            snapshot = store.create_snapshot(None)
            pairs, pairs_s = timed(lambda: store.pairs(snapshot))
        table, read_s = timed(lambda: pq.read_table(out))
        parquet_bytes = out.stat().st_size
    print(json.dumps({
        "bench": "store_size", "rows": args.rows, "jsonl_mb": round(jsonl_bytes / 2**20, 1),
        "duckdb_mb": round(db_bytes / 2**20, 1), "parquet_mb": round(parquet_bytes / 2**20, 1),
        "bytes_per_judgment_duckdb": round(db_bytes / args.rows),
        "bytes_per_judgment_parquet": round(parquet_bytes / args.rows),
        "parquet_vs_duckdb_size": round(parquet_bytes / db_bytes, 3),
        "ingest_s": round(ingest_s, 2), "export_parquet_s": round(export_s, 2),
        "export_rows_per_s": round(args.rows / export_s),
        "snapshot_pairs_s": round(pairs_s, 2), "pairs": pairs.num_rows,
        "read_parquet_s": round(read_s, 2), "parquet_rows": table.num_rows}))


if __name__ == "__main__":
    main()
