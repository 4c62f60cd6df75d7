"""Export: the store's resolved pairs (TRL) or its judgments (JSONL, Parquet, a saved HF DatasetDict).

- `trl`: one row per resolved pair, TRL's preference format `prompt, chosen, rejected`, in one shape
  for the whole file (TRL cannot train on a mix): `shape="text"` (strings; conversations become hh
  transcripts, annotation/transcripts.py), `"conversational"` (message lists; text prompts become
  messages: an hh transcript alternates user/assistant turns, plain text is one user turn) or
  `"auto"` (the store's one shape, conversational when it holds both). A text prompt that carries
  speaker markers but is no clean transcript cannot become messages: the export refuses and counts
  them. Pairs whose votes split evenly state no preference and are left out (`skipped_unresolved`).
- `jsonl` / `parquet`: one row per judgment with the columns ingest reads back (`id, prompt, messages,
  response_a, response_b, winner, strength, rater, source, created_at, rationale, model_a, model_b,
  metadata`), so exporting and ingesting into an empty store gives the same prompts, responses and
  judgments (the same ids), and ingesting the export into the store it came from adds nothing. `id`
  is the id the row brought when it brought one (it is part of the judgment's identity), else the
  store's content id (which ingest recognises as the row's own content, not an id of its own).
- `hf`: a `datasets.DatasetDict` saved with `save_to_disk`: split `judgments` (as above) and, when the
  store has any, split `feedback` (KTO rows: id, prompt, messages, completion, label, rater).

`snapshot_id` reproduces exactly what a past run read. OUT is written as annotation/outputs.py says:
`-` is standard output, a symlink is written through (the link stays), a FIFO or `/dev/stdout` is
written directly, and a regular file is written to a temporary name and renamed, so a failed export
leaves no half-written OUT; a new file gets the mode the user's umask gives.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from annotation.outputs import open_stream, write_output
from annotation.transcripts import to_messages, to_text

JUDGMENT_COLUMNS = {  # export column <- store.judgments() column
    "id": "id", "prompt": "prompt", "messages": "messages", "response_a": "response_a_text",
    "response_b": "response_b_text", "winner": "winner", "strength": "strength", "rater": "rater",
    "source": "source", "created_at": "created_at", "rationale": "rationale", "model_a": "model_a",
    "model_b": "model_b", "metadata": "metadata"}
JSON_COLUMNS = ("messages", "metadata")
SHAPES = ("auto", "text", "conversational")  # of a TRL export  # stored as JSON text; nested values in JSONL


class ExportError(ValueError):
    """The export cannot be written as asked; the message says what to change."""


def export(store, fmt: str, out, snapshot_id: str | None = None, raters: str | None = None,
           shape: str = "auto") -> dict:
    """Write the store (or a snapshot of it) to OUT; returns a summary {"format","path","rows",...}.
    `shape` (auto | text | conversational) applies to `trl`."""
    if fmt not in EXPORTERS:
        raise ExportError(f"unknown export format {fmt!r}; use {', '.join(EXPORTERS)}")
    if shape not in SHAPES:
        raise ExportError(f"unknown shape {shape!r}; use {', '.join(SHAPES)}")
    if fmt == "hf" and open_stream(out) is not None:
        raise ExportError("an HF dataset is a folder; give a folder path, not a stream")
    summary = EXPORTERS[fmt](store, Path(out), snapshot_id, raters, shape=shape)
    return {"format": fmt, "path": str(out), **summary, "snapshot_id": snapshot_id, "raters": raters}


def judgment_table(store, snapshot_id: str | None = None, raters: str | None = None) -> pa.Table:
    """Judgments in the export columns, in ingest order."""
    table = store.judgments(snapshot_id, raters)
    columns = {name: _plain(table.column(src)) for name, src in JUDGMENT_COLUMNS.items()}
    columns["id"] = pc.coalesce(table.column("given_id"), columns["id"])
    return pa.table(columns)


def trl_rows(pairs: pa.Table, shape: str = "auto") -> list[dict]:
    """TRL preference rows from `Store.pairs()`, all of one shape (see the module docstring).

    >>> t = pa.table({"prompt": ["2+2?", None], "chosen": ["4", "Hi!"], "rejected": ["5", "No."],
    ...               "messages": [None, '[{"role": "user", "content": "Say hi"}]']})
    >>> trl_rows(t, "text")[1]["prompt"]
    '\\n\\nHuman: Say hi\\n\\nAssistant:'
    >>> trl_rows(t)[0]
    {'prompt': [{'role': 'user', 'content': '2+2?'}], 'chosen': [{'role': 'assistant', 'content': '4'}], 'rejected': [{'role': 'assistant', 'content': '5'}]}
    """
    rows = pairs.select(["prompt", "messages", "chosen", "rejected"]).to_pylist()
    n_conv = sum(r["messages"] is not None for r in rows)
    if shape == "auto":
        shape = "conversational" if n_conv else "text"
    if shape == "text":
        return [{"prompt": to_text(json.loads(r["messages"])) if r["messages"] else r["prompt"],
                 "chosen": r["chosen"], "rejected": r["rejected"]} for r in rows]
    prompts = [json.loads(r["messages"]) if r["messages"] else to_messages(r["prompt"]) for r in rows]
    unclear = sum(p is None for p in prompts)
    if unclear:
        raise ExportError(f"{n_conv} pairs have conversational prompts and {len(rows) - n_conv} text "
                          f"prompts, of which {unclear} carry Human/Assistant markers but are not clean "
                          "hh transcripts, so they cannot become messages; export with --as text")
    return [{"prompt": p, "chosen": [{"role": "assistant", "content": r["chosen"]}],
             "rejected": [{"role": "assistant", "content": r["rejected"]}]}
            for p, r in zip(prompts, rows, strict=True)]


def _export_trl(store, out: Path, snapshot_id, raters, shape: str = "auto") -> dict:
    pairs = store.pairs(snapshot_id, raters)
    resolved = pairs.filter(pc.greater(pairs.column("votes_chosen"), pairs.column("votes_rejected")))
    rows = trl_rows(resolved, shape)
    if out.suffix == ".parquet":
        write_output(out, lambda fh: _write_parquet(pa.Table.from_pylist(rows), fh))
    else:
        write_output(out, lambda fh: _write_jsonl(rows, fh))
    kind = "conversational" if rows and isinstance(rows[0]["prompt"], list) else "text"
    return {"rows": len(rows), "skipped_unresolved": pairs.num_rows - resolved.num_rows, "as": kind}


def _export_jsonl(store, out: Path, snapshot_id, raters, **_) -> dict:
    table = judgment_table(store, snapshot_id, raters)
    write_output(out, lambda fh: _write_jsonl(_json_rows(table), fh))
    return {"rows": table.num_rows}


def _export_parquet(store, out: Path, snapshot_id, raters, **_) -> dict:
    table = judgment_table(store, snapshot_id, raters)
    write_output(out, lambda fh: _write_parquet(table, fh))
    return {"rows": table.num_rows}


def _export_hf(store, out: Path, snapshot_id, raters, **_) -> dict:
    import datasets

    if out.exists():
        raise ExportError(f"{out} exists; remove it or choose another folder for the HF dataset")
    splits = {"judgments": judgment_table(store, snapshot_id, raters)}
    feedback = store.feedback(snapshot_id, raters)
    if feedback.num_rows:
        splits["feedback"] = pa.table({name: _plain(feedback.column(name)) for name in
                                       ("id", "prompt", "messages", "completion", "label", "rater")})
        splits["feedback"] = splits["feedback"].set_column(
            0, "id", pc.coalesce(feedback.column("given_id"), feedback.column("id")))
    data = datasets.DatasetDict({name: datasets.Dataset(table) for name, table in splits.items()})
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        data.save_to_disk(str(tmp / "data"))
        os.replace(tmp / "data", out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return {"rows": splits["judgments"].num_rows, "feedback_rows": feedback.num_rows}


EXPORTERS: dict[str, Callable] = {"trl": _export_trl, "jsonl": _export_jsonl,
                                  "parquet": _export_parquet, "hf": _export_hf}


def _plain(column: pa.ChunkedArray) -> pa.ChunkedArray:
    """DuckDB's JSON columns arrive as an Arrow extension type; keep them as plain text."""
    if isinstance(column.type, pa.ExtensionType):
        return column.cast(column.type.storage_type)
    return column


def _json_rows(table: pa.Table):
    for batch in table.to_batches(max_chunksize=10_000):
        for row in batch.to_pylist():
            for key in JSON_COLUMNS:
                if row[key] is not None:
                    row[key] = json.loads(row[key])
            if row["created_at"] is not None:
                row["created_at"] = row["created_at"].isoformat()
            yield row


def _write_jsonl(rows, fh) -> None:
    text = io.TextIOWrapper(fh, encoding="utf-8", newline="\n")
    for row in rows:
        text.write(json.dumps(row, ensure_ascii=False) + "\n")
    text.flush()
    text.detach()  # the caller closes fh


def _write_parquet(table: pa.Table, fh) -> None:
    import pyarrow.parquet as pq

    pq.write_table(table, pa.PythonFile(fh, mode="w"))
