"""Upgrades of a store made by an older bradley, one schema version at a time (Store opens with them).

Version 2: judgment and feedback ids from their content (annotation/ids.py) instead of the batch that
brought them. Version 1 gave a row without an id of its own `content_id(batch sha256, row number)`,
so the same judgment ingested by two routes (a file and its .gz, a file and HTTP) was stored twice.
The upgrade tells those generated ids from a row's own (a generated id is one of its batch's
`content_id(sha256, n)`), keeps the own ones as `given_id`, recomputes every id with schema.sql's
`judgment_id` / `feedback_id`, keeps the copy of each new id from the earliest batch and deletes the
rest, renames the ids in `retractions` and the Label Studio ledger, and records former ids in
`former_ids` so an export written before the upgrade adds nothing when ingested again. Nothing but
the later copies is removed; batches keep their counts as ingested.
"""

from __future__ import annotations

from collections.abc import Callable

# Version 1's generated ids: content_id(batch sha256, n) for the batch's row numbers (ingest counts
# from 1; simulate.store_tables counted from 0).
_GENERATED = """
CREATE OR REPLACE TEMP TABLE _bradley_generated AS
    SELECT left(sha256(sha256 || chr(31) || CAST(n AS VARCHAR)), 24) AS id
    FROM (SELECT sha256, unnest(range(0, rows_in + 1)) AS n FROM batches)"""
_GIVEN = "UPDATE {table} SET given_id = id WHERE id NOT IN (SELECT id FROM _bradley_generated)"
# Each row's new id, and which copy of it the row is (1: the earliest batch's, which stays).
_RENAMED = """
CREATE OR REPLACE TEMP TABLE _bradley_renamed AS
    SELECT t.rowid AS row, t.id AS former_id, t.given_id, n.id,
           row_number() OVER (PARTITION BY n.id ORDER BY b.seq NULLS LAST, t.rowid) AS copy
    FROM {table} t LEFT JOIN batches b ON b.id = t.batch_id, LATERAL (SELECT {new_id} AS id) n"""
NEW_IDS = {
    "judgments": "judgment_id(t.rater, t.response_a, t.response_b, t.winner, t.strength, t.created_at, "
                 "t.metadata, t.given_id)",
    "feedback": "feedback_id(t.rater, t.response_id, t.label, t.given_id)",
}
_FORMER = ("INSERT INTO former_ids SELECT former_id, id FROM _bradley_renamed "
           "WHERE given_id IS NULL AND former_id <> id")
_MERGE = "DELETE FROM {table} WHERE rowid IN (SELECT row FROM _bradley_renamed WHERE copy > 1)"
_RENAME = ("UPDATE {table} SET id = r.id FROM _bradley_renamed r "
           "WHERE {table}.rowid = r.row AND r.copy = 1 AND {table}.id <> r.id")
_RETRACTIONS = ("UPDATE retractions SET judgment_id = r.id FROM _bradley_renamed r "
                "WHERE retractions.judgment_id = r.former_id")
_LEDGER = """
UPDATE ls_annotations SET judgment_ids = renamed.ids FROM (
    SELECT a.annotation_id, list(coalesce(r.id, a.jid) ORDER BY a.pos) AS ids
    FROM (SELECT annotation_id, unnest(judgment_ids) AS jid, generate_subscripts(judgment_ids, 1) AS pos
          FROM ls_annotations) a
    LEFT JOIN _bradley_renamed r ON r.former_id = a.jid
    GROUP BY a.annotation_id) renamed
WHERE ls_annotations.annotation_id = renamed.annotation_id"""


def to_content_ids(con) -> str:
    """Version 1 → 2, inside the caller's transaction; returns what it did, in a line."""
    con.execute("ALTER TABLE judgments ADD COLUMN given_id VARCHAR")
    con.execute("ALTER TABLE feedback ADD COLUMN given_id VARCHAR")
    con.execute(_GENERATED)
    merged = {}
    for table in ("judgments", "feedback"):
        con.execute(_GIVEN.format(table=table))
        con.execute(_RENAMED.format(table=table, new_id=NEW_IDS[table]))
        con.execute(_FORMER)
        if table == "judgments":
            con.execute(_RETRACTIONS)
            con.execute(_LEDGER)
        merged[table] = con.execute(_MERGE.format(table=table)).fetchone()[0]
        con.execute(_RENAME.format(table=table))
    con.execute("DROP TABLE _bradley_renamed")
    con.execute("DROP TABLE _bradley_generated")
    return (f"judgment and feedback ids now come from their content: {merged['judgments']:,} "
            f"judgments and {merged['feedback']:,} feedback rows stored again by another route "
            "were merged into the first copy")


# version -> the upgrade from version - 1, run inside one transaction. Append; never edit a shipped one.
MIGRATIONS: dict[int, Callable] = {2: to_content_ids}
