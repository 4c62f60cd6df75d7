"""The ids one batch has written so far, so that the batch writes each prompt, response and judgment once.

prompts, responses and judgments have no PRIMARY KEY (an ART index cost 4/5 of ingest time, see
schema.sql). A batch therefore flags each staged row's ids as first-in-batch or not, writes only the
first ones, and at its end lets bulk.drop_earlier_ids drop those that were in the store before the batch.

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


class SeenIds:
    """Prompt, response and judgment ids written by this batch.

    Ids are kept as ASCII bytes, which Python hashes and stores faster than str: memory grows with
    the batch's distinct ids (about 90 bytes each), not with its text."""

    def __init__(self) -> None:
        self.prompts: set[bytes] = set()
        self.responses: set[bytes] = set()
        self.judgments: set[bytes] = set()
        self.own_ids = False  # some row carried an `id`: it may name a row of an older export

    def flag(self, kind: str, staged: pa.Table) -> pa.Table:
        """`staged` (with ids.with_ids' columns) plus boolean new_* columns."""
        flags = {"new_p": _first_rows(staged.column("pid"), self.prompts)}
        for flag, column in RESPONSE_FLAGS[kind]:
            flags[flag] = _first_rows(staged.column(column), self.responses)
        if staged.column("id").null_count < staged.num_rows:
            self.own_ids = True
        flags["new_j"] = _first_rows(staged.column("jid"), self.judgments)
        for name, values in flags.items():
            staged = staged.append_column(name, pa.array(values, pa.bool_()))
        return staged


def _first_rows(ids, seen: set[bytes]) -> np.ndarray:
    """True at the first row of each id new to `seen` (which learns them); ids are never null here.
    map() drives the set's methods, in C; the rows are searched for repeats only when some new id
    came twice (prompt ids do; response ids seldom)."""
    ids = ids.combine_chunks() if isinstance(ids, pa.ChunkedArray) else ids
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
