"""kill -9 at random points of 20 ingests. No batch is ever half in the store, and
the spool a killed ingest leaves behind is gone after the next ingest (it used to stay in /tmp as
`bradley-ingest-*`, 23-84 MB per kill for a 190 MB file)."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from annotation.ingest import spool
from annotation.ingest.batch import ingest_file
from annotation.store import Store

ROOT = Path(__file__).resolve().parents[3]
RUNS = 20
ROWS = 2_000  # ~8 chunks of 64 kB: a few tenths of a second of spooling per run

# The child opens the store, says so, then ingests; each chunk takes a little longer than usual so
# that random kill times land before, during and after the spool's life.
CHILD = textwrap.dedent("""
    import sys, time
    import annotation.ingest.readers as readers
    import annotation.ingest.spool as spool_mod
    from annotation.ingest.batch import ingest_file
    from annotation.store import Store
    readers.BATCH_BYTES = 64 << 10
    original = spool_mod._new_responses
    def slow(*args, **kwargs):
        time.sleep(0.04)
        return original(*args, **kwargs)
    spool_mod._new_responses = slow
    with Store(sys.argv[1]) as store:
        print("START", flush=True)
        ingest_file(store, sys.argv[2])
        print("DONE", flush=True)
""")


def rows_file(path: Path, run: int, n: int) -> Path:
    with open(path, "w") as fh:
        for i in range(n):
            fh.write(json.dumps({"prompt": f"question {i % 50} of run {run}",
                                 "response_a": f"answer {i} " + "words " * 12,
                                 "response_b": f"other {i} " + "text " * 12,
                                 "winner": "ab"[i % 2], "rater": f"human:{i % 5}"}) + "\n")
    return path


def leftovers(db: Path, tmp: Path) -> list[str]:
    """Spool folders of `db` and bradley spools in the temp dir (where they used to go)."""
    beside = Path(f"{db}.spool")  # spool.spool_root, spelled out so that this runs on older code too
    return sorted(str(p) for p in [*beside.glob("*"), *tmp.glob("bradley-*")])


def batches_complete(store: Store) -> dict[str, int]:
    """source -> rows of each batch; fails when a batch's rows are not all there."""
    out = {}
    for source, rows_ok, written in store.con.execute(
            "SELECT b.source, b.rows_ok, (SELECT count(*) FROM judgments j WHERE j.batch_id = b.id) "
            "FROM batches b").fetchall():
        assert rows_ok == written, f"batch of {source}: {written} rows written, {rows_ok} recorded"
        out[source] = written
    return out


def test_kill_9_at_random_points_leaves_no_partial_batch_and_no_spool(tmp_path):
    db, tmp = tmp_path / "kill.duckdb", tmp_path / "tmp"
    tmp.mkdir()
    files = [rows_file(tmp_path / f"run{i}.jsonl", i, ROWS) for i in range(RUNS)]
    with Store(db) as store:
        ingest_file(store, rows_file(tmp_path / "seed.jsonl", -1, 10))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TMPDIR": str(tmp)}
    rng = random.Random(14)
    killed_with_spool = completed = 0
    for i, path in enumerate(files):
        child = subprocess.Popen([sys.executable, "-c", CHILD, str(db), str(path)], cwd=ROOT, env=env,
                                 stdout=subprocess.PIPE, text=True)
        try:
            assert child.stdout.readline().strip() == "START"
            time.sleep(rng.uniform(0.0, 0.9))
        finally:
            child.send_signal(signal.SIGKILL)
            child.wait(timeout=30)
        left = leftovers(db, tmp)
        killed_with_spool += bool(left)
        with Store(db) as store:
            sizes = batches_complete(store)
            completed += str(path) in sizes
            assert sizes.get(str(path), ROWS) == ROWS
            # the next ingest, whatever it is, removes what the killed one left
            ingest_file(store, rows_file(tmp_path / f"next{i}.jsonl", 100 + i, 3))
            assert leftovers(db, tmp) == [], f"run {i}: spool left after the next ingest: {left}"
    # the random points did land inside the spool's life (else this test would prove nothing)
    assert killed_with_spool >= 3, (killed_with_spool, completed)
    with Store(db) as store:
        sizes = batches_complete(store)
        expected = 10 + 3 * RUNS + ROWS * sum(str(p) in sizes for p in files)
        assert store.counts()["judgments"] == expected


HOLDER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from annotation.ingest.spool import spool_folder
    with spool_folder(Path(sys.argv[1])) as folder:
        print(folder, flush=True)
        time.sleep(60)
""")


def test_sweep_removes_only_what_dead_ingests_left(tmp_path):
    root = spool.spool_root(str(tmp_path / "s.duckdb"))
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(root)], cwd=ROOT, stdout=subprocess.PIPE,
                              text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        live = holder.stdout.readline().strip()
        dead = root / "ingest-999999-gone"  # a lock file nobody holds: its process died
        dead.mkdir()
        (dead / spool.LOCK_NAME).touch()
        old_claim, young_claim = root / "claim-1-old", root / "claim-2-young"
        old_claim.mkdir()
        young_claim.mkdir()
        hour_ago = time.time() - 3600
        os.utime(old_claim, (hour_ago, hour_ago))
        assert sorted(spool.sweep(root)) == sorted([str(dead), str(old_claim)])
        assert Path(live).is_dir() and young_claim.is_dir()  # a live lock; a claim being set up
    finally:
        holder.kill()
        holder.wait(timeout=30)
    assert spool.sweep(root) == [live]
