"""Snapshots: what a report or training run read, frozen as "every batch up to seq N, raters with this
prefix" (the `judgments_in` / `pairs_in` macros of schema.sql), so a run replays exactly however much
data arrives later. Part of the store: annotation.store.Store has these methods (SQL stays in the
store's modules, as with annotation/ingest/inserts.py).

    >>> from annotation.store import Store
    >>> store = Store(":memory:")
    >>> store.create_snapshot(if_any=True) is None  # nothing to read: no snapshot row either
    True
    >>> store.snapshots()
    []
"""

from __future__ import annotations

import json
import uuid

from annotation.ids import canonical_json, content_id
from annotation.store_errors import StoreError

RATER_KINDS = {"human": "human:", "ai": "ai:"}


def rater_prefix(raters: str | None) -> str | None:
    """'human' -> 'human:', 'ai' -> 'ai:', anything else is used as a prefix as given; None keeps all."""
    if raters is None or raters == "":
        return None
    return RATER_KINDS.get(raters, raters)


class SnapshotQueries:
    """Store methods about snapshots (mixed into annotation.store.Store, which owns `con`)."""

    def create_snapshot(self, raters: str | None = None, if_any: bool = False) -> str | None:
        """Freeze what a run reads: the rater filter and the newest batch now in the store. The
        same filter with no batch since is the same data: the newest such snapshot is given again
        rather than a new one recorded. With `if_any`, a filter that matches no judgment records
        nothing and gives None.

        >>> from annotation.store import Store
        >>> from annotation.ingest.batch import ingest_records
        >>> store = Store(":memory:")
        >>> _ = ingest_records(store, [{"prompt": "p", "response_a": "x", "response_b": "y", "winner": "a"}])
        >>> store.create_snapshot() == store.create_snapshot(), len(store.snapshots())
        (True, 1)
        """
        prefix = rater_prefix(raters)
        max_seq = self.con.execute("SELECT coalesce(max(seq), 0) FROM batches").fetchone()[0]
        filt = {"rater_prefix": prefix, "max_batch_seq": max_seq}
        same = self.con.execute("SELECT id FROM snapshots WHERE CAST(filter AS VARCHAR) = ? "
                                "ORDER BY created_at DESC, id LIMIT 1", [canonical_json(filt)]).fetchone()
        if same is not None:
            return same[0]
        n = self.con.execute("SELECT count(*) FROM judgments_in(?, ?)", [max_seq, prefix]).fetchone()[0]
        if if_any and n == 0:
            return None
        snap = content_id(canonical_json(filt), uuid.uuid4().hex)
        self.con.execute("INSERT INTO snapshots (id, filter, n_judgments) VALUES (?, ?, ?)",
                         [snap, canonical_json(filt), n])
        return snap

    def snapshot_filter(self, snapshot_id: str | None = None, raters: str | None = None) -> tuple:
        """(max_batch_seq, rater_prefix) for a snapshot id, or for 'everything now' with a rater filter."""
        if snapshot_id is None:
            return None, rater_prefix(raters)
        row = self.con.execute("SELECT filter FROM snapshots WHERE id = ?", [snapshot_id]).fetchone()
        if row is None:
            raise StoreError(f"snapshot {snapshot_id!r} not found; list them with `bradley snapshots`")
        filt = json.loads(row[0])
        return filt["max_batch_seq"], filt["rater_prefix"]

    def snapshots(self) -> list[dict]:
        """Every snapshot, oldest first: id, created_at, raters (prefix or null for all),
        max_batch_seq, n_judgments, and the models trained on it."""
        rows = self.con.execute("""
            SELECT s.id, s.created_at, s.filter, s.n_judgments,
                   list(m.id ORDER BY m.created_at) FILTER (WHERE m.id IS NOT NULL) AS models
            FROM snapshots s LEFT JOIN models m ON m.snapshot_id = s.id
            GROUP BY ALL ORDER BY s.created_at, s.id""").fetchall()
        out = []
        for snap, created, filt, n, models in rows:
            filt = json.loads(filt)
            out.append({"id": snap, "created_at": str(created), "raters": filt["rater_prefix"],
                        "max_batch_seq": filt["max_batch_seq"], "n_judgments": n,
                        "models": models or []})
        return out

    def self_comparisons(self, snapshot_id: str | None = None, raters: str | None = None,
                         batch_id: str | None = None) -> int:
        """Judgments whose two sides are the same response (MT-Bench has some: two models gave the
        same text). They stay in the store; `pairs` and the statistics leave them out."""
        max_seq, prefix = self.snapshot_filter(snapshot_id, raters)
        return self.con.execute(
            "SELECT count(*) FROM judgments_in(?, ?) WHERE response_a = response_b "
            "AND (? IS NULL OR batch_id = ?)", [max_seq, prefix, batch_id, batch_id]).fetchone()[0]
