"""Export: the store's resolved pairs (TRL) or its judgments (JSONL, Parquet, a saved HF DatasetDict).

- `trl`: one row per resolved pair, TRL's preference format `prompt, chosen, rejected` (strings, or
  conversational message lists when the prompt came as a conversation). Pairs whose votes split evenly
  state no preference and are left out (counted in `skipped_unresolved`).
- `jsonl` / `parquet`: one row per judgment with the columns ingest reads back (`id, prompt, messages,
  response_a, response_b, winner, strength, rater, source, created_at, rationale, model_a, model_b,
  metadata`), so exporting and ingesting into an empty store gives the same prompts, responses and
  judgments, and ingesting the export into the store it came from adds nothing.
- `hf`: a `datasets.DatasetDict` saved with `save_to_disk`: split `judgments` (as above) and, when the
  store has any, split `feedback` (KTO rows: id, prompt, messages, completion, label, rater).

`snapshot_id` reproduces exactly what a past run read. Files are written to a temporary name and
renamed, so a failed export leaves no half-written OUT.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

JUDGMENT_COLUMNS = {  # export column <- store.judgments() column
    "id": "id", "prompt": "prompt", "messages": "messages", "response_a": "response_a_text",
    "response_b": "response_b_text", "winner": "winner", "strength": "strength", "rater": "rater",
    "source": "source", "created_at": "created_at", "rationale": "rationale", "model_a": "model_a",
    "model_b": "model_b", "metadata": "metadata"}
JSON_COLUMNS = ("messages", "metadata")  # stored as JSON text; nested values in JSONL


class ExportError(ValueError):
    """The export cannot be written as asked; the message says what to change."""


def export(store, fmt: str, out, snapshot_id: str | None = None, raters: str | None = None) -> dict:
    """Write the store (or a snapshot of it) to OUT; returns a summary {"format","path","rows",...}."""
    if fmt not in EXPORTERS:
        raise ExportError(f"unknown export format {fmt!r}; use {', '.join(EXPORTERS)}")
    summary = EXPORTERS[fmt](store, Path(out), snapshot_id, raters)
    return {"format": fmt, "path": str(out), **summary, "snapshot_id": snapshot_id, "raters": raters}


def judgment_table(store, snapshot_id: str | None = None, raters: str | None = None) -> pa.Table:
    """Judgments in the export columns, in ingest order."""
    table = store.judgments(snapshot_id, raters)
    return pa.table({name: _plain(table.column(src)) for name, src in JUDGMENT_COLUMNS.items()})


def trl_rows(pairs: pa.Table) -> list[dict]:
    """TRL preference rows from `Store.pairs()`; conversational when the prompt has messages.

    >>> t = pa.table({"prompt": ["2+2?"], "messages": [None], "chosen": ["4"], "rejected": ["5"]})
    >>> trl_rows(t)
    [{'prompt': '2+2?', 'chosen': '4', 'rejected': '5'}]
    """
    rows = []
    for p in pairs.select(["prompt", "messages", "chosen", "rejected"]).to_pylist():
        if p["messages"] is None:
            rows.append({"prompt": p["prompt"], "chosen": p["chosen"], "rejected": p["rejected"]})
        else:
            rows.append({"prompt": json.loads(p["messages"]),
                         "chosen": [{"role": "assistant", "content": p["chosen"]}],
                         "rejected": [{"role": "assistant", "content": p["rejected"]}]})
    return rows


def _export_trl(store, out: Path, snapshot_id, raters) -> dict:
    pairs = store.pairs(snapshot_id, raters)
    resolved = pairs.filter(pc.greater(pairs.column("votes_chosen"), pairs.column("votes_rejected")))
    rows = trl_rows(resolved)
    if out.suffix == ".parquet":
        try:
            _atomic_file(out, lambda tmp: _write_parquet(pa.Table.from_pylist(rows), tmp))
        except pa.ArrowException:
            raise ExportError("the pairs mix plain and conversational prompts, which one Parquet "
                              "column cannot hold; export to a .jsonl OUT instead") from None
    else:
        _atomic_file(out, lambda tmp: _write_jsonl(rows, tmp))
    return {"rows": len(rows), "skipped_unresolved": pairs.num_rows - resolved.num_rows}


def _export_jsonl(store, out: Path, snapshot_id, raters) -> dict:
    table = judgment_table(store, snapshot_id, raters)
    _atomic_file(out, lambda tmp: _write_jsonl(_json_rows(table), tmp))
    return {"rows": table.num_rows}


def _export_parquet(store, out: Path, snapshot_id, raters) -> dict:
    table = judgment_table(store, snapshot_id, raters)
    _atomic_file(out, lambda tmp: _write_parquet(table, tmp))
    return {"rows": table.num_rows}


def _export_hf(store, out: Path, snapshot_id, raters) -> dict:
    import datasets

    if out.exists():
        raise ExportError(f"{out} exists; remove it or choose another folder for the HF dataset")
    splits = {"judgments": judgment_table(store, snapshot_id, raters)}
    feedback = store.feedback(snapshot_id, raters)
    if feedback.num_rows:
        splits["feedback"] = pa.table({name: _plain(feedback.column(name)) for name in
                                       ("id", "prompt", "messages", "completion", "label", "rater")})
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


def _write_jsonl(rows, path: Path) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        for row in rows:
            fh.write(json.dumps(row, ensure_ascii=False) + "\n")


def _write_parquet(table: pa.Table, path: Path) -> None:
    import pyarrow.parquet as pq

    pq.write_table(table, path)


def _atomic_file(out: Path, write: Callable[[Path], None]) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", dir=out.parent)
    os.close(fd)
    try:
        write(Path(tmp))
        os.replace(tmp, out)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
