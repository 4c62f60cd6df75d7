"""The ids one batch has written lately, so that the batch writes each prompt, response and judgment once.

prompts, responses and judgments have no PRIMARY KEY (an ART index cost 4/5 of ingest time, see
schema.sql). A batch therefore flags each staged row's ids as new or not, writes only the new ones,
and at its end lets bulk.drop_earlier_ids drop the copies of ids that were in the store before it.

Memory is bounded: the sets hold at most MAX_IDS ids. A batch with more forgets them all and goes
on; an id it forgot may then be written twice, so `forgot` names the tables whose later copies
drop_earlier_ids must also look for inside the batch (one GROUP BY in DuckDB, which spills).
Repeats are usually close together (a pair judged in both orders, by several judges), so the
recent ids still keep most of them from being written at all.

    >>> import pyarrow as pa
    >>> seen = SeenIds()
    >>> x, y = "x" * 24, "y" * 24  # content ids are 24 characters
    >>> chunk = pa.table({"pid": ["p", "p"], "rid_a": [x, y], "rid_b": [y, x],
    ...                   "jid": ["j1", "j1"], "id": pa.nulls(2, pa.string())})
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

# staged kind -> (flag column, id column) of its responses, in the order they are written
RESPONSE_FLAGS = {"judgments": (("new_a", "rid_a"), ("new_b", "rid_b")), "feedback": (("new_r", "rid"),)}
MAX_IDS = 4_000_000  # ~400 MB of ids in Python sets: a million-judgment file keeps all of its ids


class SeenIds:
    """Prompt, response and judgment ids written by this batch, the latest MAX_IDS of them.

    Ids are kept as ASCII bytes, which Python hashes and stores faster than str (about 100 bytes
    each with the set's slot)."""

    def __init__(self) -> None:
        self.sets: dict[str, set[bytes]] = {"prompts": set(), "responses": set(), "judgments": set()}
        self.max_ids = MAX_IDS
        self.forgot: set[str] = set()  # tables whose ids were forgotten: copies inside the batch possible
        self.own_ids = False  # some row carried an `id`: it may name a row of an older export

    def flag(self, kind: str, staged: pa.Table) -> pa.Table:
        """`staged` (with ids.with_ids' columns) plus boolean new_* columns."""
        if sum(map(len, self.sets.values())) > self.max_ids:
            self.forgot.update(name for name, ids in self.sets.items() if ids)
            self.sets = {name: set() for name in self.sets}
        flags = {"new_p": _first_prompt_rows(staged.column("pid"), self.sets["prompts"])}
        for flag, column in RESPONSE_FLAGS[kind]:
            flags[flag] = _first_rows(staged.column(column), self.sets["responses"])
        if staged.column("id").null_count < staged.num_rows:
            self.own_ids = True
        flags["new_j"] = _first_rows(staged.column("jid"), self.sets["judgments"])
        for name, values in flags.items():
            staged = staged.append_column(name, pa.array(values, pa.bool_()))
        return staged


def _first_prompt_rows(ids, seen: set[bytes]) -> np.ndarray:
    """_first_rows for prompt ids, which come many rows each: each distinct id is looked up once."""
    codes = pc.dictionary_encode(_plain(ids))
    _, first_rows = np.unique(codes.indices.to_numpy(), return_index=True)
    new = np.zeros(len(ids), dtype=bool)
    new[first_rows[_first_rows(codes.dictionary, seen)]] = True
    return new


def _plain(ids) -> pa.Array:
    return ids.combine_chunks() if isinstance(ids, pa.ChunkedArray) else ids


def _first_rows(ids, seen: set[bytes]) -> np.ndarray:
    """True at the first row of each id new to `seen` (which learns them); ids are never null here.
    map() drives the set's methods, in C; the rows are searched for repeats only when some new id
    came twice (prompt ids do; response ids seldom)."""
    ids = _plain(ids)
    values = ids.cast(pa.binary()).to_pylist()
    new = ~np.fromiter(map(seen.__contains__, values), dtype=bool, count=len(values))
    size = len(seen)
    seen.update(values)
    if len(seen) - size < new.sum():
        _, first_rows = np.unique(pc.dictionary_encode(ids).indices.to_numpy(), return_index=True)
        first = np.zeros(len(values), dtype=bool)
        first[first_rows] = True
        new &= first
    return new
