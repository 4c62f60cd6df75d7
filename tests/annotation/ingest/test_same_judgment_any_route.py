"""A judgment's id is its content's: the same judgment by any route (a file, its .gz, an HTTP body,
a saved dataset, an export read back) is stored once, and a rater's deliberate repeat is kept only
when its row says so (an id or a time of its own). Real rows from shared/data: hh-rlhf and MT-Bench."""

from __future__ import annotations

import gzip
import itertools
import json

import pytest

from annotation.export import export
from annotation.ingest.batch import ingest_file, ingest_records
from annotation.ingest.formats import split_transcripts

HH = "hh-rlhf/harmless-base-test.jsonl.gz"
MTBENCH = "mtbench_human/mtbench_turn1_judgments.jsonl.gz"


def head(shared_data, name: str, n: int) -> list[dict]:
    with gzip.open(shared_data / name, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in itertools.islice(f, n)]


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def judgments(store) -> int:
    return store.counts()["judgments"]


def test_a_gz_then_its_plain_copy_stores_each_judgment_once(store, shared_data, tmp_path):
    rows = head(shared_data, HH, 300)
    packed = tmp_path / "hh.jsonl.gz"
    with gzip.open(packed, "wt", encoding="utf-8") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    first = ingest_file(store, packed)
    again = ingest_file(store, write_jsonl(tmp_path / "hh.jsonl", rows))
    assert not again.duplicate  # another sha256: a new batch, whose rows are all there already
    assert (again.rows_in, again.rows_ok, again.rows_existing) == (300, 0, 300)
    assert judgments(store) == first.rows_ok
    assert store.con.execute("SELECT max(n_votes) FROM pairs").fetchone()[0] == 1


def test_hh_as_the_server_posts_it_then_as_a_file_adds_nothing(store, shared_data, tmp_path):
    rows = head(shared_data, HH, 200)
    pairs = []  # what `bradley --server URL ingest` sends to POST /pairs: the transcripts split
    for r in rows:
        prompt, chosen, rejected = split_transcripts(r["chosen"], r["rejected"])
        pairs.append({**r, "prompt": prompt, "chosen": chosen, "rejected": rejected})
    posted = ingest_records(store, pairs, fmt="trl", source="http:/pairs")
    assert ingest_file(store, write_jsonl(tmp_path / "hh.jsonl", rows)).rows_ok == 0
    assert judgments(store) == posted.rows_ok


def test_a_judgments_body_then_the_same_file_adds_nothing(store, shared_data, tmp_path):
    rows = head(shared_data, MTBENCH, 400)
    path = write_jsonl(tmp_path / "mt.jsonl", rows)
    posted = ingest_records(store, rows, fmt="judgments", source="http:/judgments")
    assert ingest_file(store, path).rows_ok == 0
    assert ingest_records(store, rows[::-1], source="http:/judgments").rows_ok == 0  # another body
    assert judgments(store) == posted.rows_ok


def test_two_models_that_wrote_the_same_text_are_two_votes(store, shared_data):
    """MT-Bench's GPT-4 judged gpt-3.5-turbo and gpt-4 against claude-v1 on question 107, and both
    wrote the same answer: the same texts, two comparisons, two votes."""
    rows = [r for r in head(shared_data, MTBENCH, 1502) if r["question_id"] == 107
            and r["rater"] == "ai:gpt-4" and r["model_b"] == "claude-v1"
            and r["model_a"] in ("gpt-3.5-turbo", "gpt-4")]
    assert len(rows) == 2 and rows[0]["response_a"] == rows[1]["response_a"]
    assert ingest_records(store, rows).rows_ok == 2


def test_an_hf_dataset_then_its_jsonl_adds_nothing(store, shared_data, tmp_path):
    datasets = pytest.importorskip("datasets")
    rows = head(shared_data, MTBENCH, 150)
    folder = tmp_path / "mt_dataset"
    datasets.DatasetDict({"train": datasets.Dataset.from_list(rows)}).save_to_disk(str(folder))
    first = ingest_file(store, folder, fmt="hf")
    assert first.rows_ok > 0
    assert ingest_file(store, write_jsonl(tmp_path / "mt.jsonl", rows)).rows_ok == 0
    assert judgments(store) == first.rows_ok


REPEATS = [  # one rater, one comparison, one verdict
    {"prompt": "Name a colour.", "response_a": "Red.", "response_b": "Blue is a colour.", "winner": "a",
     "rater": "alice"},
]


def test_a_repeat_is_kept_only_when_its_row_says_so(store):
    base = REPEATS[0]
    rows = [base, dict(base),                                      # the same row twice: one judgment
            {**base, "id": "vote-1"}, {**base, "id": "vote-2"},    # its own ids: two more
            {**base, "created_at": "2024-05-01T12:00:00Z"},         # its own times: two more
            {**base, "created_at": "2024-05-02T12:00:00Z"},
            {**base, "strength": 2.0}]                             # another strength: another judgment
    result = ingest_records(store, rows)
    assert (result.rows_in, result.rows_ok) == (7, 6)
    assert store.con.execute("SELECT count(*) FROM pairs").fetchone()[0] == 1  # still one voice


def test_an_export_read_back_into_this_store_or_an_empty_one_keeps_ids(store, shared_data, tmp_path):
    from annotation.store import Store

    base = REPEATS[0]
    rows = head(shared_data, MTBENCH, 100) + [{**base, "id": "vote-1"}, {**base, "id": "vote-2"},
                                               {**base, "created_at": "2024-05-01T12:00:00Z"}]
    ingest_records(store, rows)
    before = store.con.execute("SELECT list(id ORDER BY id) FROM judgments").fetchone()[0]
    for fmt, name in (("jsonl", "out.jsonl"), ("parquet", "out.parquet")):
        export(store, fmt, tmp_path / name)
        assert ingest_file(store, tmp_path / name).rows_ok == 0
        with Store(tmp_path / f"{fmt}.duckdb") as other:
            assert ingest_file(other, tmp_path / name).rows_ok == len(before)
            assert other.con.execute("SELECT list(id ORDER BY id) FROM judgments").fetchone()[0] == before
    assert store.con.execute("SELECT list(id ORDER BY id) FROM judgments").fetchone()[0] == before
    lines = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert {"vote-1", "vote-2"} <= {r["id"] for r in lines}  # the ids the rows brought


def test_feedback_by_file_then_by_body_is_stored_once(store, tmp_path):
    rows = [{"prompt": f"Say {w}.", "completion": w, "label": i % 2 == 0, "rater": "dave"}
            for i, w in enumerate(("one", "two", "three"))]
    assert ingest_file(store, write_jsonl(tmp_path / "kto.jsonl", rows)).rows_ok == 3
    assert ingest_records(store, rows, source="http:/feedback").rows_ok == 0
    assert ingest_records(store, [{**rows[0], "id": "again"}], source="http:/feedback").rows_ok == 1
    assert store.counts()["feedback"] == 4


def test_ingest_ids_equal_the_stores_sql_for_every_kind_of_row(store, shared_data):
    """ids.with_ids (ingest) and schema.sql's judgment_id (the migration) hash the same content."""
    base = REPEATS[0]
    ingest_records(store, head(shared_data, MTBENCH, 50) + [
        {**base, "id": 17, "strength": 0.1, "created_at": "2024-05-01T12:00:00.123456+02:00"},
        {**base, "strength": 3, "model_a": "m-1", "model_b": "m-2", "rationale": "short"}])
    ingest_records(store, [{"prompt": "p", "completion": "c", "label": True, "id": "k"},
                           {"prompt": "p", "completion": "d", "label": False}], fmt="kto")
    assert store.con.execute(
        "SELECT count(*) FROM judgments WHERE id <> judgment_id(rater, response_a, response_b, winner, "
        "strength, created_at, metadata, given_id)").fetchone()[0] == 0
    assert store.con.execute("SELECT count(*) FROM feedback WHERE id <> feedback_id(rater, response_id, "
                             "label, given_id)").fetchone()[0] == 0
    assert judgments(store) == 52
