"""The ids one batch has written lately, so that the batch writes each prompt, response and judgment once.

prompts, responses and judgments have no PRIMARY KEY (an ART index cost 4/5 of ingest time, see
schema.sql). A batch therefore flags each staged row's ids as new or not, writes only the new ones,
and at its end lets bulk.drop_earlier_ids drop the copies of ids that were in the store before it.

Memory is bounded: the tables hold at most MAX_IDS ids. A batch with more forgets them all and goes
on; an id it forgot may then be written twice, so `forgot` names the tables whose later copies
drop_earlier_ids must also look for inside the batch (one GROUP BY in DuckDB, which spills).
Repeats are usually close together (a pair judged in both orders, by several judges), so the
recent ids still keep most of them from being written at all.

    >>> import pyarrow as pa
    >>> seen = SeenIds()
    >>> p, j, x, y = "0" * 24, "1" * 24, "a" * 24, "b" * 24  # content ids: 24 hex characters
    >>> chunk = pa.table({"pid": [p, p], "rid_a": [x, y], "rid_b": [y, x],
    ...                   "jid": [j, j], "id": pa.nulls(2, pa.string())})
    >>> flagged = seen.flag("judgments", chunk)
    >>> [flagged.column(c).to_pylist() for c in ("new_p", "new_a", "new_b", "new_j")]
    [[True, False], [True, True], [False, False], [True, False]]
    >>> seen.flag("judgments", chunk).column("new_a").to_pylist()  # the next chunk: all known
    [False, False]
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from annotation.ids import hex_ids, native, string_layout

# staged kind -> (flag column, id column) of its responses, in the order they are written
RESPONSE_FLAGS = {"judgments": (("new_a", "rid_a"), ("new_b", "rid_b")), "feedback": (("new_r", "rid"),)}
MAX_IDS = 4_000_000  # a million-judgment file keeps all of its ids (~400 MB in Python sets)
FIRST_IDS = 1 << 15  # an IdTable's first room; it grows as ids come


class SeenIds:
    """Prompt, response and judgment ids written by this batch, the latest MAX_IDS of them: in C
    tables where annotation/_sha256.c is built (IdTable), else in Python sets (IdSet)."""

    def __init__(self) -> None:
        self.sets = _empty_sets()
        self.max_ids = MAX_IDS
        self.forgot: set[str] = set()  # tables whose ids were forgotten: copies inside the batch possible
        self.own_ids = False  # some row carried an `id`: it may name a row of an older export

    def release(self) -> None:
        """Free the ids' memory once no more rows will be flagged (forgot and own_ids stay)."""
        self.sets = None

    def flag(self, kind: str, staged: pa.Table) -> pa.Table:
        """`staged` (with ids.with_ids' columns) plus boolean new_* columns."""
        if sum(map(len, self.sets.values())) > self.max_ids:
            self.forgot.update(name for name, ids in self.sets.items() if len(ids))
            for ids in self.sets.values():
                ids.clear()
        flags = {"new_p": _first_prompt_rows(staged.column("pid"), self.sets["prompts"])}
        for flag, column in RESPONSE_FLAGS[kind]:
            flags[flag] = self.sets["responses"].first_rows(staged.column(column))
        if staged.column("id").null_count < staged.num_rows:
            self.own_ids = True
        flags["new_j"] = self.sets["judgments"].first_rows(staged.column("jid"))
        for name, values in flags.items():
            staged = staged.append_column(name, pa.array(values, pa.bool_()))
        return staged


def _empty_sets() -> dict:
    kind = IdSet if native is None else IdTable
    return {"prompts": kind(), "responses": kind(), "judgments": kind()}


class IdTable:
    """Content ids in an open-addressing table of 16-byte slots, filled in C without the GIL
    (annotation/_sha256.c `first_new`). The table starts small and, past half full, grows to the
    next power of two that is at most half full: a table made for MAX_IDS at once costs its whole
    size in freshly zeroed pages at its first ids, and most batches are far smaller."""

    def __init__(self) -> None:
        self.words = np.zeros(2 * _capacity(FIRST_IDS), np.uint64)
        self.size = 0

    def __len__(self) -> int:
        return self.size

    def clear(self) -> None:
        """Forget every id, keeping the room: its pages are in memory already."""
        self.words.fill(0)
        self.size = 0

    def first_rows(self, ids) -> np.ndarray:
        """True at the first row of each id new to the table, which learns them."""
        if 2 * (self.size + len(ids)) > len(self.words) // 2:
            self._grow(self.size + len(ids))
        new = np.zeros(len(ids), np.uint8)
        self.size += native.first_new(self.words, *string_layout(ids), new)
        return new.view(bool)

    def _grow(self, size: int) -> None:
        old = self.words.reshape(-1, 2)
        self.words = np.zeros(2 * _capacity(size), np.uint64)
        self.size = 0
        self.first_rows(_slot_ids(old[old[:, 1] != 0]))


def _capacity(ids: int) -> int:
    """The power of two that holds `ids` at most half full."""
    return 1 << max(10, int(2 * ids - 1).bit_length())


def _slot_ids(slots: np.ndarray) -> pa.Array:
    """The ids of IdTable slots (first 64 bits, then 2^32 + the last 32), as 24 hex characters."""
    first = slots[:, 0].astype(">u8").view(np.uint8).reshape(-1, 8)
    last = slots[:, 1].astype(np.uint32).astype(">u4").view(np.uint8).reshape(-1, 4)
    return hex_ids(np.concatenate([first, last], axis=1))


class IdSet:
    """Content ids as ASCII bytes in a Python set (about 100 bytes each with the set's slot)."""

    def __init__(self) -> None:
        self.ids: set[bytes] = set()

    def __len__(self) -> int:
        return len(self.ids)

    def clear(self) -> None:
        self.ids.clear()

    def first_rows(self, ids) -> np.ndarray:
        """True at the first row of each id new to the set, which learns them. map() drives the
        set's methods, in C; the rows are searched for repeats only when some new id came twice."""
        ids = _plain(ids)
        values = ids.cast(pa.binary()).to_pylist()
        new = ~np.fromiter(map(self.ids.__contains__, values), dtype=bool, count=len(values))
        size = len(self.ids)
        self.ids.update(values)
        if len(self.ids) - size < new.sum():
            _, first_rows = np.unique(pc.dictionary_encode(ids).indices.to_numpy(), return_index=True)
            first = np.zeros(len(values), dtype=bool)
            first[first_rows] = True
            new &= first
        return new


def _first_prompt_rows(ids, seen) -> np.ndarray:
    """first_rows for prompt ids, which come many rows each: each distinct id is looked up once."""
    codes = pc.dictionary_encode(_plain(ids))
    _, first_rows = np.unique(codes.indices.to_numpy(), return_index=True)
    new = np.zeros(len(ids), dtype=bool)
    new[first_rows[seen.first_rows(codes.dictionary)]] = True
    return new


def _plain(ids) -> pa.Array:
    return ids.combine_chunks() if isinstance(ids, pa.ChunkedArray) else ids
