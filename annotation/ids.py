"""Content-derived ids: the same text is one row however often it arrives.

`content_id(*parts)` is the first 24 hex characters of sha256 over the parts joined by the unit
separator 0x1f; in SQL (set-based ingest) the same value is
`left(sha256(concat_ws(chr(31), part1, part2, ...)), 24)`. A prompt's id hashes its text, or the
canonical JSON of its messages; a response's id hashes its prompt's key and its text; a judgment's
id hashes what the judgment is (`judgment_content`: rater, the responses in their shown order, verdict,
strength, time, the models that wrote the responses) and the row's own id where it brought one, so the same judgment by any route (a
file, its .gz, HTTP, a dataset, an export read back) is one row, and a rater's deliberate repeat is
kept when its row says so (an id or a time of its own). Ingest hashes a column at a time (`with_ids`).

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

try:  # setup.py builds it where a C compiler and OpenSSL's headers are
    from annotation import _sha256 as native
except ImportError:
    native = None

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


def with_ids(kind: str, staged: pa.Table) -> pa.Table:
    """Staged rows plus their content ids (content_id): pid over the prompt key (text, or the
    canonical messages JSON), rid_a/rid_b (or rid) over (prompt key, text), jid over the row's
    content (judgment_ids, feedback_ids) and given_id, the row's own id where it is part of jid.
    Runs without DuckDB, so a reader thread hashes while it writes.

    >>> from annotation.ingest.formats import JUDGMENT_SCHEMA
    >>> t = pa.Table.from_pylist([{"row": 1, "prompt": "p", "response_a": "x", "response_b": "y",
    ...                            "winner": "a", "rater": "human:r"}], schema=JUDGMENT_SCHEMA)
    >>> staged = with_ids("judgments", t)
    >>> staged.column("rid_a")[0].as_py() == content_id("p", "x")
    True
    >>> staged.column("jid")[0].as_py() == content_id("human:r", content_id("p", "x"),
    ...                                                content_id("p", "y"), "a", "", "", "", "", "")
    True
    """
    keys = pc.coalesce(staged.column("messages"), staged.column("prompt")).combine_chunks()
    keys = keys.dictionary_encode()  # many rows share a prompt: hash each distinct one once
    pids = pa.array([content_id(k) for k in keys.dictionary.to_pylist()], pa.string())
    ids = {"pid": pids.take(keys.indices)}
    for name, column in STAGED_RESPONSES[kind].items():
        ids[name] = keyed_ids(keys.dictionary, keys.indices, staged.column(column))
    content = CONTENT[kind]({**{n: staged.column(n) for n in staged.column_names}, **ids})
    ids["jid"], ids["given_id"] = row_ids(content, staged.column("id"))
    for name, values in ids.items():
        staged = staged.append_column(name, values)
    return staged


def judgment_content(columns: dict) -> list:
    """What a judgment is, in the order its id hashes it: rater, the two responses as shown (their
    ids carry the prompt and the texts), the verdict, its strength, its time, and the models that
    wrote the two responses where the row names them (two models can write the same text, and a
    judge that compared both pairs cast two votes). The same in SQL is schema.sql's `judgment_id`,
    which the store's migration uses."""
    model_a, model_b = vote_models(columns["metadata"])
    return [columns["rater"], columns["rid_a"], columns["rid_b"], columns["winner"],
            strength_texts(columns["strength"]), time_texts(columns["created_at"]), model_a, model_b]


def vote_models(metadata) -> tuple[pa.Array, pa.Array]:
    """The text values of model_a and model_b in each row's metadata JSON (ingest keeps a row's
    model columns there, and an export's metadata brings them back), null where absent.

    >>> [m.to_pylist() for m in vote_models(pa.array(['{"model_a":"x","model_b":7}', None, '{}']))]
    [['x', None, None], [None, None, None]]
    """
    metadata = _plain_strings(metadata)
    named = pc.fill_null(pc.match_substring(metadata, '"model_'), False)
    if not pc.any(named).as_py():
        return pa.nulls(len(metadata), pa.string()), pa.nulls(len(metadata), pa.string())
    values = [json.loads(m) if m is not None else {} for m in metadata.filter(named).to_pylist()]
    out = []
    for key in ("model_a", "model_b"):
        found = pa.array([v.get(key) if isinstance(v.get(key), str) else None for v in values], pa.string())
        out.append(pc.replace_with_mask(pa.nulls(len(metadata), pa.string()), named, found))
    return out[0], out[1]


def feedback_content(columns: dict) -> list:
    """What a feedback row is: rater, the response (its id carries the prompt) and the label."""
    return [columns["rater"], columns["rid"], pc.cast(columns["label"], pa.string())]


CONTENT = {"judgments": judgment_content, "feedback": feedback_content}


def row_ids(content: list, given) -> tuple[pa.Array, pa.Array]:
    """(ids, given ids): content_id(*content, given id) per row, where a row's own id is part of
    its identity unless it is that row's id without one (an export of a row that came without an
    id carries its content id). Nulls hash as empty text.

    >>> ids, given = row_ids([pa.array(["a", "a"])], pa.array([None, "k"]))
    >>> ids.to_pylist() == [content_id("a", ""), content_id("a", "k")], given.to_pylist()
    (True, [None, 'k'])
    >>> row_ids([pa.array(["a"])], pa.array([content_id("a", "")]))[1].to_pylist()
    [None]
    """
    given = _plain_strings(given)
    empty = pa.nulls(len(given), pa.string())
    ids = joined_ids([*content, empty])
    keyed = pc.fill_null(pc.not_equal(given, ids), False)
    if not pc.any(keyed).as_py():
        return ids, empty
    given = pc.if_else(keyed, given, empty)
    rows = [_plain_strings(c).filter(keyed) for c in content]
    return pc.replace_with_mask(ids, keyed, joined_ids([*rows, given.filter(keyed)])), given


def joined_ids(columns: list) -> pa.Array:
    """content_id(*parts) of each row's parts (nulls as empty text).

    >>> ids = joined_ids([pa.array(["a", None]), pa.array(["b", "c"])])
    >>> ids.to_pylist() == [content_id("a", "b"), content_id("", "c")]
    True
    """
    joined = pc.binary_join_element_wise(*[_plain_strings(c) for c in columns], ID_SEPARATOR,
                                         null_handling="replace", null_replacement="")
    if native is not None:
        heads = pa.array([""], pa.string())
        return _hex_prefixes(_c_digests(heads, np.zeros(len(joined), np.int32), joined), len(joined))
    digests = b"".join(map(_SHA256.digest, map(hashlib.sha256, joined.cast(pa.binary()).to_pylist())))
    return _hex_prefixes(digests, len(joined))


def strength_texts(column) -> pa.Array:
    """A strength as hashed: printf's %.17g (DuckDB's printf gives the same text), null when none.

    >>> strength_texts(pa.array([1.0, None, 0.1])).to_pylist()
    ['1', None, '0.10000000000000001']
    """
    column = _plain(column)
    if column.null_count == len(column):
        return pa.nulls(len(column), pa.string())
    return pa.array([None if x is None else f"{x:.17g}" for x in column.to_pylist()], pa.string())


def time_texts(column) -> pa.Array:
    """A time as hashed: microseconds since the epoch (DuckDB: epoch_us), null when none."""
    return pc.cast(pc.cast(_plain(column), pa.timestamp("us")).cast(pa.int64()), pa.string())


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
    if native is not None:
        heads = pc.binary_join_element_wise(_plain_strings(keys), "", ID_SEPARATOR)
        rows = key_of_row.to_numpy(zero_copy_only=False).astype(np.int32, copy=False)
        return _hex_prefixes(_c_digests(heads, rows, texts), len(texts))
    heads = np.empty(len(keys), dtype=object)  # filled after: numpy must not iterate the hashes
    heads[:] = [hashlib.sha256(f"{k}{ID_SEPARATOR}".encode()) for k in _plain_strings(keys).to_pylist()]
    rows = list(map(_SHA256.copy, heads[key_of_row.to_numpy(zero_copy_only=False)]))
    collections.deque(map(_SHA256.update, rows, texts.cast(pa.binary()).to_pylist()), maxlen=0)
    return _hex_prefixes(b"".join(map(_SHA256.digest, rows)), len(texts))


def _c_digests(heads: pa.Array, head_of_row: np.ndarray, texts: pa.Array) -> bytes:
    """sha256(heads[head_of_row[i]] + texts[i]) of every row, concatenated (annotation/_sha256.c)."""
    return native.digests(*string_layout(heads), np.ascontiguousarray(head_of_row), *string_layout(texts))


def string_layout(strings: pa.Array) -> tuple[np.ndarray, pa.Buffer]:
    """A string array's (or a string chunked array's) int32 offsets (n + 1, its slice offset applied) and its data buffer."""
    strings = _plain_strings(strings)
    if not len(strings):
        return np.zeros(1, np.int32), pa.py_buffer(b"")
    offsets = np.frombuffer(strings.buffers()[1], np.int32)[strings.offset:strings.offset + len(strings) + 1]
    return offsets, strings.buffers()[2] or pa.py_buffer(b"")


def _plain(column) -> pa.Array:
    return column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column


def _plain_strings(column) -> pa.Array:
    return _plain(column).cast(pa.string())


def _hex_prefixes(digests: bytes, n: int) -> pa.Array:
    """The first ID_CHARS hex characters of each of n concatenated sha256 digests, as Arrow strings."""
    head = np.frombuffer(digests, dtype=np.uint8).reshape(n, hashlib.sha256().digest_size)
    return hex_ids(head[:, :ID_CHARS // 2])


def hex_ids(id_bytes: np.ndarray) -> pa.Array:
    """Rows of ID_CHARS // 2 bytes as ids of ID_CHARS lowercase hex characters, as Arrow strings.

    >>> hex_ids(np.array([range(12)], np.uint8)).to_pylist()
    ['000102030405060708090a0b']
    """
    n = len(id_bytes)
    chars = _HEX_PAIRS[id_bytes]
    offsets = np.arange(0, ID_CHARS * n + 1, ID_CHARS, dtype=np.int32)
    return pa.Array.from_buffers(pa.string(), n, [None, pa.py_buffer(offsets), pa.py_buffer(chars)])
