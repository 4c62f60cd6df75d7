"""prompts, responses and judgments have no PRIMARY KEY (schema.sql): ids must stay unique anyway,
within a batch, across batches, on both ingest paths, through write_batch, and when an export comes back."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest

import annotation.ingest.batch as ingest_mod
from annotation.export import export
from annotation.ids import response_id
from annotation.ingest import columnar
from annotation.ingest.batch import ingest_file, ingest_records

# Two prompts; "q1" has responses x, y, z of which x and y come back in several rows and batches.
FIRST = [{"prompt": "q1", "response_a": "x", "response_b": "y", "winner": "a", "rater": "human:1"},
         {"prompt": "q1", "response_a": "y", "response_b": "x", "winner": "b", "rater": "human:2"},
         {"prompt": "q2", "response_a": "x", "response_b": "w", "winner": "tie", "rater": "human:1"}]
SECOND = [{"prompt": "q1", "response_a": "x", "response_b": "z", "winner": "a", "rater": "human:3"},
          {"prompt": "q3", "response_a": "x", "response_b": "x", "winner": "tie", "rater": "human:3"}]


def duplicated_ids(store) -> dict[str, int]:
    return {t: store.con.execute(f"SELECT count(*) - count(DISTINCT id) FROM {t}").fetchone()[0]
            for t in ("prompts", "responses", "judgments")}


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.mark.parametrize("precise", [False, True])
def test_prompts_and_responses_are_written_once_across_rows_and_batches(store, tmp_path, monkeypatch,
                                                                       precise):
    if precise:
        monkeypatch.setattr(columnar, "stage", lambda *a: (_ for _ in ()).throw(
            columnar.NeedsPrecise()))
    monkeypatch.setattr(ingest_mod, "BATCH_ROWS", 2)  # the precise path writes several chunks
    ingest_file(store, write_jsonl(tmp_path / "first.jsonl", FIRST))
    ingest_file(store, write_jsonl(tmp_path / "second.jsonl", SECOND))
    counts = store.counts()
    # prompts q1 q2 q3; responses (q1: x y z) (q2: x w) (q3: x): a response id includes its prompt
    assert (counts["prompts"], counts["responses"], counts["judgments"]) == (3, 6, 5)
    assert duplicated_ids(store) == {"prompts": 0, "responses": 0, "judgments": 0}
    ids = set(store.con.execute("SELECT id FROM responses").fetchall())
    assert (response_id("q1", "z"),) in ids and (response_id("q3", "x"),) in ids


@pytest.mark.parametrize("precise", [False, True])
def test_a_batch_that_forgets_its_ids_still_writes_each_once(store, tmp_path, monkeypatch, precise):
    """Past seen.MAX_IDS a batch forgets the ids it wrote; its later copies are dropped at its end."""
    from annotation.ingest import readers, seen, spool

    if precise:
        monkeypatch.setattr(columnar, "stage", lambda *a: (_ for _ in ()).throw(columnar.NeedsPrecise()))
    monkeypatch.setattr(ingest_mod, "BATCH_ROWS", 2)
    monkeypatch.setattr(readers, "BATCH_BYTES", 800)  # the columnar path: chunks of a few rows
    monkeypatch.setattr(seen, "MAX_IDS", 1)  # forget after every chunk
    monkeypatch.setattr(spool, "MAP_BYTES", 0)  # and read the spool back as a large file's is
    first = ingest_file(store, write_jsonl(tmp_path / "first.jsonl", FIRST * 3 + FIRST[:1]))
    second = ingest_file(store, write_jsonl(tmp_path / "second.jsonl", SECOND + FIRST))
    counts = store.counts()
    assert (counts["prompts"], counts["responses"], counts["judgments"]) == (3, 6, 5)
    assert duplicated_ids(store) == {"prompts": 0, "responses": 0, "judgments": 0}
    assert (first.rows_ok, first.rows_existing, second.rows_ok, second.rows_existing) == (3, 7, 2, 3)
    kept = store.con.execute("SELECT text FROM responses WHERE id = ?", [response_id("q1", "y")]).fetchall()
    assert kept == [("y",)]


def test_the_first_source_model_of_a_response_is_kept(store):
    ingest_records(store, [{**FIRST[0], "model_a": "m1"}])
    ingest_records(store, [{**FIRST[0], "model_a": "m2", "rater": "human:9"}])
    rid = response_id("q1", "x")  # over the prompt text, not its id
    assert store.con.execute("SELECT source_model FROM responses WHERE id = ?", [rid]).fetchall() == [("m1",)]


def test_reingesting_an_export_adds_no_rows(store, tmp_path):
    ingest_records(store, FIRST + SECOND)
    before = store.counts()
    summary = export(store, "jsonl", tmp_path / "out.jsonl")
    again = ingest_file(store, tmp_path / "out.jsonl")
    assert summary["rows"] == 5 and (again.rows_in, again.rows_ok) == (5, 0)
    after = store.counts()
    assert {t: after[t] for t in ("prompts", "responses", "judgments")} == \
           {t: before[t] for t in ("prompts", "responses", "judgments")}
    assert after["batches"] == before["batches"] + 1


def test_a_row_repeated_with_its_own_id_is_one_judgment_and_its_id_is_part_of_its_identity(store):
    result = ingest_records(store, [{**FIRST[0], "id": "j-1"}, {**FIRST[0], "id": "j-1"},
                                    {**FIRST[0], "id": "j-2"}, {**FIRST[1], "id": "j-1"}])
    assert (result.rows_in, result.rows_ok) == (4, 3)  # j-2 is a deliberate repeat; FIRST[1] another vote
    assert store.con.execute("SELECT given_id, count(*) FROM judgments GROUP BY ALL ORDER BY ALL"
                             ).fetchall() == [("j-1", 2), ("j-2", 1)]


def test_write_batch_skips_ids_already_in_the_store_or_repeated(store):
    prompts = pa.table({"id": ["p1", "p1", "p2"], "text": ["a", "a", "b"]})
    store.write_batch("one", "1" * 64, 1, {"prompts": prompts})
    store.write_batch("two", "2" * 64, 1, {"prompts": pa.table({"id": ["p2", "p3"], "text": ["b", "c"]})})
    assert sorted(store.con.execute("SELECT id FROM prompts").fetchall()) == [("p1",), ("p2",), ("p3",)]
