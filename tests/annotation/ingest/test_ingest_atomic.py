"""Atomicity: abort writes nothing, skip keeps the good rows, a SIGKILL mid-batch leaves the store as it
was, malformed rows never change the store, and a second process gets a clean lock message."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from concurrent.futures import Future
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import annotation.ingest.batch as ingest_mod
import annotation.ingest.readers as readers
from annotation.ingest.batch import IngestError, ingest_file, ingest_records
from annotation.store import Store

ROOT = Path(__file__).resolve().parents[3]
GOOD = {"prompt": "Which is better?", "response_a": "this one", "response_b": "that one",
        "winner": "a", "rater": "human:1"}


def good_rows(n: int, start: int = 0) -> list[dict]:
    return [{**GOOD, "response_a": f"answer {i}", "rater": f"human:{i % 7}"} for i in range(start, start + n)]


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def snapshot_of(store) -> dict:
    return {**store.counts(), "ids": store.con.execute("SELECT list(id ORDER BY id) FROM judgments").fetchone()}


def test_abort_after_chunks_were_written_leaves_nothing(store, tmp_path, monkeypatch):
    monkeypatch.setattr(ingest_mod, "BATCH_ROWS", 10)  # so good chunks are written before the bad row
    ingest_records(store, good_rows(3, start=500))
    before = snapshot_of(store)
    path = write_jsonl(tmp_path / "late-bad.jsonl", good_rows(95) + [{**GOOD, "winner": "left"}])
    with pytest.raises(IngestError) as info:
        ingest_file(store, path)
    assert info.value.errors == [f"{path}:96: winner: 'left' is not one of a, b, tie"]
    assert info.value.field == "winner" and info.value.result.failed
    assert snapshot_of(store) == before


def test_skip_commits_good_rows_and_records_rejects(store, tmp_path, monkeypatch):
    monkeypatch.setattr(ingest_mod, "BATCH_ROWS", 10)
    rows = good_rows(30)
    rows[4] = {**GOOD, "response_b": None}
    rows[20] = {**GOOD, "strength": "very"}
    result = ingest_file(store, write_jsonl(tmp_path / "some-bad.jsonl", rows), on_error="skip")
    assert (result.rows_in, result.rows_ok, result.rows_rejected) == (30, 28, 2)
    assert "28 ok, 2 rejected (see rejects" in result.summary()
    rejects = store.rejects(result.batch_id)
    assert [(line, reason) for line, reason, _ in rejects] == [
        (5, "response_b: missing or empty"),
        (21, "strength: expected a number, got 'very'")]
    assert json.loads(rejects[1][2])["strength"] == "very"


def test_bad_row_late_in_a_streamed_file_redoes_it_precisely(store, tmp_path, monkeypatch):
    # small blocks: the columnar path has streamed several chunks into its INSERT when it meets
    # the bad row, rolls all of that back and the precise path writes the file once
    monkeypatch.setattr(readers, "BATCH_BYTES", 2048)
    rows = good_rows(200)
    rows[180] = {**GOOD, "winner": "left"}
    result = ingest_file(store, write_jsonl(tmp_path / "late.jsonl", rows), on_error="skip")
    assert (result.rows_in, result.rows_ok, result.rows_rejected) == (200, 199, 1)
    counts = store.counts()
    assert (counts["judgments"], counts["prompts"], counts["responses"]) == (199, 1, 200)


def test_clean_streamed_file_writes_each_id_once(store, tmp_path, monkeypatch):
    monkeypatch.setattr(readers, "BATCH_BYTES", 2048)
    again = [{**row, "rater": "human:again"} for row in good_rows(50)]  # the same texts, another rater
    rows = good_rows(300) + again
    result = ingest_file(store, write_jsonl(tmp_path / "clean.jsonl", rows))
    assert (result.rows_in, result.rows_ok) == (350, 350)
    counts = store.counts()
    assert (counts["judgments"], counts["prompts"], counts["responses"]) == (350, 1, 301)
    assert store.con.execute("SELECT count(DISTINCT id) FROM responses").fetchone()[0] == 301


class _LateSha(Future):
    """A sha256 that reports itself unfinished until asked for: the columnar path then finds the
    duplicate only when it begins the batch, after streaming the whole file."""

    def __init__(self, path):
        super().__init__()
        self.set_result(readers.source_sha256(str(path)))

    def done(self):
        return False


@pytest.mark.parametrize("late", [False, True])
def test_same_file_again_is_a_duplicate_whenever_its_sha_arrives(store, tmp_path, monkeypatch, late):
    monkeypatch.setattr(readers, "BATCH_BYTES", 2048)
    path = write_jsonl(tmp_path / "again.jsonl", good_rows(120))
    first = ingest_file(store, path)
    before = snapshot_of(store)
    if late:
        monkeypatch.setattr(ingest_mod, "sha256_in_background", _LateSha)
    again = ingest_file(store, path)
    assert again.duplicate and again.batch_id == first.batch_id
    assert snapshot_of(store) == before
    assert store.con.execute("SELECT count(*) FROM batches").fetchone()[0] == 1


# --- property: malformed rows never change the store --------------------------------------------

scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=True),
                    st.text(max_size=5), st.lists(st.integers(), max_size=2))
corruptions = st.one_of(
    st.sampled_from(["prompt", "response_a", "response_b", "winner"]).map(lambda k: ("drop", k, None)),
    st.tuples(st.just("set"), st.sampled_from(["prompt", "winner", "strength", "created_at",
                                               "response_a", "messages"]), scalars),
)


def corrupt(row: dict, how) -> dict:
    action, key, value = how
    row = dict(row)
    if action == "drop":
        row.pop(key)
    else:
        row[key] = value
    return row


def is_valid(row: dict) -> bool:
    """The row validation, restated independently for the values the strategy can produce."""
    texts = all(isinstance(row.get(k), str) for k in ("response_a", "response_b"))
    prompt_ok = isinstance(row.get("prompt"), str) and row["prompt"] != ""
    if row.get("messages") not in (None, ""):
        return False  # the strategy's scalars are never a list of {role, content}
    strength = row.get("strength")
    strength_ok = strength in (None, "") or (not isinstance(strength, bool) and _margin(strength))
    created = row.get("created_at")
    created_ok = created in (None, "") or _iso(created)
    return texts and prompt_ok and row.get("winner") in ("a", "b", "tie") and strength_ok and created_ok


def _margin(value) -> bool:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return False
    return 0.0 <= number <= 10.0  # a Bradley-Terry margin (formats.strength); also no inf, no nan


def _iso(value) -> bool:
    from datetime import datetime

    try:
        datetime.fromisoformat(str(value))
    except ValueError:
        return False
    return True


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(how=corruptions, position=st.integers(0, 4), use_file=st.booleans())
def test_malformed_rows_leave_the_store_unchanged(store, tmp_path, how, position, use_file):
    rows = good_rows(5, start=position * 10)
    rows[position] = corrupt(rows[position], how)
    before = snapshot_of(store)
    path = tmp_path / f"p{abs(hash((str(how), position)))}.jsonl"
    try:
        if use_file:
            write_jsonl(path, rows)
            result = ingest_file(store, path)
        else:
            result = ingest_records(store, rows)
    except IngestError as exc:
        assert not is_valid(rows[position])
        assert f":{position + 1}: " in exc.errors[0]
        assert snapshot_of(store) == before
    else:
        assert is_valid(rows[position])
        assert result.duplicate or result.rows_ok + result.rows_existing == 5


# --- a kill in the middle of a batch --------------------------------------------------------------

KILLABLE = textwrap.dedent("""
    import sys, time
    import annotation.ingest.spool as spool_mod
    import annotation.store as store_mod
    from annotation.ingest.batch import ingest_file
    original = spool_mod._new_responses
    calls = []
    def slow_responses(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:  # two chunks streamed into the open transaction's INSERT
            print("MID-BATCH", flush=True)
            time.sleep(60)
        return original(*args, **kwargs)
    spool_mod._new_responses = slow_responses
    import annotation.ingest.batch as ingest_mod
    ingest_mod.BATCH_ROWS = 50
    import annotation.ingest.readers as readers
    readers.BATCH_BYTES = 8192
    with store_mod.Store(sys.argv[1]) as store:
        ingest_file(store, sys.argv[2])
""")


def test_sigkill_mid_batch_leaves_store_consistent_and_rerun_completes(tmp_path):
    db, data = tmp_path / "kill.duckdb", write_jsonl(tmp_path / "big.jsonl", good_rows(400))
    with Store(db) as store:
        ingest_records(store, good_rows(2, start=9000))
        before = snapshot_of(store)
    # TMPDIR: the killed process cannot remove its spool folder (annotation.ingest.spool); keep it in tmp_path
    proc = subprocess.Popen([sys.executable, "-c", KILLABLE, str(db), str(data)], cwd=ROOT,
                            stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT), "TMPDIR": str(tmp_path)})
    try:
        assert proc.stdout.readline().strip() == "MID-BATCH"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    with Store(db) as store:
        assert snapshot_of(store) == before
        assert store.con.execute("SELECT count(*) FROM batches").fetchone()[0] == 1
        result = ingest_file(store, data)
        assert (result.rows_in, result.rows_ok) == (400, 400)
        assert store.counts()["judgments"] == 402


# --- a second process -------------------------------------------------------------------------------


def test_lock_conflict_names_the_pid(tmp_path):
    db = tmp_path / "locked.duckdb"
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from annotation.store import Store; "
         "s = Store(sys.argv[1]); print('HOLDING', flush=True); time.sleep(60)", str(db)],
        cwd=ROOT, stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        assert holder.stdout.readline().strip() == "HOLDING"
        data = write_jsonl(tmp_path / "v.jsonl", good_rows(2))
        cli = subprocess.run([sys.executable, "-m", "service.cli", "--db", str(db), "ingest", str(data)],
                             cwd=ROOT, capture_output=True, text=True, timeout=60,
                             env={**os.environ, "PYTHONPATH": str(ROOT)})
    finally:
        holder.kill()
        holder.wait(timeout=30)
    assert cli.returncode == 1
    assert f"locked by another process (PID {holder.pid}" in cli.stderr
    assert "Traceback" not in cli.stderr
    # the holder's whole command; --server is no way out when the holder is not a server
    assert "time.sleep(60)" in cli.stderr and "--server" not in cli.stderr
