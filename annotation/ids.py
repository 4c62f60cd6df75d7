"""Content-derived ids: the same text is one row however often it arrives.

`content_id(*parts)` is the first 24 hex characters of sha256 over the parts joined by the unit
separator 0x1f; in SQL (set-based ingest) the same value is
`left(sha256(concat_ws(chr(31), part1, part2, ...)), 24)`. A prompt's id hashes its text, or the
canonical JSON of its messages; a response's id hashes its prompt's id and its text. Ingest hashes
a column at a time (`with_ids`, `keyed_ids`).

    >>> prompt_id("What is 2+2?") == content_id("What is 2+2?")
    True
    >>> response_id(prompt_id("hi"), "x") == response_id(prompt_id("hi"), "y")
    False
"""

from __future__ import annotations

import collections
import hashlib
import json
from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

ID_SEPARATOR = "\x1f"
ID_CHARS = 24
_SHA256 = type(hashlib.sha256())  # its unbound methods let map() call them row by row, in C
_HEX_PAIRS = np.frombuffer("".join(f"{i:02x}" for i in range(256)).encode(), dtype=np.uint16)  # byte -> 2 chars


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
    """jid where a row has none yet (it brought no id of its own, and none was generated before):
    content_id(batch sha256, row number).

    >>> t = pa.table({"row": [1, 2], "jid": ["own", None]})
    >>> fill_judgment_ids(t, "s").column("jid").to_pylist() == ["own", content_id("s", "2")]
    True
    """
    jids = _plain_strings(staged.column("jid"))
    if not jids.null_count:
        return staged
    missing = jids.is_null()
    rows = pc.cast(staged.column("row").filter(missing), pa.string())
    generated = keyed_ids(pa.array([sha256]), pa.array(np.zeros(len(rows), np.int32)), rows)
    index = staged.schema.get_field_index("jid")
    return staged.set_column(index, "jid", pc.replace_with_mask(jids, missing, generated))


def keyed_ids(keys: pa.Array, key_of_row: pa.Array, texts) -> pa.Array:
    """content_id(keys[key_of_row[i]], texts[i]) for every row, as an Arrow string array.

    Each distinct key's sha256 state over "key\x1f" is computed once and copied per row, then fed
    the row's text; map() drives hashlib's methods, so no Python bytecode runs per row.

    >>> ids = keyed_ids(pa.array(["p", "q"]), pa.array([1, 0], pa.int32()), pa.array(["x", "y"]))
    >>> ids.to_pylist() == [content_id("q", "x"), content_id("p", "y")]
    True
    """
    texts = _plain_strings(texts)
    if texts.null_count:
        raise ValueError("staged response texts cannot be null")
    heads = np.empty(len(keys), dtype=object)  # filled after: numpy must not iterate the hashes
    heads[:] = [hashlib.sha256(f"{k}{ID_SEPARATOR}".encode()) for k in _plain_strings(keys).to_pylist()]
    rows = list(map(_SHA256.copy, heads[key_of_row.to_numpy(zero_copy_only=False)]))
    collections.deque(map(_SHA256.update, rows, texts.cast(pa.binary()).to_pylist()), maxlen=0)
    return _hex_prefixes(b"".join(map(_SHA256.digest, rows)), len(texts))


def _plain_strings(column) -> pa.Array:
    column = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    return column.cast(pa.string())


def _hex_prefixes(digests: bytes, n: int) -> pa.Array:
    """The first ID_CHARS hex characters of each of n concatenated sha256 digests, as Arrow strings."""
    head = np.frombuffer(digests, dtype=np.uint8).reshape(n, hashlib.sha256().digest_size)
    chars = _HEX_PAIRS[head[:, :ID_CHARS // 2]]
    offsets = np.arange(0, ID_CHARS * n + 1, ID_CHARS, dtype=np.int32)
    return pa.Array.from_buffers(pa.string(), n, [None, pa.py_buffer(offsets), pa.py_buffer(chars)])
