"""The real data sets of ../shared/data: every row accounted for, every vote and rater kept."""

from __future__ import annotations

import gzip
import json
from collections import Counter

import pytest

from annotation.ingest.batch import IngestError, ingest_file

HH = "hh-rlhf/harmless-base-test.jsonl.gz"
MTBENCH = "mtbench_human/mtbench_turn1_judgments.jsonl.gz"


def read_jsonl(path):
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        return [json.loads(line) for line in fh]


def shared_prompt_ok(row) -> bool:
    """Independent of ingest: do both transcripts agree up to chosen's last assistant marker?"""
    head = row["chosen"].rsplit("\n\nAssistant:", 1)[0]
    return row["rejected"].rsplit("\n\nAssistant:", 1)[0] == head and row["chosen"] != row["rejected"]


def test_hh_rlhf_every_row_accounted_for(store, shared_data):
    path = shared_data / HH
    rows = read_jsonl(path)
    assert len(rows) == 2312
    bad_lines = [i for i, r in enumerate(rows, 1) if not shared_prompt_ok(r)]
    with pytest.raises(IngestError) as info:
        ingest_file(store, path)
    assert [int(e.split(":")[-3]) for e in info.value.errors] == bad_lines
    assert store.counts()["judgments"] == 0

    result = ingest_file(store, path, on_error="skip")
    assert result.rows_in == 2312
    assert result.rows_ok + result.rows_rejected == 2312
    assert result.rows_rejected == len(bad_lines) == 5
    rejects = store.rejects(result.batch_id)
    assert [line for line, _, _ in rejects] == bad_lines
    assert all(reason.startswith("rejected: the transcript differs") for _, reason, _ in rejects)
    assert json.loads(rejects[0][2]) == rows[bad_lines[0] - 1]  # the raw row is kept

    first = store.con.execute("SELECT count(*) FROM judgments WHERE winner = 'a'").fetchone()[0]
    assert first == result.rows_ok  # chosen is response_a and wins, for every pair
    sample = rows[0]
    cut = sample["chosen"].rfind("\n\nAssistant:") + len("\n\nAssistant:")
    got = store.con.execute(
        "SELECT r.text FROM judgments j JOIN prompts p ON p.id = j.prompt_id "
        "JOIN responses r ON r.id = j.response_a WHERE p.text = ?", [sample["chosen"][:cut]]).fetchall()
    assert (sample["chosen"][cut + 1:],) in got


def test_mtbench_every_vote_kept_with_its_rater(store, shared_data):
    path = shared_data / MTBENCH
    rows = read_jsonl(path)
    result = ingest_file(store, path)
    assert (result.rows_in, result.rows_ok, result.rows_rejected) == (1502, 1502, 0)
    table = store.judgments()
    assert Counter(table.column("rater").to_pylist()) == Counter(r["rater"] for r in rows)
    assert sum(1 for r in rows if r["rater"].startswith("human:")) == 882
    assert len({r["rater"] for r in rows if r["rater"].startswith("human:")}) == 65
    assert Counter(table.column("winner").to_pylist()) == Counter(r["winner"] for r in rows)
    meta = [json.loads(m) for m in table.column("metadata").to_pylist()]
    keys = ("question_id", "model_a", "model_b")
    assert Counter(tuple(m[k] for k in keys) for m in meta) == Counter(tuple(r[k] for k in keys)
                                                                       for r in rows)
    # a response's source_model is one of the models that wrote that text
    for m, a in zip(meta, table.column("model_a").to_pylist(), strict=False):
        assert a == m["model_a"] or a in {r["model_b"] for r in rows}
    same_text = sum(r["response_a"] == r["response_b"] for r in rows)
    assert same_text == 13 and store.verdict_arrays().num_rows == 1502 - same_text
