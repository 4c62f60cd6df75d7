"""The store: content ids, the pairs view, snapshots, batches and schema versioning."""

from __future__ import annotations

import hashlib

import pyarrow as pa
import pytest

from annotation.ids import content_id, prompt_id, response_id, with_ids
from annotation.ingest.batch import ingest_records
from annotation.ingest.formats import JUDGMENT_SCHEMA
from annotation.store import SCHEMA_VERSION, Store, StoreError


def test_content_id_is_sha256_of_unit_separated_parts():
    expected = hashlib.sha256(b"What is 2+2?\x1f4").hexdigest()[:24]
    assert content_id("What is 2+2?", "4") == expected == response_id("What is 2+2?", "4")
    assert prompt_id([{"role": "user", "content": "hi"}]) == content_id('[{"content":"hi","role":"user"}]')


def test_sql_expression_equals_content_id(store):
    row = store.con.execute("SELECT left(sha256(concat_ws(chr(31), ?, ?)), 24)", ["p", "é"]).fetchone()
    assert row[0] == content_id("p", "é")


def test_with_ids_uses_content_ids_for_prompts_responses_and_judgments():
    staged = pa.Table.from_pylist(
        [{"row": 7, "id": None, "prompt": "p", "messages": None, "response_a": "x", "response_b": "y",
          "winner": "a", "rater": "human:1", "source": "judgments"}], schema=JUDGMENT_SCHEMA)
    ids = with_ids("judgments", staged).to_pylist()[0]
    assert ids["pid"] == prompt_id("p")
    assert (ids["rid_a"], ids["rid_b"]) == (response_id("p", "x"), response_id("p", "y"))
    assert ids["jid"] == content_id("human:1", ids["rid_a"], ids["rid_b"], "a", "", "", "", "", "")
    assert ids["given_id"] is None


def _votes(store, votes):
    rows = [{"prompt": "q", "response_a": a, "response_b": b, "winner": w, "rater": f"human:{i}"}
            for i, (a, b, w) in enumerate(votes)]
    return ingest_records(store, rows, fmt="judgments")


def test_pairs_view_majority_votes_ties_and_soft_label(store):
    # x beats y twice (once shown second), one tie: p = (2 + 0.5) / 3
    _votes(store, [("x", "y", "a"), ("y", "x", "b"), ("x", "y", "tie"), ("x", "z", "b")])
    pairs = {(p["chosen"], p["rejected"]): p for p in store.pairs().to_pylist()}
    xy = pairs[("x", "y")]
    assert (xy["votes_chosen"], xy["votes_rejected"], xy["ties"], xy["n_votes"]) == (2, 0, 1, 3)
    assert xy["p_chosen"] == pytest.approx(2.5 / 3)
    assert pairs[("z", "x")]["p_chosen"] == 1.0


def test_self_comparisons_are_kept_as_votes_but_not_as_pairs(store):
    _votes(store, [("same", "same", "tie"), ("x", "y", "a")])
    assert store.counts()["judgments"] == 2
    assert store.judgments().num_rows == 2
    assert store.pairs().num_rows == 1
    assert store.verdict_arrays().num_rows == 1


def test_snapshot_reads_exactly_the_batches_before_it(store):
    _votes(store, [("x", "y", "a")])
    snap = store.create_snapshot()
    _votes(store, [("x", "y", "b"), ("x", "w", "b")])
    assert store.judgments(snap).num_rows == 1
    assert store.pairs(snap).to_pylist()[0]["chosen"] == "x"
    assert store.judgments().num_rows == 3
    with pytest.raises(StoreError, match="not found"):
        store.judgments("no-such-snapshot")


def test_rater_filter(store):
    ingest_records(store, [{"prompt": "q", "response_a": "x", "response_b": "y", "winner": "a",
                            "rater": "ai:judge:c1"},
                           {"prompt": "q", "response_a": "x", "response_b": "y", "winner": "b",
                            "rater": "bob"}])
    assert store.judgments(raters="ai").column("rater").to_pylist() == ["ai:judge:c1"]
    assert store.judgments(raters="human").column("rater").to_pylist() == ["human:bob"]


def test_batches_record_counts_and_sha(store):
    result = ingest_records(store, [{"prompt": "q", "response_a": "x", "response_b": "y",
                                     "winner": "a"}, {"prompt": "q"}], on_error="skip")
    batch = store.con.execute("SELECT rows_in, rows_ok, rows_rejected FROM batches WHERE id = ?",
                              [result.batch_id]).fetchone()
    assert batch == (2, 1, 1)
    assert store.rejects(result.batch_id)[0][:2] == (2, "winner: missing; expected a, b or tie")


def test_write_batch_keeps_working(store):
    info = store.write_batch("manual", "0" * 64, 1, {"prompts": pa.table({"id": ["p1"], "text": ["q"]})})
    assert store.find_batch("0" * 64).id == info.id
    assert store.counts()["prompts"] == 1


def test_newer_schema_version_is_refused(tmp_path):
    path = tmp_path / "new.duckdb"
    with Store(path) as store:
        store.con.execute("UPDATE schema_version SET version = ?", [SCHEMA_VERSION + 1])
    with pytest.raises(StoreError, match="upgrade bradley"):
        Store(path)


def test_reopen_keeps_data(tmp_path):
    path = tmp_path / "s.duckdb"
    with Store(path) as store:
        _votes(store, [("x", "y", "a")])
    with Store(path, read_only=True) as store:
        assert store.counts()["judgments"] == 1
        assert store.schema_version() == SCHEMA_VERSION


def test_ref_logps_round_trip_keeps_the_first_value_per_key(store):
    store.put_ref_logps("m", "t", [("r1", -2.302585, 3), ("r2", -0.5, 1)])
    store.put_ref_logps("m", "t", [("r1", -9.0, 9), ("r3", -1.25, 2)])  # r1 again: ignored
    store.put_ref_logps("other-model", "t", [("r1", -7.0, 4)])
    store.put_ref_logps("m", "t", [])
    assert store.ref_logps("m", "t", ["r1", "r2", "r3", "r4"]) == {
        "r1": (-2.302585, 3), "r2": (-0.5, 1), "r3": (-1.25, 2)}
    assert store.ref_logps("other-model", "t", ["r1", "r2"]) == {"r1": (-7.0, 4)}
    assert store.ref_logps("m", "other-template", ["r1"]) == {}
