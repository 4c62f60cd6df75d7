"""A store made before judgment ids came from content (fixtures/store_v1.duckdb.gz, written by bradley
4b84b1a: hh-rlhf stored three times and MT-Bench twice by different routes; fixtures/README.md says
how) opens, is upgraded once, and reports what it merged; nothing else is lost."""

from __future__ import annotations

import gzip
import json
import logging
import shutil
from pathlib import Path

import pytest

from annotation.export import export
from annotation.ingest.batch import ingest_file, ingest_records
from annotation.store import SCHEMA_VERSION, Store

FIXTURE = Path(__file__).with_name("fixtures") / "store_v1.duckdb.gz"
# What the fixture holds once each judgment is one row: 120 hh pairs, 120 MT-Bench votes, the
# hand-written rows (six with ids of their own, two with times of their own, two identical rows
# that become one), three Label Studio judgments (one retracted by an edit); five KTO rows.
JUDGMENTS, FEEDBACK = 120 + 120 + 9 + 3, 5


@pytest.fixture
def old_store(tmp_path) -> Path:
    path = tmp_path / "old.duckdb"
    with gzip.open(FIXTURE) as src, open(path, "wb") as dst:
        shutil.copyfileobj(src, dst)
    return path


def read(path, query: str):
    import duckdb

    con = duckdb.connect(str(path), read_only=True)
    try:
        return con.execute(query).fetchall()
    finally:
        con.close()


def test_the_fixture_is_a_version_1_store_with_duplicates(old_store):
    assert read(old_store, "SELECT max(version) FROM schema_version") == [(1,)]
    assert read(old_store, "SELECT count(*) FROM judgments") == [(617,)]
    assert read(old_store, "SELECT max(n_votes) FROM pairs WHERE prompt_id IN (SELECT prompt_id "
                           "FROM judgments WHERE source = 'hh')") == [(3,)]  # hh, three routes


def test_opening_merges_the_copies_and_says_how_many(old_store, caplog):
    with caplog.at_level(logging.WARNING, logger="bradley.store"), Store(old_store) as store:
        assert store.schema_version() == SCHEMA_VERSION == 2
        counts = store.counts()
        assert (counts["judgments"], counts["feedback"]) == (JUDGMENTS, FEEDBACK)
        assert (counts["prompts"], counts["responses"], counts["batches"], counts["snapshots"]) == \
               (140, 321, 12, 2)  # nothing but copies removed
        assert store.migrated == [m for (m,) in store.con.execute("SELECT summary FROM migrations").fetchall()]
        hh_votes = store.con.execute("SELECT max(n_votes) FROM pairs WHERE prompt_id IN (SELECT prompt_id "
                                     "FROM judgments WHERE source = 'hh')").fetchone()[0]
    assert hh_votes == 1
    assert "365 judgments and 5 feedback rows" in store.migrated[0]  # 617 judgments, 10 feedback before
    assert "365 judgments" in caplog.text
    with Store(old_store) as again:  # upgraded once
        assert again.migrated == [] and again.counts()["judgments"] == JUDGMENTS


def test_ids_repeats_retractions_and_the_label_studio_ledger_survive(old_store):
    with Store(old_store) as store:
        assert store.con.execute(
            "SELECT count(*) FROM judgments WHERE id <> judgment_id(rater, response_a, response_b, winner, "
            "strength, created_at, metadata, given_id)").fetchone()[0] == 0
        given = store.con.execute("SELECT list(given_id ORDER BY given_id) FROM judgments "
                                  "WHERE given_id LIKE 'r_'").fetchone()[0]
        assert given == [f"r{i}" for i in range(6)]  # repeats that said so, kept
        times = store.con.execute("SELECT count(*) FROM judgments WHERE rater = 'human:bob'").fetchone()[0]
        assert times == 2
        # the edited Label Studio annotation: its old verdict stays retracted, the ledger names live rows
        assert store.con.execute("SELECT count(*) FROM retractions r JOIN judgments j "
                                 "ON j.id = r.judgment_id").fetchone()[0] == 1
        ledger = store.con.execute("SELECT flatten(list(judgment_ids)) FROM ls_annotations").fetchone()[0]
        live = {r[0] for r in store.con.execute("SELECT id FROM judgments").fetchall()}
        assert len(ledger) == 2 and set(ledger) <= live
        assert store.judgments().num_rows == JUDGMENTS - 1


OLD_EXPORT = """
    SELECT j.id, p.text AS prompt, ra.text AS response_a, rb.text AS response_b, j.winner, j.strength,
           j.rater, j.source, j.metadata, strftime(j.created_at, '%Y-%m-%dT%H:%M:%S.%f') AS created_at
    FROM judgments j JOIN prompts p ON p.id = j.prompt_id
    JOIN responses ra ON ra.id = j.response_a JOIN responses rb ON rb.id = j.response_b"""


def test_after_the_upgrade_the_same_data_by_any_route_adds_nothing(old_store, tmp_path):
    # what `bradley export --format jsonl` wrote from the store before the upgrade: the old ids
    names = ("id", "prompt", "response_a", "response_b", "winner", "strength", "rater", "source", "metadata",
             "created_at")
    old_rows = [dict(zip(names, row, strict=True)) for row in read(old_store, OLD_EXPORT)]
    for row in old_rows:
        row["metadata"] = json.loads(row["metadata"]) if row["metadata"] else None
    old_export = tmp_path / "old_export.jsonl"
    old_export.write_text("".join(json.dumps(r) + "\n" for r in old_rows))
    with Store(old_store, read_only=True) as store:  # a read-only open upgrades it first
        assert store.schema_version() == SCHEMA_VERSION and store.counts()["judgments"] == JUDGMENTS
    with Store(old_store) as store:
        assert ingest_file(store, old_export).rows_ok == 0
        export(store, "jsonl", tmp_path / "new_export.jsonl")
        assert ingest_file(store, tmp_path / "new_export.jsonl").rows_ok == 0
        lines = [json.loads(line) for line in (tmp_path / "new_export.jsonl").read_text().splitlines()]
        hh = [{k: r[k] for k in ("prompt", "response_a", "response_b", "winner")}
              for r in lines if r["source"] == "hh"]
        assert len(hh) == 120
        assert ingest_records(store, hh, source="http:/judgments").rows_ok == 0
        assert store.counts()["judgments"] == JUDGMENTS
