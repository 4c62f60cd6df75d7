"""The Label Studio loop through label-studio-sdk 2.x: set up a pairwise project, push the pairs that
need labels, pull every verdict back exactly once.

- `setup`: finds the project by title or creates it with bradley's config (ls_mapping.LABEL_CONFIG:
  prompt, two answers, a <Pairwise> choice, Tie / Both bad, an optional rationale) and
  `maximum_annotations = overlap` raters per task; records it in the store.
- `push`: orders the pairs not yet sent by a strategy (annotation.label_studio.selection), shows each pair's two
  answers in a random left/right order kept in the task data (`bradley_swapped`, undone by
  ls_mapping on the way back), imports them in batches and records each task (a pair is pushed to a
  project once).
- `pull`: takes the tasks updated since the last pull (cursor in the store), and ingests their
  annotations as one batch; the ledger (annotation.label_studio.ledger) replaces edited verdicts, retracts
  deleted or cancelled ones, and ignores versions already counted by an export file or a webhook.

The API key comes from LABEL_STUDIO_API_KEY (never a flag, so it stays out of shell history). The SDK
is imported only here, when a command needs it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta

import numpy as np

from annotation.ingest.batch import IngestResult, ingest_records
from annotation.label_studio import ledger as ls_ledger
from annotation.label_studio import mapping as ls_mapping
from annotation.label_studio import selection

API_KEY_ENV = "LABEL_STUDIO_API_KEY"
BATCH_TASKS = 100  # tasks per import request
PAGE_TASKS = 100   # tasks per page when pulling


class LabelStudioError(ValueError):
    """The server, the project or the settings are not as the loop needs them; the message says how."""


def connect(url: str, api_key: str | None = None):
    """An SDK client for `url`, keyed by `api_key` or LABEL_STUDIO_API_KEY."""
    key = api_key or os.environ.get(API_KEY_ENV)
    if not key:
        raise LabelStudioError(f"set {API_KEY_ENV} to a Label Studio access token (Account & "
                               "Settings > Access Token); it is read from the environment only")
    from label_studio_sdk import LabelStudio

    return LabelStudio(base_url=url.rstrip("/"), api_key=key)


def _call(what: str, fn, *args, **kwargs):
    """One SDK call; its errors become a LabelStudioError that says what was being done."""
    try:
        return fn(*args, **kwargs)
    except Exception as exc:  # the SDK raises ApiError, httpx errors, pydantic errors...
        status = getattr(exc, "status_code", None)
        detail = f"HTTP {status}: {str(getattr(exc, 'body', ''))[:300]}" if status else str(exc)[:300]
        hint = " (is LABEL_STUDIO_API_KEY right?)" if status in (401, 403) else ""
        raise LabelStudioError(f"Label Studio: {what} failed: {detail}{hint}") from None


def _plain(obj) -> dict:
    return obj if isinstance(obj, dict) else obj.model_dump(mode="json")


# -- setup ----------------------------------------------------------------------------------------


def setup(store, client, url: str, title: str, overlap: int = 1) -> dict:
    """Find (by exact title) or create the project; `overlap` raters per task. Records it."""
    if overlap < 1:
        raise LabelStudioError("--overlap must be at least 1 (raters per task)")
    found = [p for p in _call("listing projects", client.projects.list, title=title)
             if p.title == title]
    if found:
        project, created = found[0], False
        if project.maximum_annotations != overlap:
            _call("setting maximum_annotations", client.projects.update, id=project.id,
                  maximum_annotations=overlap)
    else:
        project, created = _call("creating the project", client.projects.create, title=title,
                                 label_config=ls_mapping.LABEL_CONFIG,
                                 maximum_annotations=overlap), True
    ls_ledger.record_project(store, _norm(url), project.id, title, overlap)
    return {"project_id": project.id, "title": title, "overlap": overlap, "created": created,
            "url": _norm(url)}


def _norm(url: str) -> str:
    return url.rstrip("/")


def project(store, url: str, project_id: int | None = None) -> dict:
    """The recorded project at `url` (the newest set up when no id is given)."""
    rows = [p for p in ls_ledger.projects(store) if p["url"] == _norm(url)
            and (project_id is None or p["project_id"] == project_id)]
    if not rows:
        raise LabelStudioError(f"no Label Studio project of {_norm(url)} is recorded in this store"
                               f"{f' with id {project_id}' if project_id else ''}; run "
                               "`bradley label-studio setup --url URL --title T` first")
    return rows[0]


# -- push -----------------------------------------------------------------------------------------

Scorer = Callable[[list, list[str]], list[float]]


def push(store, client, proj: dict, strategy: str = "random", limit: int = 100,
         scorer: Scorer | None = None, seed: int = 0, batch_size: int = BATCH_TASKS) -> dict:
    """Send up to `limit` pairs not yet pushed, chosen by `strategy`; `scorer(prompts, responses)`
    gives reward-model scores for `uncertain`. Returns counts."""
    rows, n_candidates = choose(store, proj, strategy, limit, scorer, seed)
    rng = np.random.default_rng([seed, ls_ledger.pushed_count(store, proj["url"], proj["project_id"])])
    swaps = [bool(s) for s in rng.random(len(rows)) < 0.5]
    for chunk in _chunks(list(zip(rows, swaps, strict=True)), batch_size):
        tasks = [task_data(row, swap) for row, swap in chunk]
        answer = _call("importing tasks", client.projects.import_tasks, id=proj["project_id"],
                       request=tasks, return_task_ids=True)
        task_ids = list(getattr(answer, "task_ids", None) or [])
        if len(task_ids) != len(tasks):
            raise LabelStudioError(f"Label Studio returned {len(task_ids)} task ids for {len(tasks)} "
                                   "imported tasks; cannot record what was pushed")
        ls_ledger.record_tasks(store, proj["url"], proj["project_id"], [
            (tid, row["prompt_id"], row["response_a"], row["response_b"], swap, strategy)
            for tid, (row, swap) in zip(task_ids, chunk, strict=True)])
    return {"project_id": proj["project_id"], "select": strategy, "pushed": len(rows),
            "candidates": n_candidates, "swapped": sum(swaps)}


def choose(store, proj: dict, strategy: str, limit: int, scorer: Scorer | None = None,
           seed: int = 0) -> tuple[list[dict], int]:
    """(the candidate rows `strategy` picks first, at most `limit`; how many candidates there were)."""
    if strategy not in selection.STRATEGIES:
        raise LabelStudioError(f"unknown --select {strategy!r}; use {', '.join(selection.STRATEGIES)}")
    if strategy == "uncertain" and scorer is None:
        raise LabelStudioError("--select uncertain needs --model ID (a reward model in the store or "
                               "a model folder)")
    cand = ls_ledger.candidates(store, proj["url"], proj["project_id"])
    if not cand.num_rows:
        return [], 0
    scores = _pair_scores(cand, scorer) if strategy == "uncertain" else None
    picked = np.asarray(selection.select(strategy, cand, limit, seed, scores), dtype=np.int64)
    return cand.take(picked).to_pylist(), cand.num_rows


def task_data(row: dict, swapped: bool) -> dict:
    """One task: the prompt, the pair's answers left and right (response_b on the left when
    `swapped`), and what bradley needs to map a verdict back.

    >>> task_data({"prompt": "2+2?", "messages": None, "text_a": "4", "text_b": "5",
    ...            "prompt_id": "p", "response_a": "ra", "response_b": "rb"}, True)["data"]["answer1"]
    '5'
    """
    left, right = (row["text_b"], row["text_a"]) if swapped else (row["text_a"], row["text_b"])
    data = {"prompt": row["prompt"], "answer1": left, "answer2": right, ls_mapping.SWAPPED: swapped,
            "bradley_prompt_id": row["prompt_id"], "bradley_response_a": row["response_a"],
            "bradley_response_b": row["response_b"]}
    if row.get("messages"):
        data["messages"] = row["messages"]
    return {"data": data}


def _pair_scores(cand, scorer: Scorer) -> tuple[np.ndarray, np.ndarray]:
    """r_a, r_b per candidate, each distinct response scored once."""
    keys, items = {}, []
    for side in ("a", "b"):
        for msgs, prompt, rid, text in zip(
                *(cand.column(c).to_pylist() for c in ("messages", "prompt", f"response_{side}",
                                                       f"text_{side}")), strict=True):
            if rid not in keys:
                keys[rid] = len(items)
                items.append((json.loads(msgs) if msgs else prompt, text))
    scores = np.asarray(scorer([p for p, _ in items], [t for _, t in items]), dtype=float)
    return tuple(scores[[keys[r] for r in cand.column(f"response_{s}").to_pylist()]] for s in "ab")


def _chunks(items: list, size: int) -> Iterator[list]:
    for start in range(0, len(items), size):
        yield items[start:start + size]


# -- pull -----------------------------------------------------------------------------------------


def pull(store, client, proj: dict, on_error: str = "abort", full: bool = False) -> dict:
    """Ingest the annotations of tasks updated since the last pull (all tasks with `full`)."""
    cursor = None if full else proj.get("pull_cursor")
    tasks = [t for t in fetch_tasks(client, proj["project_id"], cursor)
             if full or cursor is None or ls_mapping.version(t) > cursor]
    source = f"label-studio:{proj['url']}/projects/{proj['project_id']}"
    deleted, cancelled, records = _changes(store, tasks)
    result = ingest_records(store, records, fmt="label-studio", source=source,
                            on_error=on_error) if records else None
    retracted = ls_ledger.remove(store, deleted, "deleted", source)
    retracted += ls_ledger.remove(store, cancelled, "cancelled", source)
    newest = max((ls_mapping.version(t) for t in tasks), default=None)
    if newest and (cursor is None or newest > cursor):
        ls_ledger.set_cursor(store, proj["url"], proj["project_id"], newest)
    return {"project_id": proj["project_id"], "tasks": len(tasks), **_counts(result),
            "deleted": len(deleted), "cancelled": len(cancelled), "retracted": retracted,
            "cursor": newest or cursor}


def _changes(store, tasks: list[dict]) -> tuple[dict, dict, list[dict]]:
    """(deleted {annotation id: None}, cancelled {id: version}, tasks to ingest) for fetched tasks."""
    known = ls_ledger.annotations_of_tasks(store, [t["id"] for t in tasks])
    deleted, cancelled, records = {}, {}, []
    for task in tasks:
        anns = [a for a in task.get("annotations") or [] if isinstance(a, dict)]
        present = {a.get("id") for a in anns}
        deleted.update({aid: None for aid in known.get(task["id"], set()) - present})
        cancelled.update({a["id"]: ls_mapping.version(a) for a in anns if a.get("was_cancelled")})
        live = [_annotation(a) for a in anns if not a.get("was_cancelled")]
        if live:
            records.append({"id": task["id"], "data": task.get("data"), "annotations": live})
    return deleted, cancelled, records


def _annotation(ann: dict) -> dict:
    """The fields a judgment needs (a task's annotations also carry drafts, ids of others...)."""
    who = ann.get("completed_by")
    who = who.get("id") if isinstance(who, dict) else who
    return {"id": ann.get("id"), "result": ann.get("result"), "completed_by": who,
            "created_at": ann.get("created_at"), "updated_at": ann.get("updated_at"),
            "project": ann.get("project")}


def _counts(result: IngestResult | None) -> dict:
    if result is None:
        return {"batch_id": None, "annotations_ok": 0, "rejected": 0, "errors": []}
    return {"batch_id": result.batch_id, "annotations_ok": result.rows_ok,
            "rejected": result.rows_rejected, "errors": result.errors[:50]}


def fetch_tasks(client, project_id: int, since: str | None = None) -> Iterator[dict]:
    """Every task of the project with its annotations, oldest update first; with `since` (a UTC
    ISO time), Label Studio's own filter narrows them to updates from a minute before it on (a
    margin for clocks and rounding: the caller compares exactly)."""
    query = {"ordering": ["tasks:updated_at"]}
    if since:
        margin = datetime.fromisoformat(since) - timedelta(minutes=1)
        query["filters"] = {"conjunction": "and", "items": [{
            "filter": "filter:tasks:updated_at", "operator": "greater", "type": "Datetime",
            "value": margin.strftime("%Y-%m-%dT%H:%M:%S.%fZ")}]}
    pages = _call("listing tasks", client.tasks.list, project=project_id, fields="all",
                  query=json.dumps(query), page_size=PAGE_TASKS)
    for task in pages:
        yield _plain(task)
