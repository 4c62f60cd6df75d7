"""Each input format and file type, from small files written here; expected values by hand."""

from __future__ import annotations

import csv
import gzip
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from annotation.ids import prompt_id
from annotation.ingest import columnar
from annotation.ingest.batch import IngestError, ingest_file, ingest_records

ROWS = [
    {"prompt": "What is 2+2?", "response_a": "4", "response_b": "5", "winner": "a", "rater": "alice",
     "strength": 0.9, "question_id": 81},
    {"prompt": "What is 2+2?", "response_a": "5", "response_b": "4", "winner": "b"},
    {"prompt": "Name a prime.", "response_a": "9", "response_b": "7", "winner": "tie",
     "rater": "ai:judge:v1", "created_at": "2024-05-01T12:00:00Z", "rationale": "both fine"},
]


def write_jsonl(path, rows, opener=open):
    with opener(path, "wt", encoding="utf-8") as fh:
        fh.writelines(json.dumps(r) + "\n" for r in rows)
    return path


def full_rows(rows):
    """Every row with every key (None where absent): Arrow takes its columns from the first row."""
    names = sorted({k for r in rows for k in r})
    return [{k: r.get(k) for k in names} for r in rows]


def write_csv(path, rows):
    names = sorted({k for r in rows for k in r})
    with open(path, "w", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, fieldnames=names)
        writer.writeheader()
        writer.writerows(rows)
    return path


def votes(store):
    """(prompt, response_a, response_b, winner, rater, strength, rationale), sorted."""
    t = store.judgments()
    return sorted(zip(*(t.column(c).to_pylist() for c in ("prompt", "response_a_text", "response_b_text",
                                                        "winner", "rater", "strength", "rationale")), strict=False),
                  key=str)


EXPECTED = sorted([("What is 2+2?", "4", "5", "a", "human:alice", 0.9, None),
                   ("What is 2+2?", "5", "4", "b", "human:anonymous", None, None),
                   ("Name a prime.", "9", "7", "tie", "ai:judge:v1", None, "both fine")], key=str)


@pytest.mark.parametrize("kind", ["jsonl", "jsonl.gz", "json", "csv", "parquet"])
def test_judgment_files_of_every_type(store, tmp_path, kind):
    path = tmp_path / f"votes.{kind}"
    writers = {"jsonl": lambda: write_jsonl(path, ROWS),
               "jsonl.gz": lambda: write_jsonl(path, ROWS, gzip.open),
               "json": lambda: path.write_text(json.dumps(ROWS)),
               "csv": lambda: write_csv(path, ROWS),
               "parquet": lambda: pq.write_table(pa.Table.from_pylist(full_rows(ROWS)), path)}
    writers[kind]()
    result = ingest_file(store, path)
    assert (result.rows_in, result.rows_ok, result.rows_rejected) == (3, 3, 0)
    assert votes(store) == EXPECTED
    counts = store.counts()
    assert (counts["prompts"], counts["responses"], counts["pairs"]) == (2, 4, 2)
    meta = [json.loads(m) for m in store.judgments().column("metadata").to_pylist() if m]
    assert meta in ([{"question_id": 81}], [{"question_id": "81"}])  # CSV keeps text as text
    created = [c for c in store.judgments().column("created_at").to_pylist() if c]
    assert [c.isoformat() for c in created] == ["2024-05-01T12:00:00"]
    assert store.judgments().column("source").to_pylist() == ["judgments"] * 3


def test_columnar_and_precise_paths_write_the_same_store(tmp_path, monkeypatch):
    from annotation.store import Store

    path = write_jsonl(tmp_path / "v.jsonl", ROWS * 3)
    tables = []
    for force_precise in (False, True):
        if force_precise:
            monkeypatch.setattr(columnar, "stage", lambda *a: (_ for _ in ()).throw(
                columnar.NeedsPrecise()))
        with Store(tmp_path / f"{force_precise}.duckdb") as store:
            ingest_file(store, path, source_model="m1")
            q = "SELECT * EXCLUDE (batch_id) FROM judgments ORDER BY id"
            tables.append((store.con.execute(q).fetchall(),
                           store.con.execute("SELECT * FROM responses ORDER BY id").fetchall()))
    assert tables[0] == tables[1]
    assert {r[3] for r in tables[0][1]} == {"m1"}


def test_trl_explicit_prompt_strings(store):
    ingest_records(store, [{"prompt": "Say hi", "chosen": "Hello!", "rejected": "Go away."}], fmt="trl")
    assert votes(store) == [("Say hi", "Hello!", "Go away.", "a", "human:anonymous", None, None)]
    assert store.judgments().column("source").to_pylist() == ["trl"]


def test_trl_conversational_explicit_and_implicit_give_the_same_prompt(store):
    prompt = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say hi"}]
    explicit = {"prompt": prompt, "chosen": [{"role": "assistant", "content": "Hi."}],
                "rejected": [{"role": "assistant", "content": "No."}]}
    implicit = {"chosen": prompt + [{"role": "assistant", "content": "Hello."}],
                "rejected": prompt + [{"role": "assistant", "content": "Bye."}]}
    ingest_records(store, [explicit, implicit], fmt="trl")
    table = store.judgments()
    assert set(table.column("prompt_id").to_pylist()) == {prompt_id(prompt)}
    assert json.loads(table.column("messages")[0].as_py()) == prompt
    assert table.column("prompt")[0].as_py() == "system: Be brief.\n\nuser: Say hi"
    assert sorted(table.column("response_a_text").to_pylist()) == ["Hello.", "Hi."]


def test_hh_transcripts_split_at_the_last_assistant_turn(store, tmp_path):
    base = "\n\nHuman: Hi\n\nAssistant: Hello\n\nHuman: Tell me a joke"
    rows = [{"chosen": base + "\n\nAssistant: Why did the chicken...",
             "rejected": base + "\n\nAssistant: No."},
            {"chosen": "\n\nHuman: A\n\nAssistant: x", "rejected": "\n\nHuman: B\n\nAssistant: y"}]
    path = write_jsonl(tmp_path / "hh.jsonl", rows)
    with pytest.raises(IngestError) as info:
        ingest_file(store, path)
    assert info.value.errors == [f"{path}:2: rejected: the transcript differs from chosen before "
                                 "the last assistant turn, so there is no shared prompt"]
    assert store.counts()["judgments"] == 0
    result = ingest_file(store, path, on_error="skip")
    assert (result.rows_ok, result.rows_rejected) == (1, 1)
    assert votes(store)[0][:4] == (base + "\n\nAssistant:", "Why did the chicken...", "No.", "a")
    assert store.judgments().column("source").to_pylist() == ["hh"]


def test_kto_rows_go_to_feedback(store, tmp_path):
    path = write_csv(tmp_path / "kto.csv", [{"prompt": "Say hi", "completion": "Hello", "label": "true"},
                                            {"prompt": "Say hi", "completion": "Go away",
                                             "label": "False"}])
    result = ingest_file(store, path)
    assert result.rows_ok == 2
    assert sorted(store.feedback().select(["completion", "label"]).to_pylist(), key=str) == [
        {"completion": "Go away", "label": False}, {"completion": "Hello", "label": True}]
    assert store.counts()["judgments"] == 0


def test_label_studio_json_export(store, shared_data):
    ingest_file(store, shared_data / "label_studio" / "export_sync.json")
    assert [v[:5] for v in votes(store)] == [("Name a prime.", "9", "7", "b", "human:ls:1"),
                                             ("What is 2+2?", "4", "It is 5.", "a", "human:ls:1")]
    assert store.judgments().column("source").to_pylist() == ["label-studio"] * 2


@pytest.mark.parametrize("name,first_line", [("export_JSON_MIN.txt", 1), ("export_CSV.txt", 2)])
def test_label_studio_flat_exports_reject_invalid_results(store, shared_data, name, first_line):
    """Label Studio accepted these (an unknown from_name, which its flat exports drop, and
    "selected": "middle"); each is reported with its annotation id."""
    path = shared_data / "label_studio" / name
    with pytest.raises(IngestError) as info:
        ingest_file(store, path, fmt="label-studio")
    errors = info.value.errors
    assert len(errors) == 4 and info.value.field == "annotation[8].result"
    assert errors[0] == f"{path}:{first_line}: annotation[8].result: empty: the annotation holds no verdict"
    assert errors[1] == (f"{path}:{first_line + 1}: annotation[7].result.value.selected: 'middle' is "
                         "not 'left' or 'right'")
    assert [e.split(": ")[1] for e in errors[2:]] == ["annotation[4].result",
                                                      "annotation[3].result.value.selected"]
    ingest_file(store, shared_data / "label_studio" / "export_sync.json")
    result = ingest_file(store, path, fmt="label-studio", on_error="skip")
    # the two valid annotations are the ones export_sync.json holds: same ids, nothing new
    assert (result.rows_in, result.rows_ok, result.rows_rejected, result.rows_existing) == (6, 0, 4, 2)


def test_label_studio_ranker_export_is_ingested_as_pairwise_judgments(store, shared_data):
    """Two rankings of the answers a "hi", b "hello there", c "yo" (best first): b,a,c and a,b,c;
    each is its 3 pairwise judgments, in the task's item order, the higher-ranked winning."""
    result = ingest_file(store, shared_data / "label_studio" / "export_ranker.json")
    assert (result.rows_in, result.rows_ok, result.rows_rejected) == (6, 6, 0)
    assert sorted(v[1:5] for v in votes(store)) == sorted([
        ("hi", "hello there", "b", "human:ls:1"), ("hi", "yo", "a", "human:ls:1"),
        ("hello there", "yo", "a", "human:ls:1"),
        ("hi", "hello there", "a", "human:ls:1"), ("hi", "yo", "a", "human:ls:1"),
        ("hello there", "yo", "a", "human:ls:1")])


def test_hf_saved_dataset_dict_and_load_dataset_spec(store, tmp_path):
    import datasets

    folder = tmp_path / "saved"
    datasets.DatasetDict({"train": datasets.Dataset.from_list(ROWS[:2]),
                          "test": datasets.Dataset.from_list(ROWS[2:])}).save_to_disk(str(folder))
    assert ingest_file(store, folder, fmt="hf").rows_ok == 3
    with pytest.raises(ValueError, match="--format hf needs a folder"):
        ingest_file(store, tmp_path / "nope.jsonl", fmt="hf")
    assert len(set(store.judgments().column("id").to_pylist())) == 3  # rows numbered across splits
    spec_dir = tmp_path / "spec"
    spec_dir.mkdir()
    write_jsonl(spec_dir / "data.jsonl", [{"prompt": "p", "chosen": "c", "rejected": "r"}])
    assert ingest_file(store, f"hf:{spec_dir}").rows_ok == 1


def test_bad_rows_are_named_by_file_line_and_field(store, tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(ROWS[0]) + "\n\n{not json\n"
                    + json.dumps({**ROWS[1], "winner": "A"}) + "\n"
                    + json.dumps({**ROWS[1], "strength": "high"}) + "\n"
                    + json.dumps({**ROWS[1], "created_at": "yesterday"}) + "\n[1]\n")
    with pytest.raises(IngestError) as info:
        ingest_file(store, path)
    assert [e.split(": ")[0:2] for e in info.value.errors] == [
        [f"{path}:3", "json"], [f"{path}:4", "winner"], [f"{path}:5", "strength"],
        [f"{path}:6", "created_at"], [f"{path}:7", "row"]]
    assert store.counts()["batches"] == 0


def test_unknown_columns_name_the_fix(store):
    with pytest.raises(IngestError, match="cannot tell the format.*pass --format"):
        ingest_records(store, [{"question": "q", "answer": "a"}])


def test_rows_without_rater_are_anonymous_and_each_is_a_vote(store):
    ingest_records(store, [ROWS[1], {**ROWS[1], "id": "second"}])
    assert store.judgments().column("rater").to_pylist() == ["human:anonymous"] * 2
    assert store.pairs().to_pylist()[0]["n_votes"] == 2


def test_reingest_is_a_noop(store, tmp_path):
    path = write_jsonl(tmp_path / "v.jsonl", ROWS)
    first = ingest_file(store, path)
    again = ingest_file(store, path)
    assert again.duplicate and again.batch_id == first.batch_id
    assert "already ingested" in again.summary()
    assert store.counts()["judgments"] == 3 and store.counts()["batches"] == 1
