"""Ingest throughput against DuckDB's own bulk load of the same file; prints one JSON line.

Generates ROWS judgment rows (prompt, response_a, response_b, winner, rater; ~500 characters per
text) as JSONL in a temp dir, then, each in a fresh process and a fresh database file:
  ours: `bradley ingest` (annotation.ingest.batch.ingest_file: validation, content ids, three tables);
  raw:  DuckDB `INSERT INTO bare_table SELECT * FROM read_json(FILE)` (no checks, no ids).
ratio_vs_duckdb_raw = our rows/s ÷ raw rows/s; peak_rss_mb is the peak of our ingest process.

    nice -n 10 .venv/bin/python bench/ingest.py --rows 1000000
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import random
import resource
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

WORDS = ("the a model answer prompt rater prefers longer shorter helpful harmless honest reward "
         "policy gradient token sequence batch loss margin vote tie choice data store").split()
RAW_COLUMNS = {"prompt": "VARCHAR", "response_a": "VARCHAR", "response_b": "VARCHAR",
               "winner": "VARCHAR", "rater": "VARCHAR"}


def generate(path: Path, rows: int, text_chars: int = 500, seed: int = 0) -> int:
    """JSONL judgments: one prompt per 10 rows, fresh responses on every row. Returns bytes."""
    rng = random.Random(seed)
    chunks = [" ".join(rng.choices(WORDS, k=12))[:50].ljust(50) for _ in range(2000)]
    pieces = text_chars // 50

    def text(tag: str) -> str:
        return tag + "".join(rng.choices(chunks, k=pieces))

    with open(path, "w", encoding="utf-8") as fh:
        prompt = ""
        for i in range(rows):
            if i % 10 == 0:
                prompt = text(f"q{i} ")
            row = {"prompt": prompt, "response_a": text(f"a{i} "), "response_b": text(f"b{i} "),
                   "winner": rng.choice("aab") if i % 7 else "tie", "rater": f"human:r{i % 50}"}
            fh.write(json.dumps(row) + "\n")
    return path.stat().st_size


def run_ours(path: str, db: str, queue) -> None:
    from annotation.ingest.batch import ingest_file
    from annotation.store import Store

    start = time.perf_counter()
    with Store(db) as store:
        result = ingest_file(store, path)
    queue.put((time.perf_counter() - start, result.rows_ok))


def run_raw(path: str, db: str, queue) -> None:
    import duckdb

    start = time.perf_counter()
    con = duckdb.connect(db)
    con.execute("CREATE TABLE bare (prompt VARCHAR, response_a VARCHAR, response_b VARCHAR, "
                "winner VARCHAR, rater VARCHAR)")
    con.execute("INSERT INTO bare SELECT * FROM read_json(?, format = 'newline_delimited', "
                "columns = ?)", [path, RAW_COLUMNS])
    n = con.execute("SELECT count(*) FROM bare").fetchone()[0]
    con.close()
    queue.put((time.perf_counter() - start, n))


def in_child(target, *args) -> tuple[float, int, float]:
    """(seconds, rows, peak RSS in MB of that child)."""
    os.sync()  # the generated file (or the last run's database) is on disk first: no writeback during a run
    queue = mp.Queue()
    proc = mp.get_context("fork").Process(target=target, args=(*args, queue))
    proc.start()
    seconds, rows = queue.get()
    proc.join()
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return seconds, rows, before / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--text-chars", type=int, default=500)
    args = parser.parse_args()
    import duckdb  # noqa: F401

    import annotation.ingest.batch  # noqa: F401 (imported once here, so neither child times imports)
    with tempfile.TemporaryDirectory(prefix="bradley-bench-") as tmp:
        data = Path(tmp) / "judgments.jsonl"
        size = generate(data, args.rows, args.text_chars)
        ours_s, ours_rows, ours_rss = in_child(run_ours, str(data), os.path.join(tmp, "ours.duckdb"))
        raw_s, raw_rows, _ = in_child(run_raw, str(data), os.path.join(tmp, "raw.duckdb"))
    print(json.dumps({
        "bench": "ingest", "rows": ours_rows, "file_mb": round(size / 2**20, 1),
        "seconds": round(ours_s, 2), "rows_per_s": round(ours_rows / ours_s),
        "peak_rss_mb": round(ours_rss), "duckdb_raw_seconds": round(raw_s, 2),
        "duckdb_raw_rows_per_s": round(raw_rows / raw_s),
        "ratio_vs_duckdb_raw": round((ours_rows / ours_s) / (raw_rows / raw_s), 3)}))


if __name__ == "__main__":
    main()
