"""The store's SQL for the Label Studio loop: projects, pushed tasks, the pull cursor, candidate pairs
for selection, and the annotation ledger that keeps each verdict counted exactly once.

The ledger (`ls_annotations`) holds every annotation's newest version and the judgment ids it counts
as. `reconcile` runs inside each ingest batch that carried Label Studio rows (annotation.ingest.batch calls
it before the commit), whichever way they came:

- a version already counted has the same judgment ids (ls_mapping hashes annotation id + updated_at),
  so ingest's id dedup has dropped it before reconcile runs;
- an older version than the ledger's, or an annotation deleted in Label Studio, is dropped from the
  batch (an old export file re-ingested after an edit changes nothing);
- a newer version retracts the judgments of the one before (table `retractions`, read by
  `judgments_in`) and becomes the ledger's.

Deletions and cancellations carry no verdict: `remove` writes them as a batch of their own, whose
retractions a snapshot replays like any other batch.
"""

from __future__ import annotations

import hashlib

from annotation.ids import canonical_json

_BATCH_ROWS = ("SELECT id, CAST(json_extract_string(metadata, '$.annotation_id') AS BIGINT), "
               "json_extract_string(metadata, '$.updated_at'), "
               "TRY_CAST(json_extract_string(metadata, '$.task_id') AS BIGINT) "
               "FROM judgments WHERE batch_id = ? AND source = 'label-studio'")
_LEDGER = ("SELECT annotation_id, version, judgment_ids, deleted FROM ls_annotations "
           "WHERE list_contains(?, annotation_id)")
_UPSERT = "INSERT OR REPLACE INTO ls_annotations VALUES (?, ?, ?, ?, ?, ?)"
_RETRACT = "INSERT INTO retractions SELECT unnest($1::VARCHAR[]), $2, $3"


def reconcile(cur, batch_id: str) -> None:
    """Inside an ingest batch's transaction: drop stale Label Studio versions from the batch,
    retract what newer versions replace, record the batch's versions in the ledger."""
    incoming: dict[int, tuple[str, int | None, list[str]]] = {}
    drop: list[str] = []
    for jid, aid, ver, task in cur.execute(_BATCH_ROWS, [batch_id]).fetchall():
        have = incoming.get(aid)
        if have is None or ver > have[0]:
            drop += have[2] if have else []
            incoming[aid] = (ver, task, [jid])
        elif ver == have[0]:
            have[2].append(jid)  # a ranking: several judgments of one version
        else:
            drop.append(jid)
    if not incoming:
        return
    ledger = {row[0]: row[1:] for row in cur.execute(_LEDGER, [list(incoming)]).fetchall()}
    retract, upserts = [], []
    for aid, (ver, task, jids) in incoming.items():
        old = ledger.get(aid)
        if old is not None and (old[2] or old[0] >= ver):  # deleted, or this version is not newer
            drop += jids
            continue
        retract += list(old[1]) if old is not None else []
        upserts.append([aid, task, ver, jids, False, batch_id])
    if drop:
        cur.execute("DELETE FROM judgments WHERE batch_id = ? AND list_contains(?, id)", [batch_id, drop])
    if retract:
        cur.execute(_RETRACT, [retract, batch_id, "updated"])
    if upserts:
        cur.executemany(_UPSERT, upserts)


def remove(store, annotations: dict[int, str | None], reason: str, source: str) -> int:
    """Annotations deleted (reason 'deleted': never counted again) or cancelled ('cancelled', with
    their version: a later edit may count again) as one batch of their own; their judgments are
    retracted. Returns how many judgments were retracted. The same removal twice is a no-op."""
    if not annotations:
        return 0
    ids = sorted(annotations)
    sha = hashlib.sha256(canonical_json({"label-studio": reason, "source": source, "annotations":
                                         [[a, annotations[a]] for a in ids]}).encode()).hexdigest()
    if store.find_batch(sha):
        return 0
    with store.transaction() as cur:
        info = store.begin_batch(cur, source, sha, len(ids))
        ledger = {row[0]: row[1:] for row in cur.execute(_LEDGER, [ids]).fetchall()}
        retract, upserts = [], []
        for aid in ids:
            old = ledger.get(aid)
            ver = annotations[aid] or ""
            if old is not None and (old[2] or (reason == "cancelled" and old[0] >= ver)):
                continue
            retract += list(old[1]) if old is not None else []
            task = cur.execute("SELECT task_id FROM ls_annotations WHERE annotation_id = ?",
                               [aid]).fetchone()
            upserts.append([aid, task[0] if task else None, ver if reason == "cancelled" else
                            (old[0] if old else ""), [], reason == "deleted", info.id])
        if retract:
            cur.execute(_RETRACT, [retract, info.id, reason])
        if upserts:
            cur.executemany(_UPSERT, upserts)
        store.finish_batch(cur, info)
    return len(retract)


def annotations_of_tasks(store, task_ids: list[int]) -> dict[int, set[int]]:
    """{task id: ids of its annotations the ledger holds and that are not deleted}."""
    rows = store.con.execute("SELECT task_id, annotation_id FROM ls_annotations WHERE NOT deleted "
                             "AND list_contains(?, task_id)", [list(task_ids)]).fetchall()
    found: dict[int, set[int]] = {}
    for task, aid in rows:
        found.setdefault(task, set()).add(aid)
    return found


# -- projects, tasks, cursor ----------------------------------------------------------------------


def record_project(store, url: str, project_id: int, title: str, overlap: int) -> None:
    store.con.execute("INSERT INTO ls_projects (url, project_id, title, overlap) VALUES (?, ?, ?, ?) "
                      "ON CONFLICT DO UPDATE SET title = excluded.title, overlap = excluded.overlap",
                      [url, project_id, title, overlap])


def projects(store) -> list[dict]:
    cur = store.con.execute("SELECT url, project_id, title, overlap, pull_cursor FROM ls_projects "
                            "ORDER BY created_at DESC")
    names = [d[0] for d in cur.description]
    return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]


def set_cursor(store, url: str, project_id: int, cursor: str) -> None:
    store.con.execute("UPDATE ls_projects SET pull_cursor = ? WHERE url = ? AND project_id = ?",
                      [cursor, url, project_id])


def record_tasks(store, url: str, project_id: int, rows: list[tuple]) -> None:
    """rows: (task_id, prompt_id, response_a, response_b, swapped, strategy), in one transaction."""
    with store.transaction() as cur:
        cur.executemany("INSERT OR IGNORE INTO ls_tasks (url, project_id, task_id, prompt_id, response_a, "
                        "response_b, swapped, strategy) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                        [[url, project_id, *row] for row in rows])


def pushed_count(store, url: str, project_id: int) -> int:
    return store.con.execute("SELECT count(*) FROM ls_tasks WHERE url = ? AND project_id = ?",
                             [url, project_id]).fetchone()[0]


_CANDIDATES = """
WITH cand AS (
    SELECT a.prompt_id, a.id AS response_a, b.id AS response_b
    FROM responses a JOIN responses b ON a.prompt_id = b.prompt_id AND a.id < b.id
), j AS (SELECT * FROM judgments_in(NULL, NULL) WHERE response_a <> response_b),
votes AS (
    SELECT prompt_id, least(response_a, response_b) AS lo, greatest(response_a, response_b) AS hi,
           count(*) FILTER (WHERE (winner = 'a') = (response_a < response_b) AND winner <> 'tie') AS votes_a,
           count(*) FILTER (WHERE (winner = 'a') <> (response_a < response_b) AND winner <> 'tie') AS votes_b,
           count(*) FILTER (WHERE winner = 'tie') AS ties
    FROM j GROUP BY ALL
), per_prompt AS (SELECT prompt_id, count(*) AS n FROM j GROUP BY ALL)
SELECT c.prompt_id, c.response_a, c.response_b, p.text AS prompt, p.messages,
       ra.text AS text_a, rb.text AS text_b,
       coalesce(v.votes_a, 0) AS votes_a, coalesce(v.votes_b, 0) AS votes_b,
       coalesce(v.ties, 0) AS ties, coalesce(pp.n, 0) AS prompt_judgments
FROM cand c
JOIN prompts p ON p.id = c.prompt_id
JOIN responses ra ON ra.id = c.response_a
JOIN responses rb ON rb.id = c.response_b
LEFT JOIN votes v ON v.prompt_id = c.prompt_id AND v.lo = c.response_a AND v.hi = c.response_b
LEFT JOIN per_prompt pp ON pp.prompt_id = c.prompt_id
WHERE NOT EXISTS (SELECT 1 FROM ls_tasks t WHERE t.url = $1 AND t.project_id = $2
                  AND t.prompt_id = c.prompt_id AND t.response_a = c.response_a
                  AND t.response_b = c.response_b)
ORDER BY c.prompt_id, c.response_a, c.response_b
"""


def candidates(store, url: str, project_id: int):
    """Every pair of two different responses to one prompt not yet pushed to this project, in the
    pair's order (ascending response id), with its texts and the votes the store holds: votes_a,
    votes_b, ties, and prompt_judgments (all judgments of its prompt). A pyarrow Table."""
    with store.con.cursor() as cur:
        return cur.sql(_CANDIDATES, params=[url, project_id]).to_arrow_table()
