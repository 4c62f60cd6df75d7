"""The preference store: one DuckDB file, the schema in schema.sql, and every SQL statement of bradley.

Nothing outside this module, annotation/ingest/inserts.py (an ingest batch's bulk writes) and annotation/label_studio/ledger.py
(the Label Studio tables) writes SQL. Every query is parameterized; table names never come from input.

    >>> store = Store(":memory:")
    >>> store.schema_version()
    2
"""

from __future__ import annotations

import json
import logging
import re
import uuid
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import duckdb
import pyarrow as pa

from annotation.ids import canonical_json
from annotation.migrations import MIGRATIONS
from annotation.snapshots import RATER_KINDS, SnapshotQueries, rater_prefix  # noqa: F401 (re-exported)
from annotation.store_errors import StoreError, StoreLockedError, locked_by  # noqa: F401 (callers import the errors from here too)

SCHEMA_PATH = Path(__file__).with_name("schema.sql")
SCHEMA_VERSION = 2
log = logging.getLogger("bradley.store")

TABLES = ("prompts", "responses", "judgments", "feedback", "batches", "rejects",
          "snapshots", "models", "ref_logps")


@dataclass
class BatchInfo:
    id: str
    seq: int
    source: str
    sha256: str
    rows_in: int
    rows_ok: int
    rows_rejected: int


class Store(SnapshotQueries):
    """One connection to one DuckDB file. Threads use `cursor()`; writes go through `write_batch`.
    Snapshot queries live in annotation/snapshots.py."""

    def __init__(self, path: str | Path = "bradley.duckdb", read_only: bool = False):
        self.path = str(path)
        self.migrated: list[str] = []  # what opening this store upgraded, a line per version
        self.con = _connect(self.path, read_only)
        if not read_only:
            self._migrate()
        elif (self._stored_version() or SCHEMA_VERSION) < SCHEMA_VERSION:  # an old store read first: upgrade it
            self.con.close()
            with Store(self.path) as upgraded:
                self.migrated = upgraded.migrated
            self.con = _connect(self.path, read_only)

    # -- lifecycle -----------------------------------------------------------------------------

    def close(self) -> None:
        self.con.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def cursor(self) -> duckdb.DuckDBPyConnection:
        """A cursor for another thread (DuckDB connections are not shared across threads)."""
        return self.con.cursor()

    @contextmanager
    def transaction(self, con: duckdb.DuckDBPyConnection | None = None) -> Iterator:
        con = con or self.con
        con.execute("BEGIN TRANSACTION")
        try:
            yield con
        except BaseException:
            con.execute("ROLLBACK")
            raise
        con.execute("COMMIT")

    @contextmanager
    def memory_limit(self, limit: str) -> Iterator[None]:
        """Cap DuckDB's memory for a bulk write (it spills beyond), then restore the setting."""
        if not re.fullmatch(r"\d+(\.\d+)?\s?[KMGT]i?B", limit):
            raise StoreError(f"memory limit {limit!r} should look like 1.5GB or 512MiB")
        previous = self.con.execute("SELECT current_setting('memory_limit')").fetchone()[0]
        self.con.execute(f"SET memory_limit = '{limit}'")  # SET takes no parameters; checked above
        try:
            yield
        finally:
            self.con.execute(f"SET memory_limit = '{previous}'")

    def _migrate(self) -> None:
        """Apply schema.sql, then each upgrade from the store's version (annotation/migrations.py),
        each in its own transaction, logging what it did (and keeping it in `migrations`)."""
        self.con.execute(SCHEMA_PATH.read_text())
        current = self._stored_version()
        if current is None:
            self.con.execute("INSERT INTO schema_version VALUES (?)", [SCHEMA_VERSION])
            return
        if current > SCHEMA_VERSION:
            raise StoreError(f"{self.path} has schema version {current}, newer than this bradley "
                             f"({SCHEMA_VERSION}); upgrade bradley")
        for version in range(current + 1, SCHEMA_VERSION + 1):
            with self.transaction():
                summary = f"{self.path}: upgraded to schema {version}: {MIGRATIONS[version](self.con)}"
                self.con.execute("INSERT INTO migrations (version, summary) VALUES (?, ?)",
                                 [version, summary])
                self.con.execute("UPDATE schema_version SET version = ?", [version])
            self.migrated.append(summary)
            log.warning(summary)

    def _stored_version(self) -> int | None:
        try:
            return self.con.execute("SELECT max(version) FROM schema_version").fetchone()[0]
        except duckdb.CatalogException:  # a new file opened read-only: no tables yet
            return SCHEMA_VERSION

    def schema_version(self) -> int:
        return self.con.execute("SELECT max(version) FROM schema_version").fetchone()[0]

    # -- batches and writes --------------------------------------------------------------------

    def batch_sha256s(self) -> set[str]:
        """The sha256 of every batch in the store."""
        return {row[0] for row in self.con.execute("SELECT sha256 FROM batches").fetchall()}

    def find_batch(self, sha256: str) -> BatchInfo | None:
        row = self.con.execute(
            "SELECT id, seq, source, sha256, rows_in, rows_ok, rows_rejected FROM batches "
            "WHERE sha256 = ?", [sha256]).fetchone()
        return BatchInfo(*row) if row else None

    def write_batch(self, source: str, sha256: str, rows_in: int, tables: dict[str, pa.Table],
                    rejects: Sequence[tuple[int, str, str]] = (), batch_id: str | None = None,
                    con: duckdb.DuckDBPyConnection | None = None) -> BatchInfo:
        """Write one batch atomically: its rows (prompts, responses, judgments, feedback as Arrow
        tables whose columns are named like the table's) and its rejects (line, reason, raw).

        Rows whose id already exists are skipped (content ids make that a no-op). Judgment and
        feedback tables may omit `batch_id`; it is filled in.
        """
        with self.transaction(con) as cur:
            info = self.begin_batch(cur, source, sha256, rows_in, batch_id)
            for name in ("prompts", "responses", "judgments", "feedback"):
                if name in tables and tables[name].num_rows:
                    self.insert_rows(cur, name, _with_batch(tables[name], name, info.id))
            self.insert_rejects(cur, info.id, rejects)
            return self.finish_batch(cur, info)

    def begin_batch(self, cur, source: str, sha256: str, rows_in: int,
                    batch_id: str | None = None) -> BatchInfo:
        """Inside an open transaction: claim the next batch seq and record the batch row."""
        seq = cur.execute("SELECT coalesce(max(seq), 0) + 1 FROM batches").fetchone()[0]
        info = BatchInfo(batch_id or uuid.uuid4().hex[:24], seq, source, sha256, rows_in, 0, 0)
        cur.execute("INSERT INTO batches (id, seq, source, sha256, rows_in, rows_ok, rows_rejected) "
                    "VALUES (?, ?, ?, ?, ?, 0, 0)", [info.id, seq, source, sha256, rows_in])
        return info

    def finish_batch(self, cur, info: BatchInfo, rows_in: int | None = None) -> BatchInfo:
        """Inside the same transaction: count what the batch wrote and rejected."""
        ok = cur.execute(
            "SELECT (SELECT count(*) FROM judgments WHERE batch_id = $1)"
            " + (SELECT count(*) FROM feedback WHERE batch_id = $1)", [info.id]).fetchone()[0]
        bad = cur.execute("SELECT count(*) FROM rejects WHERE batch_id = ?", [info.id]).fetchone()[0]
        info.rows_in = info.rows_in if rows_in is None else rows_in
        cur.execute("UPDATE batches SET rows_in = ?, rows_ok = ?, rows_rejected = ? WHERE id = ?",
                    [info.rows_in, ok, bad, info.id])
        info.rows_ok, info.rows_rejected = ok, bad
        return info

    def insert_rows(self, cur, table: str, rows: pa.Table) -> None:
        """Insert an Arrow table into one of the data tables, matching columns by name; rows whose id
        is already in the table (or earlier in `rows`) are skipped."""
        if table not in ("prompts", "responses", "judgments", "feedback"):
            raise StoreError(f"cannot bulk-insert into {table!r}")
        columns = ", ".join(f'"{c}"' for c in rows.column_names if re.fullmatch(r"[a-z_]+", c))
        cur.register("_bradley_rows", rows)
        try:
            cur.execute(f"INSERT INTO {table} ({columns}) SELECT DISTINCT ON (r.id) {columns} "
                        f"FROM _bradley_rows r ANTI JOIN {table} t ON t.id = r.id")
        finally:
            cur.unregister("_bradley_rows")

    def insert_rejects(self, cur, batch_id: str, rejects: Iterable[tuple[int, str, str]]) -> None:
        rows = [(batch_id, line, reason, (raw or "")[:10_000]) for line, reason, raw in rejects]
        if rows:
            cur.executemany("INSERT INTO rejects VALUES (?, ?, ?, ?)", rows)

    def rejects(self, batch_id: str) -> list[tuple[int, str, str]]:
        return self.con.execute("SELECT line, reason, raw FROM rejects WHERE batch_id = ? ORDER BY line",
                                [batch_id]).fetchall()

    def counts(self) -> dict[str, int]:
        return {t: self.con.execute(f"SELECT count(*) FROM {t}").fetchone()[0]
                for t in (*TABLES, "pairs")}

    # -- reads ---------------------------------------------------------------------------------

    def judgments(self, snapshot_id: str | None = None, raters: str | None = None) -> pa.Table:
        """Every judgment with its texts: prompt_id, prompt, messages, response_a/b ids and texts,
        winner, strength, rater, source, created_at, rationale, metadata, given_id (the row's own
        id, where it brought one), in ingest order."""
        return self._arrow("""
            SELECT j.id, j.prompt_id, p.text AS prompt, p.messages, j.response_a, j.response_b,
                   ra.text AS response_a_text, rb.text AS response_b_text,
                   ra.source_model AS model_a, rb.source_model AS model_b,
                   j.winner, j.strength, j.rater, j.source, j.batch_id, j.created_at, j.rationale,
                   j.metadata, j.given_id
            FROM judgments_in(?, ?) j
            JOIN prompts p ON p.id = j.prompt_id
            JOIN responses ra ON ra.id = j.response_a
            JOIN responses rb ON rb.id = j.response_b
            JOIN batches b ON b.id = j.batch_id
            ORDER BY b.seq, j.id""", list(self.snapshot_filter(snapshot_id, raters)))

    def verdict_arrays(self, snapshot_id: str | None = None, raters: str | None = None) -> pa.Table:
        """The compact form statistics need, without texts: prompt_id, response_a, response_b,
        winner, rater, len_a, len_b (characters), model_a, model_b. Self-comparisons (the same
        text on both sides) are left out, as in `pairs`; `judgments()` has every vote."""
        return self._arrow("""
            SELECT j.prompt_id, j.response_a, j.response_b, j.winner, j.rater,
                   length(ra.text) AS len_a, length(rb.text) AS len_b,
                   ra.source_model AS model_a, rb.source_model AS model_b
            FROM judgments_in(?, ?) j
            JOIN responses ra ON ra.id = j.response_a
            JOIN responses rb ON rb.id = j.response_b
            WHERE j.response_a <> j.response_b""",
            list(self.snapshot_filter(snapshot_id, raters)))

    def pairs(self, snapshot_id: str | None = None, raters: str | None = None) -> pa.Table:
        """Resolved pairs: prompt_id, prompt, messages, chosen_id, rejected_id, chosen, rejected,
        votes_chosen, votes_rejected, ties, n_votes, p_chosen (vote share, ties as half)."""
        return self._arrow("""
            SELECT v.prompt_id, p.text AS prompt, p.messages, v.chosen_id, v.rejected_id,
                   c.text AS chosen, r.text AS rejected, v.votes_chosen, v.votes_rejected, v.ties,
                   v.n_votes, v.p_chosen
            FROM pairs_in(?, ?) v
            JOIN prompts p ON p.id = v.prompt_id
            JOIN responses c ON c.id = v.chosen_id
            JOIN responses r ON r.id = v.rejected_id
            ORDER BY v.prompt_id, v.chosen_id, v.rejected_id""",
            list(self.snapshot_filter(snapshot_id, raters)))

    def feedback(self, snapshot_id: str | None = None, raters: str | None = None) -> pa.Table:
        """Unpaired feedback with texts: id, prompt_id, prompt, messages, response_id, completion,
        label, rater, given_id."""
        max_seq, prefix = self.snapshot_filter(snapshot_id, raters)
        return self._arrow("""
            SELECT f.id, f.prompt_id, p.text AS prompt, p.messages, f.response_id,
                   r.text AS completion, f.label, f.rater, f.given_id
            FROM feedback f JOIN batches b ON b.id = f.batch_id
            JOIN prompts p ON p.id = f.prompt_id JOIN responses r ON r.id = f.response_id
            WHERE ($1 IS NULL OR b.seq <= $1) AND ($2 IS NULL OR starts_with(f.rater, $2))
            ORDER BY b.seq, f.id""", [max_seq, prefix])

    def comparisons(self, raters: str | None = None, unjudged_by: str | None = None,
                    limit: int | None = None) -> pa.Table:
        """Distinct comparisons (prompt, unordered response pair) that raters matching `raters`
        judged, leaving out those `unjudged_by` (a rater id) already judged, in ingest order:
        prompt_id, prompt, messages, a_id, b_id, a, b (texts, lower id first), model_a, model_b."""
        return self._arrow("""
            WITH c AS (
                SELECT j.prompt_id, least(j.response_a, j.response_b) AS lo,
                       greatest(j.response_a, j.response_b) AS hi, min(b.seq) AS seq
                FROM judgments_in(NULL, $1) j JOIN batches b ON b.id = j.batch_id
                WHERE j.response_a <> j.response_b
                GROUP BY ALL
            )
            SELECT c.prompt_id, p.text AS prompt, p.messages, c.lo AS a_id, c.hi AS b_id,
                   ra.text AS a, rb.text AS b, ra.source_model AS model_a, rb.source_model AS model_b
            FROM c JOIN prompts p ON p.id = c.prompt_id
            JOIN responses ra ON ra.id = c.lo JOIN responses rb ON rb.id = c.hi
            WHERE $2 IS NULL OR NOT EXISTS (
                SELECT 1 FROM judgments x WHERE x.rater = $2 AND x.prompt_id = c.prompt_id
                  AND least(x.response_a, x.response_b) = c.lo
                  AND greatest(x.response_a, x.response_b) = c.hi)
            ORDER BY c.seq, c.prompt_id, c.lo, c.hi
            LIMIT coalesce($3, 9223372036854775807)""", [rater_prefix(raters), unjudged_by, limit])

    def _arrow(self, query: str, params: list) -> pa.Table:
        # A cursor of its own: DuckDB 2 refuses relation queries while an execute() result is open.
        with self.con.cursor() as cur:
            return cur.sql(query, params=params).to_arrow_table()

    # -- models --------------------------------------------------------------------------------

    def register_model(self, kind: str, base_model: str, path: str, snapshot_id: str | None,
                       config: dict, metrics: dict, model_id: str | None = None) -> str:
        model_id = model_id or f"{kind}-{uuid.uuid4().hex[:12]}"
        self.con.execute(
            "INSERT INTO models (id, kind, base_model, path, snapshot_id, config, metrics) "
            "VALUES (?, ?, ?, ?, ?, ?, ?)",
            [model_id, kind, base_model, str(path), snapshot_id, canonical_json(config),
             canonical_json(metrics)])
        return model_id

    def models(self) -> list[dict]:
        cur = self.con.execute("SELECT id, kind, base_model, path, snapshot_id, config, metrics, "
                               "created_at FROM models ORDER BY created_at")
        names = [d[0] for d in cur.description]
        return [_model_row(dict(zip(names, row, strict=False))) for row in cur.fetchall()]

    def model(self, model_id: str) -> dict:
        for row in self.models():
            if row["id"] == model_id:
                return row
        raise StoreError(f"model {model_id!r} not found; `GET /models` or the models table lists them")

    def retire_model(self, model_id: str, by: str) -> None:
        """Mark a model id as retired by a newer one (its folder was overwritten with `--overwrite`):
        `config.retired_by` says so; the row stays, so the id is still traceable to its snapshot."""
        self.con.execute("UPDATE models SET config = json_merge_patch(coalesce(config, '{}'), ?) "
                         "WHERE id = ?", [canonical_json({"retired_by": by}), model_id])

    # -- reference log-probs -------------------------------------------------------------------

    def ref_logps(self, model_hash: str, template_hash: str,
                  response_ids: Sequence[str]) -> dict[str, tuple[float, int]]:
        """Cached (logp, n_tokens) for the response ids that have them."""
        rows = self.con.execute(
            "SELECT response_id, logp, n_tokens FROM ref_logps WHERE model_hash = ? "
            "AND template_hash = ? AND list_contains(?, response_id)",
            [model_hash, template_hash, list(response_ids)]).fetchall()
        return {rid: (logp, n) for rid, logp, n in rows}

    def put_ref_logps(self, model_hash: str, template_hash: str,
                      rows: Iterable[tuple[str, float, int]]) -> None:
        ids, logps, counts = [], [], []
        for rid, lp, n in rows:
            ids.append(rid)
            logps.append(float(lp))
            counts.append(int(n))
        if not ids:
            return
        # One set-based insert from list parameters: executemany costs a round trip a row (minutes
        # for a large preference set), and an Arrow scan would leave Arrow's libraries resident in
        # the process that goes on to train
        self.con.execute(
            "INSERT OR IGNORE INTO ref_logps SELECT $1, $2, unnest($3), unnest($4), unnest($5)",
            [model_hash, template_hash, ids, logps, counts])

    def texts(self, ids: Sequence[str]) -> dict[str, str]:
        """Text of each given prompt or response id that exists (for reports quoting a few items)."""
        rows = self._arrow("SELECT id, text FROM prompts WHERE list_contains($1, id) UNION ALL "
                           "SELECT id, text FROM responses WHERE list_contains($1, id)", [list(ids)])
        return dict(zip(rows.column("id").to_pylist(), rows.column("text").to_pylist(), strict=False))

    def verdict_codes(self, snapshot_id: str | None = None, raters: str | None = None):
        """A snapshot's verdicts as integers in DuckDB temp tables, for statistics on stores larger
        than memory (annotation/verdict_codes.py); close it, or use it in a `with`."""
        from annotation.verdict_codes import VerdictCodes

        return VerdictCodes(self, snapshot_id, raters)


def _with_batch(table: pa.Table, name: str, batch_id: str) -> pa.Table:
    if name in ("judgments", "feedback") and "batch_id" not in table.column_names:
        return table.append_column("batch_id", pa.array([batch_id] * table.num_rows, pa.string()))
    return table


def _model_row(row: dict) -> dict:
    for key in ("config", "metrics"):
        if isinstance(row.get(key), str):
            row[key] = json.loads(row[key])
    row["created_at"] = str(row["created_at"])
    return row


def _connect(path: str, read_only: bool) -> duckdb.DuckDBPyConnection:
    try:
        return duckdb.connect(path, read_only=read_only)
    except duckdb.IOException as exc:
        raise _translate_io_error(path, exc) from None


def _translate_io_error(path: str, exc: Exception) -> StoreError:
    message = str(exc)
    match = re.search(r"PID (\d+)", message)
    if "lock" in message.lower() and match:
        return locked_by(path, match.group(1))
    return StoreError(f"cannot open {path}: {message}")
