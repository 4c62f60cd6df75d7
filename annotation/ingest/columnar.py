"""The columnar path's checks: one Arrow record batch of a clean file → staged judgments, or
NeedsPrecise.

Each check is vectorized over the whole chunk and vouches for every row or for none: a chunk with
any row it cannot vouch for (a missing or empty text, an unknown winner, a nested extra column, a
strength that is not a margin in 0..10, a rater that is a number, bytes that are not UTF-8…) raises
NeedsPrecise, and annotation.ingest.batch re-reads the source on the precise path, which names the row
and field. What passes here is what the precise
path would have staged for the same rows (tests/annotation/ingest/test_ingest_formats.py compares them).
"""

from __future__ import annotations

from collections.abc import Callable

import pyarrow as pa
import pyarrow.compute as pc

from annotation.ingest import formats

FAST_COLUMNS = {  # formats the columnar path handles: input column -> staged column
    "judgments": {"prompt": "prompt", "response_a": "response_a", "response_b": "response_b",
                  "winner": "winner"},
    "trl": {"prompt": "prompt", "chosen": "response_a", "rejected": "response_b"},
}
FAST_KNOWN = {"judgments": formats.JUDGMENT_KEYS, "trl": formats.TRL_KEYS}
OPTIONAL_TEXT = ("id", "rater", "source", "rationale", "model_a", "model_b")
# formats.BLANK_RATER in RE2, with every character Python's \s takes (Unicode spaces, U+0085)
BLANK_RATER = r"^(?:human:|ai:)?[\s\p{Z}\x{85}\x{1c}-\x{1f}]*$"


class NeedsPrecise(Exception):
    """The columnar path cannot vouch for this chunk; the precise path redoes the whole source."""


def stage(batch: pa.RecordBatch, fmt: str, offset: int, source_model: str | None) -> pa.Table:
    """Staged judgments (formats.JUDGMENT_SCHEMA) for a clean chunk of `fmt` rows, numbered from
    offset + 1; NeedsPrecise when any row needs a closer look."""
    mapping = FAST_COLUMNS.get(fmt)
    cols = dict(zip(batch.schema.names, batch.columns, strict=False))
    if mapping is None or not set(mapping) <= set(cols) or {"messages", "metadata"} & set(cols):
        raise NeedsPrecise
    n = batch.num_rows
    batch.validate(full=True)  # pyarrow's JSON reader lets bytes that are not UTF-8 into strings
    out = {target: _required_text(cols[name], target == "prompt") for name, target in mapping.items()}
    _require(pc.all(pc.is_in(out.get("winner", pa.array(["a"])), pa.array(formats.WINNERS))))
    if "winner" not in out:  # a TRL pair: chosen is response a, and equal texts state no preference
        out["winner"] = pa.array(["a"] * n, pa.string())
        _require(not pc.any(pc.equal(out["response_a"], out["response_b"])).as_py())
    for name in OPTIONAL_TEXT:
        out[name] = _optional_text(cols.get(name), n)
    out["rater"] = _raters(out["rater"], cols.get("rater"))
    out["source"] = pc.fill_null(out["source"], fmt)
    if source_model:
        out["model_a"], out["model_b"] = (pc.fill_null(out[k], source_model) for k in ("model_a", "model_b"))
    out["strength"] = _strength(cols.get("strength"), n)
    out["created_at"] = _python_column(cols.get("created_at"), n, formats.timestamp, "created_at")
    out["metadata"] = _metadata(batch, FAST_KNOWN[fmt])
    out["row"] = pa.array(range(offset + 1, offset + n + 1), pa.int64())
    out["messages"] = pa.nulls(n, pa.string())
    return pa.table({f.name: out[f.name] for f in formats.JUDGMENT_SCHEMA}, schema=formats.JUDGMENT_SCHEMA)


def _require(ok) -> None:
    if not (ok.as_py() if isinstance(ok, pa.Scalar) else ok):
        raise NeedsPrecise


def _is_text(column) -> bool:
    return pa.types.is_string(column.type) or pa.types.is_large_string(column.type)


def _required_text(column, non_empty: bool) -> pa.Array:
    _require(_is_text(column) and column.null_count == 0)
    column = column.cast(pa.string())
    if non_empty and len(column):
        _require(pc.min(pc.utf8_length(column)).as_py() > 0)
    return column


def _optional_text(column, n: int) -> pa.Array:
    if column is None or pa.types.is_null(column.type):
        return pa.nulls(n, pa.string())
    _require(_is_text(column) or pa.types.is_integer(column.type))
    column = column.cast(pa.string())
    return pc.if_else(pc.equal(column, ""), pa.scalar(None, pa.string()), column)


def _raters(column: pa.Array, given) -> pa.Array:
    """formats.rater on a column: text only (an integer column is a number per row, refused there),
    at most RATER_MAX_CHARS, no control characters, no bare prefix, not spaces alone."""
    _require(given is None or pa.types.is_null(given.type) or _is_text(given))
    if column.null_count < len(column):
        _require(pc.max(pc.utf8_length(column)).as_py() <= formats.RATER_MAX_CHARS)
        _require(not pc.any(pc.match_substring_regex(column, formats.CONTROL_CHARS.pattern)).as_py())
        _require(not pc.any(pc.is_in(column, pa.array(formats.RATER_PREFIXES))).as_py())
        _require(not pc.any(pc.match_substring_regex(column, BLANK_RATER)).as_py())
    column = pc.fill_null(column, formats.ANONYMOUS)
    known = pc.or_(pc.starts_with(column, "human:"), pc.starts_with(column, "ai:"))
    return pc.if_else(known, column, pc.binary_join_element_wise("human:", column, ""))


def _strength(column, n: int) -> pa.Array:
    if column is None or pa.types.is_null(column.type):
        return pa.nulls(n, pa.float64())
    if _is_text(column):
        column = pc.if_else(pc.equal(column, ""), pa.scalar(None, column.type), column)
    _require(_is_text(column) or pa.types.is_integer(column.type) or pa.types.is_floating(column.type))
    values = column.cast(pa.float64())  # ArrowInvalid on text that is not a number -> precise path
    _require(pc.all(pc.is_finite(values)).as_py() in (True, None))
    if values.null_count < n:  # formats.strength: a Bradley-Terry margin, 0..STRENGTH_MAX
        bounds = pc.min_max(values)
        _require(bounds["min"].as_py() >= 0.0 and bounds["max"].as_py() <= formats.STRENGTH_MAX)
    return values


def _python_column(column, n: int, parse: Callable, name: str) -> pa.Array:
    if column is None or column.null_count == n:
        return pa.nulls(n, pa.timestamp("us"))
    try:
        return pa.array([parse({name: v}) for v in column.to_pylist()], pa.timestamp("us"))
    except formats.RowError:
        raise NeedsPrecise from None


def _metadata(batch: pa.RecordBatch, known: set) -> pa.Array:
    extra = [name for name in batch.schema.names if name not in known]
    if not extra:
        return pa.nulls(batch.num_rows, pa.string())
    _require(not any(pa.types.is_nested(batch.schema.field(name).type) for name in extra))
    rows = batch.select(extra).to_pylist()
    return pa.array([formats.metadata(row, set()) for row in rows], pa.string())
