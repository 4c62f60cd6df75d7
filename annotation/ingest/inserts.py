"""Bulk writes of one ingest batch, inside its open transaction: staged chunks into prompts,
responses and judgments or feedback, then the copies of ids the store already held dropped.

Part of the store (annotation/store.py opens the transaction and owns the schema); with it, the only
module that writes SQL. Staged tables are read by DuckDB's replacement scan under the names
`_bradley_stage` and `_bradley_responses`, local variables of the function that runs the INSERT.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from pathlib import Path

import duckdb
import pyarrow as pa

from annotation.ingest.spool import Spool, spool_folder

# Staged rows come with their content ids (pid, rid_a/rid_b or rid, jid; given_id), computed by ids.with_ids
# in Python: faster than sha256() in SQL, which needs the chunk in a temp table first; and
# with flags (new_p, new_a, new_b, new_r, new_j) true where the id is the first of its kind in the batch.
_STAGE_PROMPTS = "INSERT INTO prompts (id, text, messages) SELECT pid, prompt, messages FROM _bradley_stage WHERE new_p"
_STAGE_RESPONSES = {
    "judgments": "INSERT INTO responses (id, prompt_id, text, source_model) "
                 "SELECT rid_a, pid, response_a, model_a FROM _bradley_stage WHERE new_a "
                 "UNION ALL SELECT rid_b, pid, response_b, model_b FROM _bradley_stage WHERE new_b",
    "feedback": "INSERT INTO responses (id, prompt_id, text, source_model) "
                "SELECT rid, pid, completion, model FROM _bradley_stage WHERE new_r",
}
_STAGE_ROWS = {
    "judgments": "INSERT INTO judgments (id, prompt_id, response_a, response_b, winner, strength, rater, "
                 "source, batch_id, created_at, rationale, metadata, given_id) SELECT jid, pid, rid_a, rid_b, "
                 "winner, strength, rater, source, $1, created_at, rationale, metadata, given_id "
                 "FROM _bradley_stage WHERE new_j",
    "feedback": "INSERT OR IGNORE INTO feedback (id, prompt_id, response_id, label, rater, batch_id, given_id) "
                "SELECT jid, pid, rid, label, rater, $1, given_id FROM _bradley_stage WHERE new_j",
}
_STAGE_INSERTS = {kind: [_STAGE_PROMPTS, _STAGE_RESPONSES[kind], _STAGE_ROWS[kind]] for kind in _STAGE_ROWS}
# annotation.ingest.spool's stream of new responses (already in the responses table's column order)
_STREAM_RESPONSES = ("INSERT INTO responses (id, prompt_id, text, source_model) "
                     "SELECT id, prompt_id, text, source_model FROM _bradley_responses")
# Later copies of an id. Copies agree on everything the id hashes, so keeping any one is correct; the
# lowest rowid is the oldest (rows of the open transaction number after all committed ones).
_LATER_COPIES = ("SELECT rowid FROM (SELECT rowid, row_number() OVER (PARTITION BY id ORDER BY rowid) AS n "
                 "FROM {table} WHERE {where}) WHERE n > 1")
# $1: the table's highest rowid before the batch, so `rowid > $1` are the batch's rows
_REPEATED = {
    # prompts the batch wrote that were in the store already, or that it wrote twice
    "prompts": "id IN (SELECT id FROM prompts WHERE id IN (SELECT id FROM prompts WHERE rowid > $1) "
               "GROUP BY id HAVING count(*) > 1)",
    # responses of those prompts (a response id hashes its prompt's), then those the batch wrote twice
    "responses": "prompt_id IN (SELECT id FROM _bradley_ids)",
    # ids the batch wrote twice, narrowed by their 64-bit hash (cheaper to group than the strings)
    "responses_in_batch": "rowid > $1 AND hash(id) IN (SELECT hash(id) FROM responses WHERE rowid > $1 "
                          "GROUP BY ALL HAVING count(*) > 1)",
    "judgments_in_batch": "batch_id = $1 AND hash(id) IN (SELECT hash(id) FROM judgments WHERE batch_id = $1 "
                          "GROUP BY ALL HAVING count(*) > 1)",
}
# whether any id of the batch may repeat: rarely, so the DELETE above is usually skipped
_MAY_REPEAT = {"responses": "SELECT count(*) > count(DISTINCT hash(id)) FROM responses WHERE rowid > $1",
               "judgments": "SELECT count(*) > count(DISTINCT hash(id)) FROM judgments WHERE batch_id = $1"}
_DEDUP = {
    "prompts": "DELETE FROM prompts WHERE rowid IN (" + _LATER_COPIES.format(
        table="prompts", where=_REPEATED["prompts"]) + ") RETURNING id",
    "responses": "DELETE FROM responses WHERE rowid IN (" + _LATER_COPIES.format(
        table="responses", where=_REPEATED["responses"]) + ")",
    "responses_in_batch": "DELETE FROM responses WHERE rowid IN (" + _LATER_COPIES.format(
        table="responses", where=_REPEATED["responses_in_batch"]) + ")",
    # the batch's judgments that were in the store before it: joined, so DuckDB hashes the smaller side
    "judgments": "DELETE FROM judgments WHERE batch_id = $1 AND id IN (SELECT o.id FROM judgments o "
                 "JOIN (SELECT id FROM judgments WHERE batch_id = $1) n ON n.id = o.id WHERE o.batch_id <> $1)",
    "judgments_in_batch": "DELETE FROM judgments WHERE rowid IN (" + _LATER_COPIES.format(
        table="judgments", where=_REPEATED["judgments_in_batch"]) + ")",
    # rows of an export written before content ids, whose ids the store's upgrade renamed
    "former": "DELETE FROM judgments WHERE batch_id = $1 AND given_id IN (SELECT former_id FROM former_ids)",
    "former_feedback": "DELETE FROM feedback WHERE batch_id = $1 AND given_id IN (SELECT former_id FROM former_ids)",
}
_MARKS = {"prompts": "SELECT coalesce(max(rowid), -1) FROM prompts",
          "responses": "SELECT coalesce(max(rowid), -1) FROM responses"}


def insert(cur, kind: str, staged: pa.Table, batch_id: str) -> None:
    """Inside an open transaction: write staged judgment or feedback rows and their prompts and
    responses. `staged` has annotation.ingest.formats' columns plus content ids (ids.with_ids)."""
    # Found by name (DuckDB's replacement scan), not register(): a registered table stays pinned
    # until the transaction commits, which held every chunk of a big file in memory at once.
    _bradley_stage = staged  # noqa: F841
    for statement in _STAGE_INSERTS[kind]:
        cur.execute(statement, [batch_id] if "$1" in statement else [])


def insert_stream(cur, kind: str, chunks: Iterator[pa.Table], begin: Callable[[], str],
                  spool_root: Path) -> None:
    """insert() for a whole stream of chunks as one INSERT per table (annotation.ingest.spool says
    why). The chunks' responses stream in first; then `begin()` gives the batch id, and the rest of
    the rows are read back from the spool for prompts and judgments or feedback. An exception raised
    by `chunks` is re-raised here as it was, not as DuckDB's error. The spool goes under
    `spool_root` (spool.spool_folder)."""
    with spool_folder(spool_root) as folder:
        spool = Spool(kind, chunks, folder)
        _bradley_responses = spool.responses()  # noqa: F841 (read by name, as above)
        try:
            cur.execute(_STREAM_RESPONSES)
        except duckdb.Error:
            if spool.error is not None:
                raise spool.error from None
            raise
        if spool.writer is None:  # the stream had no chunk
            return
        batch_id = begin()
        for statement in (_STAGE_PROMPTS, _STAGE_ROWS[kind]):
            _bradley_stage = spool.rest()  # noqa: F841 (read by name, as above)
            cur.execute(statement, [batch_id] if "$1" in statement else [])
        del _bradley_stage  # close the spooled file before its folder goes


@contextmanager
def unordered(cur) -> Iterator[None]:
    """A batch's INSERTs on all DuckDB's threads, their rows stored in any order (nothing reads rows
    in insertion order: queries order by batch and id). Around the transaction, not in it: an
    aborted transaction refuses even the SET that restores the setting."""
    cur.execute("SET preserve_insertion_order = false")
    try:
        yield
    finally:
        cur.execute("SET preserve_insertion_order = true")


def row_marks(cur) -> dict[str, int]:
    """The highest rowid of prompts and responses when a batch begins: the batch's rows number above."""
    return {table: cur.execute(query).fetchone()[0] for table, query in _MARKS.items()}


def drop_earlier_ids(cur, batch_id: str, marks: dict[str, int], own_ids: bool,
                     forgot: Collection[str] = ()) -> None:
    """Inside the batch's transaction, after its rows: drop the rows it wrote whose id was in the
    store before it, and (for the tables in `forgot`, seen.SeenIds) the later copies it wrote itself.
    Only responses of a prompt that was there before can have been (a response id hashes its prompt).
    A judgment stored before by any route has the same id; one whose row carried its own id
    (`own_ids`) may also come from an export written before the store's ids were content ids
    (former_ids). `marks` is row_marks() from the batch's start."""
    again = [row[0] for row in cur.execute(_DEDUP["prompts"], [marks["prompts"]]).fetchall()]
    if again:
        cur.register("_bradley_ids", pa.table({"id": pa.array(again, pa.string())}))
        try:
            cur.execute(_DEDUP["responses"])
        finally:
            cur.unregister("_bradley_ids")
    if "responses" in forgot and cur.execute(_MAY_REPEAT["responses"], [marks["responses"]]).fetchone()[0]:
        cur.execute(_DEDUP["responses_in_batch"], [marks["responses"]])
    cur.execute(_DEDUP["judgments"], [batch_id])
    if "judgments" in forgot and cur.execute(_MAY_REPEAT["judgments"], [batch_id]).fetchone()[0]:
        cur.execute(_DEDUP["judgments_in_batch"], [batch_id])
    if own_ids:
        cur.execute(_DEDUP["former"], [batch_id])
        cur.execute(_DEDUP["former_feedback"], [batch_id])
