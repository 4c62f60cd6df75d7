"""A stream of staged chunks, split so that a whole batch is one INSERT per table.

DuckDB writes a batch fastest as one statement per table: it then compresses and writes each full
row group while the statement runs. Thousands of small INSERTs into one transaction instead leave
all the work to COMMIT, on one thread, after the reader has finished (measured: 3 s of a 7 s ingest
of 300k judgments). Staged chunks hold the response texts (most of the bytes) and everything else
(ids, flags, prompt texts, small columns). `Spool` turns the chunks into

- `responses()`: an Arrow stream of the new response rows, for one INSERT INTO responses that
  pulls chunk after chunk, so the reader thread keeps parsing while DuckDB writes; and
- `rest()`: the rest of every chunk, written aside as it streams past to an Arrow file in a
  temporary folder and read back once the stream is done (prompt texts only for rows that write a
  new prompt), for the INSERTs into prompts and into judgments or feedback. A spool under
  MAP_BYTES is memory-mapped (DuckDB scans a mapped table in parallel, but each page it has read
  counts in the process's memory until the map closes); a larger one is scanned as a dataset, the
  columns each INSERT needs a record batch at a time, so memory stays bounded at any size.

Memory stays bounded: the stream holds a chunk or two, and the rest lives on disk.

Where the spool lives (`spool_folder`): beside the store, in `<store>.spool/ingest-<pid>-…/`, on the
store's own disk (not /tmp, often a small tmpfs in RAM). A `kill -9` cannot clean up after itself,
so each folder holds a lock file its ingest keeps `flock`ed; the kernel drops that lock when the
process dies, however it dies, and the next ingest of the store (`sweep`) removes every folder whose
lock it can take. An in-memory store spools under the temp dir's `bradley-spool/`, swept the same way.

    >>> import tempfile
    >>> chunk = pa.table({"pid": ["p"], "prompt": ["q?"], "messages": pa.nulls(1, pa.string()),
    ...     "new_p": [True], "rid": ["r"], "completion": ["yes"], "model": ["m"], "new_r": [True]})
    >>> spool = Spool("feedback", iter([chunk]), tempfile.mkdtemp())
    >>> spool.responses().read_all().to_pylist()
    [{'id': 'r', 'prompt_id': 'p', 'text': 'yes', 'source_model': 'm'}]
    >>> spool.rest().column_names
    ['pid', 'prompt', 'messages', 'new_p', 'rid', 'model', 'new_r']
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

try:
    import fcntl
except ImportError:  # not POSIX: a folder's owner is then judged by its PID alone
    fcntl = None

LOCK_NAME = "owner.lock"
FOLDER_PREFIX = "ingest-"
CLAIM_PREFIX = "claim-"  # a folder being set up, not yet locked
YOUNG_SECONDS = 60  # a claim this new may still be setting up: leave it to its owner
MAP_BYTES = 1 << 30  # a mapped spool adds up to its size to the process's memory while read
SHARED_ROOT = "bradley-spool"  # the temp dir's root for in-memory stores, shared between processes

RESPONSE_SCHEMA = pa.schema([("id", pa.string()), ("prompt_id", pa.string()), ("text", pa.string()),
                             ("source_model", pa.string())])
# staged kind -> per response side: (new-in-batch flag, id, text, source model) columns
RESPONSE_SIDES = {
    "judgments": (("new_a", "rid_a", "response_a", "model_a"), ("new_b", "rid_b", "response_b", "model_b")),
    "feedback": (("new_r", "rid", "completion", "model"),),
}


class Spool:
    def __init__(self, kind: str, chunks: Iterator[pa.Table], folder: str):
        self.kind, self.chunks = kind, chunks
        self.path = os.path.join(folder, "staged-rest.arrow")
        self.writer: pa.ipc.RecordBatchFileWriter | None = None
        self.error: BaseException | None = None  # what the stream raised, as it was raised

    def responses(self) -> pa.RecordBatchReader:
        return pa.RecordBatchReader.from_batches(RESPONSE_SCHEMA, self._response_batches())

    def _response_batches(self) -> Iterator[pa.RecordBatch]:
        try:
            for staged in self.chunks:
                self._write_rest(staged)
                yield from _new_responses(self.kind, staged).to_batches()
        except BaseException as exc:  # DuckDB reports it as its own error; the caller re-raises this
            self.error = exc
            raise
        finally:
            if self.writer is not None:
                self.writer.close()

    def _write_rest(self, staged: pa.Table) -> None:
        texts = [side[2] for side in RESPONSE_SIDES[self.kind]]
        rest = staged.drop_columns(texts)
        # a prompt's text is spooled once, by its first row; take() copies only those texts (if_else
        # kept every row's bytes in its buffer, and so in the spool)
        new_p = staged.column("new_p").to_numpy()
        rows = pa.array(np.arange(len(new_p)), mask=~new_p)
        for name in ("prompt", "messages"):
            kept = staged.column(name).take(rows)
            rest = rest.set_column(rest.schema.get_field_index(name), name, kept)
        if self.writer is None:
            self.writer = pa.ipc.new_file(self.path, rest.schema)
        self.writer.write_table(rest)

    def rest(self) -> pa.Table | pa.dataset.Dataset | None:
        """Everything but the response texts, mapped or as a dataset (see MAP_BYTES); None when the
        stream had no chunk."""
        if self.writer is None:
            return None
        if os.path.getsize(self.path) < MAP_BYTES:
            return pa.ipc.open_file(pa.memory_map(self.path)).read_all()
        import pyarrow.dataset as ds  # here: importing it takes ~0.3 s (it brings pandas)

        return ds.dataset(self.path, format="arrow")


def _new_responses(kind: str, staged: pa.Table) -> pa.Table:
    """The responses this chunk writes first in the batch, in RESPONSE_SCHEMA."""
    parts = []
    for flag, rid, text, model in RESPONSE_SIDES[kind]:
        side, new = staged.select([rid, "pid", text, model]), staged.column(flag)
        if not pc.all(new).as_py():  # usually every response is new: no copy of the texts then
            side = side.filter(new)
        parts.append(pa.Table.from_arrays(side.columns, schema=RESPONSE_SCHEMA))
    return pa.concat_tables(parts)


# --- the spool's folder ---------------------------------------------------------------------------


def spool_root(store_path: str) -> Path:
    """`<store>.spool` beside a DuckDB file; the temp dir's `bradley-spool` for an in-memory store.

    >>> str(spool_root("/data/bradley.duckdb")), spool_root(":memory:").name
    ('/data/bradley.duckdb.spool', 'bradley-spool')
    """
    if not store_path or store_path.startswith(":memory:"):
        return Path(tempfile.gettempdir()) / SHARED_ROOT
    return Path(store_path + ".spool")


@contextlib.contextmanager
def spool_folder(root: Path) -> Iterator[str]:
    """A fresh folder under `root`, locked by this process while the block runs, then removed
    (with a store's `root` when nothing else is left in it). What dead ingests left is swept first.

    The folder is made as `claim-…`, locked, then renamed `ingest-…`: every `ingest-` folder is
    locked from the moment it has that name, so a sweep in another process (in-memory stores share
    the temp dir's root) never takes one between its creation and its lock."""
    sweep(root)
    root.mkdir(parents=True, exist_ok=True)
    claim = Path(tempfile.mkdtemp(prefix=f"{CLAIM_PREFIX}{os.getpid()}-", dir=root))
    try:
        with open(claim / LOCK_NAME, "w") as lock:
            if fcntl is not None:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)  # a fresh file: nobody holds it
            folder = claim.with_name(FOLDER_PREFIX + claim.name[len(CLAIM_PREFIX):])
            claim.rename(folder)  # the lock belongs to the open file, which follows the rename
            try:
                yield str(folder)
            finally:
                shutil.rmtree(folder, ignore_errors=True)
    finally:
        shutil.rmtree(claim, ignore_errors=True)  # only if the rename did not happen
        if root.name != SHARED_ROOT:
            with contextlib.suppress(OSError):
                root.rmdir()  # only when empty


def sweep(root: Path) -> list[str]:
    """Remove the spool folders under `root` whose ingest is gone; returns what was removed."""
    if not root.is_dir():
        return []
    removed = []
    for folder in [*root.glob(FOLDER_PREFIX + "*"), *root.glob(CLAIM_PREFIX + "*")]:
        if folder.is_dir() and not _owner_alive(folder):
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(str(folder))
    if root.name != SHARED_ROOT:  # another process may be about to make a folder in the shared one
        with contextlib.suppress(OSError):
            root.rmdir()
    return removed


def _owner_alive(folder: Path) -> bool:
    """Whether the process that made `folder` still runs: it holds the folder's lock (a flock
    survives PID reuse, unlike a PID check). A `claim-` folder is being set up: alive while young."""
    if folder.name.startswith(CLAIM_PREFIX):
        try:
            return time.time() - folder.stat().st_mtime < YOUNG_SECONDS
        except OSError:  # gone already (renamed or removed)
            return True
    try:
        lock = open(folder / LOCK_NAME, "a")
    except OSError:  # removed under us: nothing to do
        return True
    with lock:
        if fcntl is None:
            return _pid_alive(folder.name[len(FOLDER_PREFIX):].split("-")[0])
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return True
        return False  # closing the file releases the lock just taken


def _pid_alive(pid: str) -> bool:
    try:
        os.kill(int(pid), 0)
    except (ValueError, ProcessLookupError):
        return False
    except PermissionError:
        return True
    return True
