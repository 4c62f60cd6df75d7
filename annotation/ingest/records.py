"""Row-by-row reads for ingest's precise path: one Python dict per row with the line it starts on,
or the reason it cannot be one (`field: problem`, named by annotation.ingest.batch as FILE:LINE).

Text is checked here, where the bytes are: a line that is not UTF-8 and a value holding a lone
surrogate (`"\\ud800"` in JSON; undecodable bytes in a CSV) are bad rows with their line, not a
library's error about the whole file, and JSON nested deeper than the parser goes is a bad row
rather than a RecursionError. annotation.ingest.readers picks the reader by file kind.

    >>> import tempfile, os
    >>> path = os.path.join(tempfile.mkdtemp(), "x.jsonl")
    >>> _ = open(path, "wb").write(b'{"a": 1}\\n{"a": "\\xff"}\\n{"a": "\\\\ud800"}\\n')
    >>> [(r.line, r.value, r.problem) for r in jsonl_records(path)]  # doctest: +NORMALIZE_WHITESPACE
    [(1, {'a': 1}, None),
     (2, None, 'encoding: not valid UTF-8 (byte 0xff at column 8); save the file as UTF-8'),
     (3, None, 'a: holds a lone surrogate such as \\\\ud800 (half of a UTF-16 pair), which is not valid
     Unicode text; fix the escape in the source')]
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa

from annotation.ingest.read_errors import (
    DEEP_JSON_PROBLEM,
    SURROGATE_PROBLEM,
    encodes,
    long_integer_problem,
    parse_int,
    surrogate_field,
    utf8_problem,
)

GZIP_MAGIC = b"\x1f\x8b"
UTF8_BOM = b"\xef\xbb\xbf"


@dataclass
class Record:
    """One row: its ordinal, the line it starts on, the parsed value (or None) and why it failed."""

    row: int
    line: int
    value: dict | None
    raw: str
    problem: str | None = None  # "field: what is wrong" when the row could not be parsed


def is_gzip(path: Path) -> bool:
    with open(path, "rb") as fh:
        return fh.read(2) == GZIP_MAGIC


def open_binary(path: Path):
    return gzip.open(path, "rb") if is_gzip(path) else open(path, "rb")


def jsonl_records(path: Path) -> Iterator[Record]:
    row = 0
    with open_binary(path) as fh:
        for line, data in enumerate(fh, 1):
            if line == 1 and data.startswith(UTF8_BOM):  # editors on Windows begin files with one
                data = data[len(UTF8_BOM):]
            if not data.strip():
                continue
            row += 1
            try:
                raw = data.decode("utf-8").rstrip("\r\n")
            except UnicodeDecodeError:
                raw = data.decode("utf-8", "replace").rstrip("\r\n")
                yield Record(row, line, None, raw, f"encoding: {utf8_problem(data)}")
                continue
            yield _parse_json(row, line, raw)


def _parse_json(row: int, line: int, raw: str) -> Record:
    try:
        value = json.loads(raw, parse_int=parse_int)
    except json.JSONDecodeError as exc:
        return Record(row, line, None, raw, f"json: not valid JSON ({exc.msg} at column {exc.colno})")
    except RecursionError:
        return Record(row, line, None, raw[:10_000], DEEP_JSON_PROBLEM)
    if not isinstance(value, dict):
        return Record(row, line, None, raw, f"row: expected a JSON object, got {type(value).__name__}")
    if "\\u" in raw and (name := surrogate_field(value)):  # only an escape can make one
        return Record(row, line, None, raw, f"{name}: {SURROGATE_PROBLEM}")
    if len(raw) > sys.get_int_max_str_digits() and (problem := long_integer_problem(value)):
        return Record(row, line, None, raw[:10_000], problem)
    return Record(row, line, value, raw)


def json_records(path: Path) -> Iterator[Record]:
    with open_binary(path) as fh:
        data = fh.read()
    try:
        value = json.loads(data.decode("utf-8-sig"), parse_int=parse_int)
    except UnicodeDecodeError as exc:
        line, start = data.count(b"\n", 0, exc.start) + 1, data.rfind(b"\n", 0, exc.start) + 1
        end = data.find(b"\n", exc.start)
        yield Record(1, line, None, "", f"encoding: {utf8_problem(data[start:end if end >= 0 else None])}")
        return
    except json.JSONDecodeError as exc:
        yield Record(1, exc.lineno, None, "", f"json: not valid JSON ({exc.msg} at line {exc.lineno})")
        return
    except RecursionError:
        yield Record(1, 1, None, "", DEEP_JSON_PROBLEM)
        return
    for row, item in enumerate([value] if isinstance(value, dict) else value, 1):
        yield _value_record(row, item)


def _value_record(row: int, value) -> Record:
    try:
        raw = json.dumps(value, ensure_ascii=False, default=str)
    except RecursionError:
        return Record(row, row, None, "", DEEP_JSON_PROBLEM)
    if not isinstance(value, dict):
        return Record(row, row, None, raw, f"row: expected an object, got {type(value).__name__}")
    if len(raw) > sys.get_int_max_str_digits() and (problem := long_integer_problem(value)):
        return Record(row, row, None, raw[:10_000], problem)
    if not encodes(raw):
        return Record(row, row, None, raw.encode("utf-8", "replace").decode(),
                      f"{surrogate_field(value)}: {SURROGATE_PROBLEM}")
    return Record(row, row, value, raw)


def csv_records(path: Path) -> Iterator[Record]:
    # Undecodable bytes become lone surrogates (surrogateescape) so the row that holds them is named.
    with io.TextIOWrapper(open_binary(path), encoding="utf-8-sig", errors="surrogateescape",
                          newline="") as fh:
        reader = csv.DictReader(fh)
        start, row = 2, 0
        for value in reader:
            row += 1
            extra = value.pop(None, None)
            raw = json.dumps(value, ensure_ascii=False)
            if extra is not None:
                yield Record(row, start, None, raw, f"row: {len(extra)} more fields than the header")
            elif not encodes(raw):
                yield Record(row, start, None, raw.encode("utf-8", "replace").decode(),
                             f"{surrogate_field(value)}: not valid UTF-8 text; save the file as UTF-8")
            else:
                yield Record(row, start, value, raw)
            start = reader.line_num + 1


def batch_records(batches: Iterator[pa.RecordBatch]) -> Iterator[Record]:
    row = 0
    for batch in batches:
        for value in batch.to_pylist():
            row += 1
            yield _value_record(row, value)
