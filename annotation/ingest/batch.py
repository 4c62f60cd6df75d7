"""Ingest: files (or already-parsed rows) into the store, validated, atomically, in bounded memory.

One file is one batch and one transaction. Rows are read in chunks; a clean JSONL/CSV/Parquet/HF file
of judgments or TRL string pairs takes the columnar path (Arrow reads, vectorized checks in
annotation.ingest.columnar, content ids hashed in read-ahead threads while DuckDB writes the chunks before,
the whole file as one INSERT per table: annotation.ingest.spool); anything else, and any file where the
vectorized checks find a problem, takes the precise path, which parses row by row and names every
problem as `FILE:LINE: field: what is wrong`. Either way each prompt, response and judgment id is
written once per batch (annotation.ingest.seen), and ids already in the store are dropped before the commit
(bulk.drop_earlier_ids): the tables keep no index to check against (schema.sql says why). A judgment's
id is its content's (annotation.ids), so a judgment that came before by another route (a file's .gz,
HTTP, a dataset, an export) is counted as already in the store.

`on_error="abort"` (default): a bad row writes nothing from that file and raises IngestError.
`on_error="skip"`: good rows are committed, bad ones go to `rejects` with their reason and raw text.
Re-ingesting content with the same sha256 is a no-op reported as `duplicate`; the same rows in
another file or body write nothing and are counted as already in the store.

    >>> from annotation.store import Store
    >>> store = Store(":memory:")
    >>> rows = [{"prompt": "2+2?", "response_a": "4", "response_b": "5", "winner": "a"}]
    >>> ingest_records(store, rows).summary()
    'http: 1 row: 1 ok, 0 rejected'
    >>> ingest_records(store, rows).duplicate
    True
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa

from annotation.ids import canonical_json, with_ids
from annotation.ingest import columnar, formats, spool
from annotation.ingest import inserts as bulk
from annotation.ingest.columnar import NeedsPrecise
from annotation.ingest.read_errors import SURROGATE_PROBLEM, encodes, surrogate_field
from annotation.ingest.readers import (
    BATCH_ROWS,
    Part,
    ReadError,
    Record,
    finished,
    open_parts,
    read_ahead,
    sha256_in_background,
)
from annotation.ingest.seen import SeenIds
from annotation.label_studio import ledger as ls_ledger

ON_ERROR = ("abort", "skip")
MAX_LISTED_ERRORS = 1000
INGEST_MEMORY = "1GB"  # DuckDB's share while a big file streams in (it spills beyond): bounded RSS
DETECT_ROWS = 100  # --format auto reads the columns of this many rows, so one broken row cannot mislead it


class IngestError(ValueError):
    """Abort mode found bad rows (nothing was written). `errors` lists every FILE:LINE: field: problem."""

    def __init__(self, errors: list[str], field: str | None = None, result: IngestResult | None = None):
        more = f" (and {len(errors) - 1} more problems)" if len(errors) > 1 else ""
        super().__init__(f"{errors[0]}{more}; nothing was written "
                         "(fix the rows, or use --on-error skip to keep the good ones)")
        self.errors, self.field, self.result = errors, field, result


@dataclass
class IngestResult:
    source: str
    batch_id: str | None
    rows_in: int
    rows_ok: int
    rows_rejected: int
    duplicate: bool = False
    errors: list[str] = field(default_factory=list)
    failed: bool = False
    self_comparisons: int = 0  # judgments with the same text on both sides (stored; pairs skip them)

    @property
    def rows_existing(self) -> int:
        """Valid rows that were already in the store (same ids), so not written again."""
        return self.rows_in - self.rows_ok - self.rows_rejected

    def summary(self) -> str:
        if self.duplicate:
            return f"{self.source}: already ingested as batch {self.batch_id} (same sha256); nothing to do"
        if self.failed and not self.rows_in:  # the file itself could not be read
            return f"{self.source}: nothing written"
        head = f"{self.source}: {self.rows_in:,} row{'s' if self.rows_in != 1 else ''}: "
        if self.failed:
            return head + f"{len(self.errors):,} bad; nothing written"
        text = head + f"{self.rows_ok:,} ok, {self.rows_rejected:,} rejected"
        if self.rows_existing:
            text += f", {self.rows_existing:,} already in the store"
        if self.self_comparisons:
            text += (f"; {self.self_comparisons:,} compare a response with itself (kept, but pairs, "
                     "training and the report leave them out)")
        return text + (f" (see rejects, batch {self.batch_id})" if self.rows_rejected else "")


class _Duplicate(Exception):
    """The source's sha256 is a batch's in the store: nothing to do."""


def ingest_file(store, path, fmt: str = "auto", on_error: str = "abort", progress: bool = False,
                source_model: str | None = None) -> IngestResult:
    """Ingest one file, saved HF dataset folder or `hf:SPEC` as one batch. `fmt="hf"` only says the
    source is a dataset (its rows' format is then detected)."""
    if fmt == "hf":
        if not (str(path).startswith("hf:") or Path(path).is_dir()):
            raise ValueError(f"{path}: --format hf needs a folder saved with datasets.save_to_disk "
                             "or hf:SPEC for datasets.load_dataset")
        fmt = "auto"
    _check_options(fmt, on_error)
    try:
        parts = open_parts(str(path))
    except ReadError as exc:
        raise _unreadable(str(path), exc) from None
    return _ingest(store, str(path), sha256_in_background(str(path)), parts,
                   _Options(fmt, on_error, progress, source_model))


def _unreadable(source: str, exc: ReadError) -> IngestError:
    """A source that cannot be read to its end writes nothing, whatever on_error says."""
    message = str(exc) if str(exc).startswith(source) else f"{source}: {exc}"
    return IngestError([message], "file", IngestResult(source, None, 0, 0, 0, errors=[message],
                                                       failed=True))


def ingest_records(store, records: list[dict], fmt: str = "auto", source: str = "http",
                   on_error: str = "abort") -> IngestResult:
    """Ingest already-parsed rows (an HTTP upload) with the same validation and atomicity."""
    _check_options(fmt, on_error)
    if not isinstance(records, list):
        raise IngestError([f"{source}: body: expected a list of rows"], "body")
    # surrogatepass: a lone surrogate must reach its row's check, not fail the hash of the body
    sha = hashlib.sha256(canonical_json(records).encode("utf-8", "surrogatepass")).hexdigest()
    rows = [_record(i, value) for i, value in enumerate(records, 1)]
    part = Part(source, _no_batches, lambda: iter(rows))
    return _ingest(store, source, finished(sha), [part], _Options(fmt, on_error, False, None))


def _check_options(fmt: str, on_error: str) -> None:
    if fmt != "auto" and fmt not in formats.FORMATS:
        raise ValueError(f"unknown format {fmt!r}; use auto, {', '.join(formats.FORMATS)}")
    if on_error not in ON_ERROR:
        raise ValueError(f"unknown on_error {on_error!r}; use abort or skip")


def _record(row: int, value) -> Record:
    if isinstance(value, dict):
        raw = canonical_json(value)
        if not encodes(raw):  # JSON bodies may carry "\ud800"; no text column can store it
            return Record(row, row, None, raw.encode("utf-8", "replace").decode(),
                          f"{surrogate_field(value)}: {SURROGATE_PROBLEM}")
        return Record(row, row, value, raw)
    return Record(row, row, None, str(value)[:10_000], f"row: expected an object, got {type(value).__name__}")


def _no_batches():
    raise NeedsPrecise


@dataclass
class _Options:
    fmt: str
    on_error: str
    progress: bool
    source_model: str | None


def _ingest(store, source: str, sha: Future, parts: list[Part], opts: _Options) -> IngestResult:
    """The columnar path starts before the source's sha256 is known (it is hashed in a thread beside
    the parse) and stops as soon as the sha256 shows a batch that is in the store already. Spool
    folders that killed ingests of this store left behind are removed first."""
    spool.sweep(spool.spool_root(store.path))
    try:
        if sha.done():
            _check_new(store, sha.result())
        try:
            known = store.batch_sha256s()
            return _write(store, source, sha, lambda w: _columnar_pass(w, parts, known), opts)
        except NeedsPrecise:
            _check_new(store, sha.result())
            return _write(store, source, sha, lambda w: _precise_pass(w, parts), opts)
    except ReadError as exc:
        raise _unreadable(source, exc) from None
    except _Duplicate:
        found = store.find_batch(sha.result())
        return IngestResult(source, found.id, found.rows_in, 0, 0, duplicate=True)


def _check_new(store, sha: str) -> None:
    if store.find_batch(sha):
        raise _Duplicate


def _write(store, source: str, sha: Future, fill: Callable, opts: _Options) -> IngestResult:
    """One transaction: the batch row, its rows and rejects; an exception rolls all of it back."""
    with store.memory_limit(INGEST_MEMORY), bulk.unordered(store.con), store.transaction() as cur:
        writer, marks = _Writer(store, cur, source, sha, opts), bulk.row_marks(cur)
        try:
            fill(writer)
            writer.flush()
        finally:
            writer.close()
        if writer.errors and opts.on_error == "abort":
            result = IngestResult(source, None, writer.rows_in, 0, 0, errors=writer.errors, failed=True)
            raise IngestError(writer.errors, writer.first_field, result)
        info = writer.batch()
        bulk.drop_earlier_ids(cur, info.id, marks, writer.seen.own_ids, writer.seen.forgot)
        if "label-studio" in writer.formats:  # one count per annotation, however it arrived
            ls_ledger.reconcile(cur, info.id)
        info = store.finish_batch(cur, info, writer.rows_in)
    return IngestResult(source, info.id, info.rows_in, info.rows_ok, info.rows_rejected,
                        errors=writer.errors, self_comparisons=store.self_comparisons(batch_id=info.id))


class _Writer:
    """Collects staged rows and rejects of one batch and writes them in chunks."""

    def __init__(self, store, cur, source: str, sha: Future, opts: _Options):
        self.store, self.cur, self.source, self.sha, self.opts = store, cur, source, sha, opts
        self.info = None
        self.pending: dict[str, list[dict]] = {"judgments": [], "feedback": []}
        self.rejects: list[tuple[int, str, str]] = []
        self.errors: list[str] = []
        self.n_errors, self.rows_in, self.first_field = 0, 0, None
        self.seen = SeenIds()
        self.formats: set[str] = set()
        self.bar = _progress_bar() if opts.progress else None

    def add_stream(self, kind: str, chunks: Iterator[pa.Table]) -> None:
        """Write a stream of staged chunks as one INSERT per table (bulk.insert_stream)."""
        def counted():
            for staged in chunks:
                self.rows_in += staged.num_rows
                self._tick(staged.num_rows)
                yield staged

        bulk.insert_stream(self.cur, kind, counted(), lambda: self.batch().id,
                           spool.spool_root(self.store.path))

    def batch(self):
        """The batch row, begun when first needed: the source's sha256 is known then (a file's is
        hashed in a thread) and must be new to the store."""
        if self.info is None:
            _check_new(self.store, self.sha.result())
            self.info = self.store.begin_batch(self.cur, self.source, self.sha.result(), 0)
        return self.info

    def add_row(self, kind: str, values: dict) -> None:
        self.rows_in += 1
        if self.opts.source_model:
            for key in ("model_a", "model_b", "model"):
                values[key] = values.get(key) or self.opts.source_model
        self.pending[kind].append(values)
        if len(self.pending[kind]) >= BATCH_ROWS:
            self.flush()

    def add_error(self, label: str, record: Record, fld: str, problem: str) -> None:
        self.rows_in += 1
        self.n_errors += 1
        self.first_field = self.first_field or fld
        if len(self.errors) < MAX_LISTED_ERRORS:
            self.errors.append(f"{label}:{record.line}: {fld}: {problem}")
        if self.opts.on_error == "skip":
            self.rejects.append((record.line, f"{fld}: {problem}", record.raw))
            if len(self.rejects) >= BATCH_ROWS:
                self.flush()

    def flush(self) -> None:
        if self.n_errors and self.opts.on_error == "abort":
            self.pending = {k: [] for k in self.pending}  # nothing will be written; keep validating
            return
        for kind, rows in self.pending.items():
            if rows:
                staged = with_ids(kind, _staged_table(kind, rows))
                bulk.insert(self.cur, kind, self.seen.flag(kind, staged), self.batch().id)
                self._tick(len(rows))
        if self.rejects:
            self.store.insert_rejects(self.cur, self.batch().id, self.rejects)
        self.pending, self.rejects = {k: [] for k in self.pending}, []

    def _tick(self, n: int) -> None:
        if self.bar is not None:
            self.bar.update(n)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        if self.n_errors > len(self.errors):
            self.errors.append(f"... and {self.n_errors - len(self.errors):,} more problems")


def _progress_bar():
    from tqdm import tqdm

    return tqdm(unit=" rows", unit_scale=True, desc="ingest", leave=False)


def _staged_table(kind: str, rows: list[dict]) -> pa.Table:
    return pa.Table.from_pylist(rows, schema=formats.SCHEMAS[kind])


# --- the precise path ---------------------------------------------------------------------------


def _precise_pass(writer: _Writer, parts: list[Part]) -> None:
    offset = 0
    for part in parts:
        records, last = part.records(), 0
        head = list(itertools.islice(records, DETECT_ROWS))
        fmt = writer.opts.fmt
        if fmt == "auto" and any(r.value for r in head):
            fmt = _detect(part.name, {k: None for r in head if r.value for k in r.value})
        writer.formats.add(fmt)
        for record in itertools.chain(head, records):
            last = record.row
            if record.problem:
                fld, _, problem = record.problem.partition(": ")
                writer.add_error(part.name, record, fld, problem)
                continue
            for item in formats.normalize(fmt, record.value, offset + record.row):
                if isinstance(item, formats.RowError):
                    writer.add_error(part.name, record, item.field, str(item).partition(": ")[2])
                else:
                    writer.add_row(*item)
        offset += last


def _detect(label: str, row: dict) -> str:
    try:
        return formats.detect_format(row.keys())
    except ValueError as exc:
        raise IngestError([f"{label}: {exc}"], "columns") from None


# --- the columnar path --------------------------------------------------------------------------


def _columnar_pass(writer: _Writer, parts: list[Part], known: set[str]) -> None:
    # Parsing, checking and hashing run in reader threads while DuckDB's one INSERT takes the
    # chunks before: on two cores that overlap is much of the speed.
    chunks = _columnar_chunks(parts, writer.opts, writer.sha, known)

    def flagged() -> Iterator[pa.Table]:
        for chunk in chunks:
            yield writer.seen.flag("judgments", chunk)
        writer.seen.release()  # the INSERTs from the spool that follow need the memory more

    writer.add_stream("judgments", read_ahead(flagged()))


def _columnar_chunks(parts: list[Part], opts: _Options, sha: Future,
                     known: set[str]) -> Iterator[pa.Table]:
    """Staged chunks with their content ids. Stops early when the sha256 is a known batch's."""
    offset = 0
    for part in parts:
        fmt = opts.fmt
        try:
            for batch in read_ahead(part.batches()):  # the parse runs a chunk ahead of the checks
                fmt = fmt if fmt != "auto" else _detect(part.name, dict.fromkeys(batch.schema.names))
                if sha.done() and sha.result() in known:
                    raise _Duplicate
                staged = columnar.stage(batch, fmt, offset, opts.source_model)
                yield with_ids("judgments", staged)
                offset += batch.num_rows
        except (pa.ArrowException, NotImplementedError, OSError, UnicodeDecodeError, EOFError) as exc:
            raise NeedsPrecise from exc  # the precise path names the row, or the file, that is wrong
