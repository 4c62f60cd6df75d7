"""Hostile input files: values that used to be stored although they mean nothing (a list or a
number as rater, a strength that is no Bradley-Terry margin), and files whose failure printed a
library's message alone (or a traceback, or crashed pyarrow) without naming the file or line."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from annotation.ingest.batch import IngestError, ingest_file, ingest_records
from annotation.store import Store
from service.cli import main as cli

ROOT = Path(__file__).resolve().parents[3]
GOOD = {"prompt": "Which is better?", "response_a": "this one", "response_b": "that one",
        "winner": "a", "rater": "human:1"}


def rows(n: int = 4, **change) -> list[dict]:
    out = [{**GOOD, "response_a": f"answer {i}"} for i in range(n)]
    out[2] = {**out[2], **change}
    return out


def write_jsonl(path: Path, items: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in items))
    return path


# --- item 5: rater and strength -----------------------------------------------------------------

BAD_VALUES = [
    ({"rater": ["x"]}, "rater: expected text such as human:alice or ai:model:constitution, got list"),
    ({"rater": 7}, "rater: expected text such as human:alice or ai:model:constitution, got int"),
    ({"rater": "human:"}, "rater: 'human:' is not a rater id"),
    ({"rater": "alice\nbob"}, "rater: 'alice\\nbob' is not a rater id"),
    ({"strength": 1e308}, "strength: 1e+308 is outside 0..10 (a Bradley-Terry margin in logits)"),
    ({"strength": -5}, "strength: -5 is outside 0..10 (a Bradley-Terry margin in logits)"),
    ({"strength": "11"}, "strength: 11 is outside 0..10 (a Bradley-Terry margin in logits)"),
]


@pytest.mark.parametrize(("change", "message"), BAD_VALUES)
def test_bad_rater_or_strength_is_refused_by_field_on_both_paths(store, tmp_path, change, message):
    with pytest.raises(IngestError) as http:  # row by row (an HTTP upload)
        ingest_records(store, rows(**change))
    assert http.value.errors[0].startswith(f"http:3: {message}")
    path = write_jsonl(tmp_path / "bad.jsonl", rows(**change))  # a file: the columnar path first
    with pytest.raises(IngestError) as file:
        ingest_file(store, path)
    assert len(file.value.errors) == 1 and file.value.errors[0].startswith(f"{path}:3: {message}")
    assert store.counts()["judgments"] == 0


def test_columnar_path_refuses_a_parquet_column_of_integer_raters(store, tmp_path):
    path = tmp_path / "raters.parquet"
    pq.write_table(pa.Table.from_pylist([{**r, "rater": i} for i, r in enumerate(rows())]), path)
    with pytest.raises(IngestError) as info:
        ingest_file(store, path)
    assert info.value.errors[0] == (f"{path}:1: rater: expected text such as human:alice or "
                                    "ai:model:constitution, got int")


def test_margins_inside_the_range_are_kept_alike_on_both_paths(store, tmp_path):
    values = [0, 10, "2.5", None]
    items = [{**r, "strength": v} for r, v in zip(rows(), values, strict=True)]
    ingest_file(store, write_jsonl(tmp_path / "ok.jsonl", items))
    ingest_records(store, [{**r, "prompt": "Another?"} for r in items])
    stored = store.con.execute("SELECT strength FROM judgments ORDER BY prompt_id, response_a").fetchall()
    assert sorted((s[0] for s in stored), key=lambda v: (v is None, v)) == [0, 0, 2.5, 2.5, 10, 10,
                                                                            None, None]


# --- item 6: files that cannot be read, named by file and line -------------------------------------


def _bad_files(tmp: Path) -> dict[str, tuple[Path, str]]:
    """name -> (file, the start of its error line)."""
    lines = [json.dumps({**GOOD, "response_a": f"x{i}"}) for i in range(3)]
    head = "\n".join(lines[:2]) + "\n"
    out = {}
    path = tmp / "latin1.jsonl"
    path.write_bytes(head.encode() + b'{"prompt": "caf\xe9", "response_a": "x", "response_b": "y", "winner": "a"}\n')
    out["bad utf-8"] = path, f"{path}:3: encoding: not valid UTF-8 (byte 0xe9 at column 16)"
    path = tmp / "latin1.csv"
    path.write_bytes(b"prompt,response_a,response_b,winner\nq,x,y,a\ncaf\xe9,x,y,a\n")
    out["bad utf-8 csv"] = path, f"{path}:3: prompt: not valid UTF-8 text"
    path = tmp / "surrogate.jsonl"
    path.write_text(head + '{"prompt": "q", "response_a": "half \\ud800", "response_b": "y", "winner": "a"}\n')
    out["lone surrogate"] = path, f"{path}:3: response_a: holds a lone surrogate such as \\ud800"
    path = tmp / "cut.jsonl.gz"
    data = gzip.compress(("\n".join(lines * 400) + "\n").encode())
    path.write_bytes(data[: len(data) // 2])
    out["truncated gz"] = path, f"{path}:"  # the line where the stream ends, then the problem
    path = tmp / "cut.parquet"
    pq.write_table(pa.Table.from_pylist([GOOD] * 5), path)
    path.write_bytes(path.read_bytes()[:-12])
    out["corrupt parquet footer"] = path, f"{path}: file: cannot be read: Parquet magic bytes not found"
    return out


@pytest.mark.parametrize("case", ["bad utf-8", "bad utf-8 csv", "lone surrogate", "truncated gz",
                                  "corrupt parquet footer"])
def test_cli_names_the_file_and_line_and_writes_nothing_from_it(tmp_path, capsys, case):
    bad, start = _bad_files(tmp_path)[case]
    good = write_jsonl(tmp_path / "good.jsonl", rows())
    db = tmp_path / "s.duckdb"
    status = cli.main(["--db", str(db), "ingest", str(good), str(bad)])
    err = capsys.readouterr().err
    assert status == 1
    assert err.startswith(start), err
    assert "Traceback" not in err and err.rstrip().endswith("nothing written")
    with Store(db) as store:
        assert [s for (s,) in store.con.execute("SELECT source FROM batches").fetchall()] == [str(good)]
    assert not Path(f"{db}.spool").exists()  # the spool of a failed columnar pass is gone too
    if case == "truncated gz":
        assert "the .gz file is truncated" in err


def test_deeply_nested_line_is_a_bad_row_not_a_crash(tmp_path):
    """50,000 levels: Python's parser raised RecursionError; pyarrow's overflowed its stack."""
    deep = {**GOOD}
    path = tmp_path / "deep.jsonl"
    path.write_text(json.dumps(GOOD) + "\n" + json.dumps(deep)[:-1] + ', "metadata": '
                    + "[" * 50_000 + "]" * 50_000 + "}\n")
    cmd = [sys.executable, "-m", "service.cli", "--db", str(tmp_path / "d.duckdb"), "ingest", str(path)]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 1, done.stderr[-2000:]
    assert done.stderr.startswith(f"{path}:2: json: nested too deeply"), done.stderr[-2000:]
    assert "Traceback" not in done.stderr


def test_unreadable_file_writes_nothing_even_when_skipping(store, tmp_path):
    bad, _ = _bad_files(tmp_path)["truncated gz"]
    with pytest.raises(IngestError) as info:
        ingest_file(store, bad, on_error="skip")
    assert info.value.field == "file" and store.counts()["judgments"] == 0


def test_upload_with_a_lone_surrogate_is_a_bad_row_not_a_crash(store):
    """An HTTP body parsed by Python's json holds "\\ud800" as a lone surrogate: it used to fail the
    body's sha256 (UnicodeEncodeError, a 500) before any row was checked."""
    items = rows()
    items[1] = {**items[1], "response_b": "half \ud800"}
    with pytest.raises(IngestError) as info:
        ingest_records(store, items)
    assert info.value.errors[0].startswith("http:2: response_b: holds a lone surrogate")
    result = ingest_records(store, items, on_error="skip")
    assert (result.rows_ok, result.rows_rejected) == (3, 1)
