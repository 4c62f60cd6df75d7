"""What a new user tripped over in ingest and report: a 5,000-digit number stopped a multi-file ingest
with Python's own message, a rater of spaces was stored as `human:   `, a UTF-8 BOM read differently
by the row-by-row reader, and every report recorded a new snapshot of unchanged data."""

from __future__ import annotations

import json

import duckdb
import pytest

from annotation.ingest.batch import IngestError, ingest_file, ingest_records
from annotation.ingest.readers import open_parts
from service.cli.main import main

ROW = {"prompt": "2+2?", "response_a": "4", "response_b": "5", "winner": "a", "rater": "alice"}
HUGE = "7" * 5000


def jsonl(path, rows: list[str]):
    path.write_text("".join(r + "\n" for r in rows))
    return str(path)


@pytest.fixture
def files(tmp_path):
    good = json.dumps(ROW)
    return [jsonl(tmp_path / "huge.jsonl", [good, good.replace('"rater": "alice"', f'"strength": {HUGE}')]),
            str(tmp_path / "huge.json"),
            jsonl(tmp_path / "fine.jsonl", [json.dumps({**ROW, "prompt": "3+3?"})])]


def test_a_huge_integer_is_a_bad_row_named_by_file_line_and_field(files, tmp_path, capsys):
    with open(files[1], "w") as f:
        f.write(f'[{json.dumps(ROW)[:-1]}, "id": {HUGE}}}]')
    db = str(tmp_path / "s.duckdb")
    assert main(["--db", db, "ingest", *files]) == 1  # abort mode: the bad files write nothing
    err = capsys.readouterr().err
    assert f"{files[0]}:2: strength: a number of 5,000 digits" in err
    assert f"{files[1]}:1: id: a number of 5,000 digits" in err
    assert "Traceback" not in err and "set_int_max_str_digits" not in err
    assert duckdb.connect(db, read_only=True).execute("SELECT count(*) FROM judgments").fetchone()[0] == 1


def test_skip_mode_rejects_the_huge_integer_and_goes_on(files, tmp_path, capsys):
    with open(files[1], "w") as f:
        f.write(f"[{json.dumps(ROW)}]")
    db = str(tmp_path / "s.duckdb")
    assert main(["--db", db, "ingest", "--on-error", "skip", *files]) == 0
    con = duckdb.connect(db, read_only=True)
    assert con.execute("SELECT count(*) FROM judgments").fetchone()[0] == 2
    assert con.execute("SELECT line, reason FROM rejects").fetchall() == [
        (2, "strength: a number of 5,000 digits, more than any field takes; fix the value in the source")]


@pytest.mark.parametrize("rater", ["   ", " \u00a0 ", "human:  ", "ai: ", "\u3000"])
def test_a_rater_of_spaces_is_refused_by_both_paths(store, tmp_path, rater):
    rows = [ROW, {**ROW, "rater": rater, "prompt": "3+3?"}]
    path = tmp_path / "r.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    for ingest in (lambda: ingest_file(store, path), lambda: ingest_records(store, rows)):
        with pytest.raises(IngestError) as info:
            ingest()
        assert info.value.field == "rater" and ":2: rater:" in info.value.errors[0]
        assert "only spaces" in info.value.errors[0]
    assert store.counts()["judgments"] == 0


@pytest.mark.parametrize("name,text", [
    ("bom.jsonl", "".join(json.dumps({**ROW, "prompt": f"q{i}"}) + "\n" for i in range(3))),
    ("bom.json", json.dumps([{**ROW, "prompt": f"q{i}"} for i in range(3)])),
    ("bom.csv", "prompt,response_a,response_b,winner\n" + "".join(f"q{i},4,5,a\n" for i in range(3))),
])
def test_a_utf8_bom_reads_the_same_row_by_row_as_in_columns(store, tmp_path, name, text):
    path = tmp_path / name
    path.write_bytes(b"\xef\xbb\xbf" + text.encode())
    records = [r for part in open_parts(str(path)) for r in part.records()]  # --server's reader
    assert [r.problem for r in records] == [None] * 3
    assert [r.value["prompt"] for r in records] == ["q0", "q1", "q2"]
    assert ingest_file(store, path).rows_ok == 3


def test_report_reuses_its_snapshot_until_the_data_changes(tmp_path, capsys):
    db = str(tmp_path / "s.duckdb")
    assert main(["--db", db, "ingest", jsonl(tmp_path / "a.jsonl", [json.dumps(ROW)])]) == 0
    ids = []
    for _ in range(2):
        assert main(["--db", db, "report", "--json", str(tmp_path / "r.json")]) == 0
        ids.append(json.loads((tmp_path / "r.json").read_text())["snapshot_id"])
    assert main(["--db", db, "report", "--raters", "human", "--json", str(tmp_path / "h.json")]) == 0
    human = json.loads((tmp_path / "h.json").read_text())["snapshot_id"]
    assert main(["--db", db, "ingest", jsonl(tmp_path / "b.jsonl", [json.dumps({**ROW, "prompt": "3+3?"})])]) == 0
    assert main(["--db", db, "report", "--json", str(tmp_path / "r.json")]) == 0
    ids.append(json.loads((tmp_path / "r.json").read_text())["snapshot_id"])
    assert ids[0] == ids[1] != ids[2] and human not in ids
    con = duckdb.connect(db, read_only=True)
    assert con.execute("SELECT count(*) FROM snapshots").fetchone()[0] == 3
