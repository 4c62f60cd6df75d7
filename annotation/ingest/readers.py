"""File readers for ingest: what kind of file a path is, its sha256, and its rows two ways.

A source is split into parts (one per file; one per split of a saved `datasets.DatasetDict`). Each part
reads its rows either as Arrow record batches (the fast, columnar path: JSONL, CSV, Parquet, HF) or as
`Record`s, one Python dict per row with its line number (the precise path that names FILE:LINE).
Both paths number rows the same way: the 1-based ordinal of the row in the source, blank lines skipped.
`read_ahead` runs a chunk producer in a thread so reading and hashing overlap DuckDB's writes.

    >>> import tempfile, os
    >>> path = os.path.join(tempfile.mkdtemp(), "x.jsonl")
    >>> _ = open(path, "w").write('{"a": 1}\\n\\n{"a": 2}\\n')
    >>> [(r.row, r.line, r.value) for part in open_parts(path) for r in part.records()]
    [(1, 1, {'a': 1}), (2, 3, {'a': 2})]
"""

from __future__ import annotations

import contextlib
import csv
import gzip
import hashlib
import io
import mmap
import os
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from queue import Empty, Queue

import numpy as np
import pyarrow as pa

from annotation.ingest.read_errors import ReadError, guarded
from annotation.ingest.records import (
    Record,
    batch_records,
    csv_records,
    is_gzip,
    json_records,
    jsonl_records,
    open_binary,
)

__all__ = ["ReadError", "Record", "Part", "open_parts", "read_ahead", "finished", "sha256_in_background"]

PARQUET_MAGIC = b"PAR1"
BATCH_BYTES = 32 << 20  # JSON/CSV block size: ~20k rows of ~1.5 kB per chunk, bounded memory
BATCH_ROWS = 20_000
HASH_BLOCK = 8 << 20
# pyarrow's JSON parser recurses once per nesting level: 20,000 levels overflowed its stack (a
# segfault, measured with pyarrow 22); lines that may nest this deep are read row by row instead,
# where Python's parser stops at its recursion limit and the row is rejected by line.
MAX_COLUMNAR_DEPTH = 4096


@dataclass
class Part:
    name: str                                        # shown in messages as FILE
    batches: Callable[[], Iterator[pa.RecordBatch]]  # raises ArrowInvalid / NotImplementedError
    records: Callable[[], Iterator[Record]]


def open_parts(path: str) -> list[Part]:
    """The parts of a file, a saved HF dataset folder, or `hf:SPEC` (datasets.load_dataset)."""
    if str(path).startswith("hf:"):
        return _hf_parts(str(path), _load_hf_spec(str(path)[3:]))
    p = Path(path)
    if p.is_dir():
        return _hf_parts(str(p), _load_hf_folder(p))
    if not p.is_file():
        raise ReadError(f"{path}: no such file; give a .jsonl/.json/.csv/.parquet file (optionally .gz), "
                        "a folder saved with datasets.save_to_disk, or hf:SPEC")
    kind = file_kind(p)
    return [Part(str(path), lambda: _BATCHES[kind](p), lambda: guarded(str(path), _RECORDS[kind](p)))]


def source_sha256(path: str) -> str:
    """sha256 of the raw bytes (all files of a folder, in name order; the fingerprints of hf:SPEC)."""
    digest = hashlib.sha256()
    if str(path).startswith("hf:"):
        for name, ds in _splits(_load_hf_spec(str(path)[3:])):
            digest.update(f"{name}\x1f{ds._fingerprint}\x1e".encode())
        return digest.hexdigest()
    p = Path(path)
    for f in sorted(q for q in p.rglob("*") if q.is_file()) if p.is_dir() else [p]:
        digest.update(str(f.relative_to(p)).encode() + b"\x1e" if p.is_dir() else b"")
        for window in _mapped(f, HASH_BLOCK):
            digest.update(window)
            window.close()
    return digest.hexdigest()


# mapped read-only, and where the OS allows, with its pages mapped at once (one call, not a fault each)
_MAP_OPTIONS = ({"flags": mmap.MAP_SHARED | mmap.MAP_POPULATE, "prot": mmap.PROT_READ}
                if hasattr(mmap, "MAP_POPULATE") else {"access": mmap.ACCESS_READ})


def _mapped(path: Path, size: int) -> Iterator[mmap.mmap]:
    """A file as consecutive maps of `size` bytes: the page cache is read in place, where read()
    copied every byte once more. One map at a time keeps memory bounded (mapped pages count in RSS)."""
    with open(path, "rb") as fh:
        end = os.fstat(fh.fileno()).st_size
        for start in range(0, end, size):
            _read_ahead(fh, start + size, size)
            yield mmap.mmap(fh.fileno(), min(size, end - start), offset=start, **_MAP_OPTIONS)


def _read_ahead(fh, start: int, size: int) -> None:
    """Have the OS read the next window while this one is used: mapping uncached pages waits for the disk."""
    if hasattr(os, "posix_fadvise"):
        os.posix_fadvise(fh.fileno(), start, size, os.POSIX_FADV_WILLNEED)


def finished(value) -> Future:
    """A Future that already holds `value` (a sha256 known at once, where others are computed)."""
    future: Future = Future()
    future.set_result(value)
    return future


def sha256_in_background(path: str) -> Future:
    """source_sha256 of a plain file, hashed in a thread (hashlib lets go of the GIL on big blocks),
    so ingest can parse while it runs; folders and hf:SPEC are fingerprinted at once.

    >>> import tempfile, os
    >>> path = os.path.join(tempfile.mkdtemp(), "x.jsonl")
    >>> _ = open(path, "w").write("{}")
    >>> sha256_in_background(path).result() == hashlib.sha256(b"{}").hexdigest()
    True
    """
    if not Path(path).is_file():
        return finished(source_sha256(path))
    future: Future = Future()

    def run() -> None:
        try:
            future.set_result(source_sha256(path))
        except BaseException as exc:  # noqa: BLE001 (re-raised by future.result())
            future.set_exception(exc)

    threading.Thread(target=run, name="bradley-sha256", daemon=True).start()
    return future


def file_kind(path: Path) -> str:
    """jsonl | json | csv | parquet, from the extension (under any .gz) or else from the first bytes."""
    suffixes = [s.lower() for s in path.suffixes if s.lower() != ".gz"]
    by_ext = {".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "json", ".csv": "csv",
              ".parquet": "parquet", ".txt": None}
    kind = by_ext.get(suffixes[-1]) if suffixes else None
    if kind:
        return kind
    with open_binary(path) as fh:
        head = fh.read(4096)
    if head.startswith(PARQUET_MAGIC):
        return "parquet"
    first = head.lstrip()[:1]
    return {b"[": "json", b"{": "jsonl"}.get(first, "csv")


def _stream(path: Path) -> pa.NativeFile:
    return pa.input_stream(str(path), compression="gzip" if is_gzip(path) else None)


# --- columnar reads ---------------------------------------------------------------------------


def _jsonl_batches(path: Path) -> Iterator[pa.RecordBatch]:
    import pyarrow.json as pj

    # A parse per block of whole lines, each block typed on its own (_columnar checks every batch),
    # in parallel pieces without the GIL. pyarrow's streaming reader reads ahead without a bound:
    # it held ~1 GB of a 1.5 GB file.
    # After the first block, its text columns are declared (a parse without type inference, ~15%
    # faster); a later row with another type there fails the parse, and the precise path decides.
    options, parse = pj.ReadOptions(block_size=BATCH_BYTES // 4, use_threads=True), pj.ParseOptions()
    with contextlib.ExitStack() as stack:
        if is_gzip(path):
            blocks = _line_blocks(stack.enter_context(_stream(path)), BATCH_BYTES, MAX_COLUMNAR_DEPTH)
        else:
            blocks = _mapped_blocks(path, BATCH_BYTES, MAX_COLUMNAR_DEPTH)
        for block in blocks:
            table = pj.read_json(pa.BufferReader(block), read_options=options, parse_options=parse)
            if parse.explicit_schema is None:
                texts = [f for f in table.schema if pa.types.is_string(f.type)]
                parse = pj.ParseOptions(explicit_schema=pa.schema(texts),
                                        unexpected_field_behavior="infer")
            yield from table.to_batches()


def _line_blocks(stream, size: int, max_depth: int | None = None) -> Iterator[pa.Buffer]:
    """A stream (a gzip file's) in blocks of about `size` bytes that end at a newline (a longer
    line: one block); the unfinished last line starts the next block. A block with a line that may
    nest deeper than `max_depth` raises ArrowInvalid (_may_nest_deeper). Two buffers are filled in
    turn, so a block must be done with by the time the one after it is read (the parse copies what
    it keeps): a fresh block per read cost a zeroed page per 4 kB.

    >>> [b.to_pybytes() for b in _line_blocks(io.BytesIO(b'{"a": 1}\\n{"a": 22}\\n{"a"'), 12)]
    [b'{"a": 1}\\n', b'{"a": 22}\\n', b'{"a"']
    """
    buffers, turn, head = [bytearray(size), bytearray(size)], 0, b""
    while True:
        if len(buffers[turn]) < len(head) + size:  # a line longer than a block
            buffers[turn] = bytearray(len(head) + size)
        buf = buffers[turn]
        buf[:len(head)] = head
        got = len(head) + (stream.readinto(memoryview(buf)[len(head):len(head) + size]) or 0)
        if got == len(head):
            break
        cut = buf.rfind(b"\n", 0, got) + 1
        head = bytes(buf[cut:got])
        if cut == 0:
            continue
        _check_depth(buf, cut, max_depth)
        yield pa.py_buffer(buf)[:cut]  # a zero-copy slice
        turn ^= 1
    if head:
        _check_depth(head, len(head), max_depth)
        yield pa.py_buffer(head)


def _mapped_blocks(path: Path, size: int, max_depth: int | None = None) -> Iterator[pa.Buffer]:
    """_line_blocks of an uncompressed file, each block a map of the file (_mapped says why),
    unmapped when the parse lets it go. A file cut shorter while it is read ends the process
    (SIGBUS), as with any mapped file: ingest reads files nothing else is writing.

    >>> import tempfile
    >>> path = Path(tempfile.mkdtemp()) / "x.jsonl"
    >>> _ = path.write_bytes(b'{"a": 1}\\n{"a": 22}\\n{"a"')
    >>> [b.to_pybytes() for b in _mapped_blocks(path, 12)]
    [b'{"a": 1}\\n', b'{"a": 22}\\n', b'{"a"']
    """
    with open(path, "rb") as fh:
        end, start = os.fstat(fh.fileno()).st_size, 0
        while start < end:
            base, want = start - start % mmap.ALLOCATIONGRANULARITY, size  # maps begin page-aligned
            while True:
                length = min(end - base, start - base + want)
                window = mmap.mmap(fh.fileno(), length, offset=base, **_MAP_OPTIONS)
                stop = window.rfind(b"\n", start - base) + 1
                if stop or base + length == end:
                    break
                window.close()
                want *= 2  # a line longer than the block
            stop = stop or length
            _read_ahead(fh, base + stop, size)
            _check_depth(window, stop, max_depth)
            yield pa.py_buffer(window)[start - base:stop]
            start = base + stop


def _check_depth(data: bytes, end: int, max_depth: int | None) -> None:
    if max_depth and _may_nest_deeper(data, end, max_depth):
        raise pa.ArrowInvalid(f"a line may nest deeper than {max_depth} levels; read row by row")


def _may_nest_deeper(data: bytes, end: int, depth: int) -> bool:
    """Whether a line of data[:end] has `depth` or more opening brackets, so may nest that deep.
    Such a line is at least `depth` bytes long, so it covers a whole aligned window of depth // 2
    bytes without a newline: only lines found that way are counted (a few ms per 32 MB block).

    >>> _may_nest_deeper(b'{"a": [1]}\\n' * 100, 1100, 8), _may_nest_deeper(b'{"a":' + b'[' * 9, 14, 8)
    (False, True)
    """
    window, pos = max(depth // 2, 1), 0
    while pos + window <= end:
        if data.find(b"\n", pos, pos + window) >= 0:
            pos += window
            continue
        start, stop = data.rfind(b"\n", 0, pos) + 1, data.find(b"\n", pos, end)
        stop = end if stop < 0 else stop
        line = np.frombuffer(data, np.uint8, stop - start, start)  # mapped files have no count()
        if np.count_nonzero((line == ord("[")) | (line == ord("{"))) >= depth:
            return True
        pos = stop + 1
    return False


def _csv_batches(path: Path) -> Iterator[pa.RecordBatch]:
    import pyarrow.csv as pcsv

    with open_binary(path) as fh:
        header = next(csv.reader(io.TextIOWrapper(fh, encoding="utf-8-sig")), [])
    # Every column as text, like the precise path sees it: "007" stays "007".
    convert = pcsv.ConvertOptions(column_types={name: pa.string() for name in header},
                                  strings_can_be_null=False)
    reader = pcsv.open_csv(_stream(path), read_options=pcsv.ReadOptions(block_size=BATCH_BYTES),
                           convert_options=convert)
    yield from reader


def _parquet_batches(path: Path) -> Iterator[pa.RecordBatch]:
    import pyarrow.parquet as pq

    with open_binary(path) as fh:
        source = pa.BufferReader(fh.read()) if isinstance(fh, gzip.GzipFile) else fh
        yield from pq.ParquetFile(source).iter_batches(batch_size=BATCH_ROWS)


def _no_batches(path: Path) -> Iterator[pa.RecordBatch]:
    raise NotImplementedError("a JSON list is read row by row")


# --- row-by-row reads (annotation.ingest.records) -------------------------------------------------------


def _parquet_records(path: Path) -> Iterator[Record]:
    return batch_records(_parquet_batches(path))


_BATCHES = {"jsonl": _jsonl_batches, "csv": _csv_batches, "parquet": _parquet_batches,
            "json": _no_batches}
_RECORDS = {"jsonl": jsonl_records, "csv": csv_records, "parquet": _parquet_records,
            "json": json_records}


# --- Hugging Face datasets ----------------------------------------------------------------------


def _load_hf_folder(path: Path):
    import datasets

    try:
        return datasets.load_from_disk(str(path))
    except FileNotFoundError as exc:
        raise ReadError(f"{path}: not a folder saved with datasets.save_to_disk ({exc})") from None


def _load_hf_spec(spec: str):
    import datasets

    try:
        return datasets.load_dataset(spec)
    except Exception as exc:  # noqa: BLE001 (datasets raises many kinds; all mean "cannot load")
        raise ReadError(f"hf:{spec}: datasets.load_dataset failed: {exc}") from None


def _splits(data) -> list[tuple[str, object]]:
    return list(data.items()) if hasattr(data, "items") else [("", data)]


def _hf_parts(label: str, data) -> list[Part]:
    parts = []
    for name, ds in _splits(data):
        def batches(ds=ds):
            for table in ds.with_format("arrow").iter(batch_size=BATCH_ROWS):
                yield from table.to_batches()
        parts.append(Part(f"{label}[{name}]" if name else label, batches,
                          lambda batches=batches: batch_records(batches())))
    return parts


# --- read-ahead -----------------------------------------------------------------------------------


def read_ahead(items: Iterator, depth: int = 2) -> Iterator:
    """Iterate `items` in a background thread, `depth` ahead; its exceptions re-raise here.

    >>> list(read_ahead(iter(range(5))))
    [0, 1, 2, 3, 4]
    """
    done = object()
    queue: Queue = Queue(maxsize=depth)
    stop = threading.Event()

    def produce() -> None:
        try:
            for item in items:
                if stop.is_set():
                    return
                queue.put(item)
            queue.put(done)
        except BaseException as exc:  # noqa: BLE001 (handed to the consumer, which re-raises)
            queue.put(exc)

    thread = threading.Thread(target=produce, name="bradley-ingest-reader", daemon=True)
    thread.start()
    try:
        while (item := queue.get()) is not done:
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()
        while thread.is_alive():  # unblock a producer waiting on a full queue, then let it end
            with contextlib.suppress(Empty):
                queue.get(timeout=0.05)
