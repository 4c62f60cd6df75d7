"""Content-derived ids: the same text is one row however often it arrives.

`content_id(*parts)` is the first 24 hex characters of sha256 over the parts joined by the unit
separator 0x1f; in SQL (set-based ingest) the same value is
`left(sha256(concat_ws(chr(31), part1, part2, ...)), 24)`. A prompt's id hashes its text, or the
canonical JSON of its messages; a response's id hashes its prompt's id and its text. Ingest hashes
a column at a time (`with_ids`, `keyed_ids`), in C when annotation/_hashes.c was built.

    >>> prompt_id("What is 2+2?") == content_id("What is 2+2?")
    True
    >>> response_id(prompt_id("hi"), "x") == response_id(prompt_id("hi"), "y")
    False
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

try:  # the C loops for content ids in bulk (annotation/_hashes.c); optional at install time
    from annotation import _hashes
except ImportError:
    _hashes = None

ID_SEPARATOR = "\x1f"


def content_id(*parts: str) -> str:
    """24 hex characters of sha256 over the parts joined by the unit separator (0x1f)."""
    return hashlib.sha256(ID_SEPARATOR.join(parts).encode("utf-8")).hexdigest()[:24]


def canonical_json(value) -> str:
    return json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(",", ":"))


def prompt_id(prompt: str | Sequence[dict]) -> str:
    """Id of a prompt given as text or as a list of {"role", "content"} messages."""
    return content_id(prompt if isinstance(prompt, str) else canonical_json(list(prompt)))


def response_id(prompt_key: str, text: str) -> str:
    return content_id(prompt_key, text)


def render_messages(messages: Sequence[dict]) -> str:
    """Plain-text rendering of a conversation, used as prompts.text when no chat template applies."""
    return "\n\n".join(f"{m['role']}: {m['content']}" for m in messages)


# --- content ids of staged rows, a column at a time ----------------------------------------------------------------

STAGED_RESPONSES = {"judgments": {"rid_a": "response_a", "rid_b": "response_b"},
                    "feedback": {"rid": "completion"}}


def with_ids(kind: str, staged: pa.Table, sha256: str) -> pa.Table:
    """Staged rows plus their content ids (content_id): pid over the prompt key (text, or the
    canonical messages JSON), rid_a/rid_b (or rid) over (prompt key, text), and jid: the row's own id,
    else (batch sha256, row number); with `sha256=None` only the rows' own ids, for
    fill_judgment_ids to complete once the sha256 is known. Runs without DuckDB, so a reader thread
    hashes while it writes.

    >>> from annotation.ingest.formats import JUDGMENT_SCHEMA
    >>> t = pa.Table.from_pylist([{"row": 1, "prompt": "p", "response_a": "x", "response_b": "y"}],
    ...                          schema=JUDGMENT_SCHEMA)
    >>> with_ids("judgments", t, "s").column("rid_a")[0].as_py() == content_id("p", "x")
    True
    """
    keys = pc.coalesce(staged.column("messages"), staged.column("prompt")).combine_chunks()
    keys = keys.dictionary_encode()  # many rows share a prompt: hash each distinct one once
    pids = pa.array([content_id(k) for k in keys.dictionary.to_pylist()], pa.string())
    ids = {"pid": pids.take(keys.indices)}
    for name, column in STAGED_RESPONSES[kind].items():
        ids[name] = keyed_ids(keys.dictionary, keys.indices, staged.column(column))
    ids["jid"] = staged.column("id")
    for name, values in ids.items():
        staged = staged.append_column(name, values)
    return staged if sha256 is None else fill_judgment_ids(staged, sha256)


def fill_judgment_ids(staged: pa.Table, sha256: str) -> pa.Table:
    """jid where a row brought no id of its own: content_id(batch sha256, row number)."""
    rows = pc.cast(staged.column("row"), pa.string())
    generated = keyed_ids(pa.array([sha256], pa.string()),
                          pa.array(np.zeros(staged.num_rows, np.int32)), rows)
    index = staged.schema.get_field_index("jid")
    return staged.set_column(index, "jid", pc.coalesce(staged.column("jid"), generated))


def keyed_ids(keys: pa.Array, key_of_row: pa.Array, texts) -> pa.Array:
    """content_id(keys[key_of_row[i]], texts[i]) for every row, as an Arrow string array.

    Uses the C loop of annotation/_hashes.c when it was built (about 8x faster, and it lets go of
    the GIL); else the same hashes in Python.

    >>> ids = keyed_ids(pa.array(["p", "q"]), pa.array([1, 0], pa.int32()), pa.array(["x", "y"]))
    >>> ids.to_pylist() == [content_id("q", "x"), content_id("p", "y")]
    True
    """
    texts = _plain_strings(texts)
    if texts.null_count:
        raise ValueError("staged response texts cannot be null")
    keys, key_of_row = _plain_strings(keys), key_of_row.cast(pa.int32())
    if _hashes is None:
        return pa.array(_python_keyed_ids(keys, key_of_row, texts), pa.string())
    key_offsets, key_data = string_buffers(keys)
    text_offsets, text_data = string_buffers(texts)
    rows = memoryview(key_of_row.buffers()[1]).cast("i")[key_of_row.offset:][:len(key_of_row)]
    hex_ids = _hashes.hex24(key_offsets, key_data, rows, text_offsets, text_data, len(texts))
    offsets = pa.py_buffer(np.arange(0, 24 * len(texts) + 1, 24, dtype=np.int32))
    return pa.Array.from_buffers(pa.string(), len(texts), [None, offsets, pa.py_buffer(hex_ids)])


def _plain_strings(column) -> pa.Array:
    column = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    return column.cast(pa.string())


def string_buffers(array: pa.Array) -> tuple[memoryview, memoryview]:
    """An Arrow string array's offsets (from its own first row) and bytes, for annotation._hashes."""
    _, offsets, data = array.buffers()
    offsets = memoryview(offsets).cast("i")[array.offset:][:len(array) + 1]
    return offsets, memoryview(data) if data is not None else memoryview(b"")


def _python_keyed_ids(keys: pa.Array, key_of_row: pa.Array, texts: pa.Array) -> list[str]:
    """The fallback: each key's sha256 state over "key\x1f" copied per row, then fed the text's
    UTF-8 bytes where Arrow holds them."""
    heads = [hashlib.sha256((k + ID_SEPARATOR).encode("utf-8")) for k in keys.to_pylist()]
    offsets, data = string_buffers(texts)
    ends = offsets.tolist()
    out = []
    append = out.append  # bound once: this loop runs per response
    for k, start, end in zip(key_of_row.to_pylist(), ends[:-1], ends[1:], strict=True):
        digest = heads[k].copy()
        digest.update(data[start:end])
        append(digest.hexdigest()[:24])
    return out
