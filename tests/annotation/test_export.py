"""Export: TRL pairs, judgments as JSONL / Parquet / HF, snapshots, and export -> ingest round trips."""

from __future__ import annotations

import json

import pytest

from annotation.export import ExportError, export
from annotation.ingest.batch import ingest_file, ingest_records
from annotation.store import Store
from service.cli.main import main as cli_main

CONVERSATION = [{"role": "user", "content": "Say hi"}]
MIXED = [
    {"prompt": "2+2?", "response_a": "4", "response_b": "5", "winner": "a", "rater": "human:1",
     "strength": 2.0, "created_at": "2024-05-01T12:00:00", "rationale": "maths", "topic": "arith"},
    {"prompt": "2+2?", "response_a": "5", "response_b": "4", "winner": "b", "rater": "human:2"},
    {"prompt": "2+2?", "response_a": "4", "response_b": "5", "winner": "tie", "rater": "ai:j:c"},
    {"prompt": "Name a prime.", "response_a": "9", "response_b": "7", "winner": "a", "rater": "human:1"},
    {"prompt": "Name a prime.", "response_a": "7", "response_b": "9", "winner": "a", "rater": "human:2"},
    {"messages": json.dumps(CONVERSATION), "response_a": "Hi!", "response_b": "No.", "winner": "a",
     "model_a": "m1", "model_b": "m2"},
]
TABLES = {
    "prompts": "SELECT id, text, CAST(messages AS VARCHAR) FROM prompts",
    "responses": "SELECT * FROM responses",
    "judgments": "SELECT * EXCLUDE (batch_id) FROM judgments",
}


def content(store) -> dict:
    return {name: sorted(store.con.execute(q).fetchall(), key=str) for name, q in TABLES.items()}


@pytest.fixture
def filled(store):
    ingest_records(store, MIXED, fmt="judgments")
    return store


@pytest.mark.parametrize("fmt,name", [("jsonl", "out.jsonl"), ("parquet", "out.parquet"),
                                      ("hf", "out_hf")])
def test_export_then_ingest_gives_the_same_store(filled, tmp_path, fmt, name):
    if fmt == "hf":  # the HF DatasetDict also carries KTO feedback, as a split of its own
        ingest_records(filled, [{"prompt": "Say hi", "completion": "Hello", "label": True}], fmt="kto")
    out = tmp_path / name
    summary = export(filled, fmt, out)
    assert summary["rows"] == len(MIXED) and summary["format"] == fmt
    with Store(tmp_path / "copy.duckdb") as copy:
        result = ingest_file(copy, out)
        assert content(copy) == content(filled)
        if fmt == "hf":
            assert copy.feedback().to_pylist() == filled.feedback().to_pylist()
            assert result.rows_ok == len(MIXED) + 1
    again = ingest_file(filled, out)  # the export of a store adds nothing to that store
    assert again.rows_ok == 0 and again.rows_existing == again.rows_in
    assert "already in the store" in again.summary()


def test_trl_export_has_majority_pairs_and_drops_even_splits(filled, tmp_path):
    out = tmp_path / "pairs.jsonl"
    summary = export(filled, "trl", out)  # auto: the store mixes text and conversations
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    # 2+2?: 4 beats 5 by 2 votes to 0 (+1 tie); prime: 7 vs 9 split 1-1 -> left out
    assert {"prompt": [{"role": "user", "content": "2+2?"}], "chosen": [{"role": "assistant",
            "content": "4"}], "rejected": [{"role": "assistant", "content": "5"}]} in rows
    assert {"prompt": CONVERSATION, "chosen": [{"role": "assistant", "content": "Hi!"}],
            "rejected": [{"role": "assistant", "content": "No."}]} in rows
    assert len(rows) == 2 and summary["skipped_unresolved"] == 1 and summary["as"] == "conversational"
    with Store(tmp_path / "trl.duckdb") as copy:
        ingest_file(copy, out)
        export(copy, "trl", tmp_path / "again.jsonl")
    again = [json.loads(line) for line in (tmp_path / "again.jsonl").read_text().splitlines()]
    def canonical(table):
        return sorted(json.dumps(r, sort_keys=True) for r in table)

    assert canonical(again) == canonical(rows)


def test_trl_export_as_text_renders_conversations_as_transcripts(filled, tmp_path):
    export(filled, "trl", tmp_path / "pairs.parquet", shape="text")  # one shape: Parquet holds it
    import pyarrow.parquet as pq

    rows = pq.read_table(tmp_path / "pairs.parquet").to_pylist()
    assert {"prompt": "\n\nHuman: Say hi\n\nAssistant:", "chosen": "Hi!", "rejected": "No."} in rows
    assert {"prompt": "2+2?", "chosen": "4", "rejected": "5"} in rows


def test_trl_export_turns_hh_transcripts_into_messages(store, tmp_path):
    hh = {"chosen": "\n\nHuman: hi\n\nAssistant: hello\n\nHuman: 2+2?\n\nAssistant: 4",
          "rejected": "\n\nHuman: hi\n\nAssistant: hello\n\nHuman: 2+2?\n\nAssistant: 5"}
    ingest_records(store, [hh], fmt="hh")
    ingest_records(store, [{"prompt": CONVERSATION, "chosen": [{"role": "assistant", "content": "Hi"}],
                            "rejected": [{"role": "assistant", "content": "No"}]}], fmt="trl")
    export(store, "trl", tmp_path / "pairs.parquet")
    import pyarrow.parquet as pq

    rows = pq.read_table(tmp_path / "pairs.parquet").to_pylist()
    assert [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"},
            {"role": "user", "content": "2+2?"}] in [r["prompt"] for r in rows]


def test_trl_export_refuses_text_it_cannot_read_as_a_conversation(store, tmp_path):
    ingest_records(store, [{"prompt": "Assistant: I begin", "chosen": "a", "rejected": "b"},
                           {"prompt": CONVERSATION, "chosen": [{"role": "assistant", "content": "Hi"}],
                            "rejected": [{"role": "assistant", "content": "No"}]}], fmt="trl")
    with pytest.raises(ExportError, match="1 pairs have conversational prompts and 1 text prompts, of "
                       "which 1 carry Human/Assistant markers"):
        export(store, "trl", tmp_path / "pairs.jsonl")
    assert not (tmp_path / "pairs.jsonl").exists()
    assert export(store, "trl", tmp_path / "pairs.jsonl", shape="text")["rows"] == 2


def test_snapshot_export_reproduces_what_a_past_run_read(filled, tmp_path):
    snap = filled.create_snapshot(raters="human")
    ingest_records(filled, [{"prompt": "new?", "response_a": "x", "response_b": "y", "winner": "a",
                             "rater": "human:9"}])
    summary = export(filled, "jsonl", tmp_path / "snap.jsonl", snapshot_id=snap)
    rows = [json.loads(line) for line in (tmp_path / "snap.jsonl").read_text().splitlines()]
    assert summary["rows"] == 5 == len(rows)
    assert {r["rater"] for r in rows} == {"human:1", "human:2", "human:anonymous"}
    first = next(r for r in rows if r.get("rationale"))
    assert first["metadata"] == {"topic": "arith"} and first["created_at"] == "2024-05-01T12:00:00"


def test_hf_export_refuses_an_existing_folder(filled, tmp_path):
    (tmp_path / "exists").mkdir()
    with pytest.raises(ExportError, match="exists"):
        export(filled, "hf", tmp_path / "exists")


def test_cli_export_and_ingest(tmp_path, capsys):
    db, data = tmp_path / "cli.duckdb", tmp_path / "in.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in MIXED))
    assert cli_main(["--db", str(db), "ingest", str(data)]) == 0
    assert "6 rows: 6 ok, 0 rejected" in capsys.readouterr().out
    assert cli_main(["--db", str(db), "export", "--format", "trl", str(tmp_path / "p.jsonl")]) == 0
    assert json.loads(capsys.readouterr().out.strip())["rows"] == 2
    data.write_text(json.dumps({**MIXED[0], "winner": "x"}) + "\n")
    assert cli_main(["--db", str(db), "ingest", str(data)]) == 1
    err = capsys.readouterr().err
    assert f"{data}:1: winner: 'x' is not one of a, b, tie" in err and "Traceback" not in err
