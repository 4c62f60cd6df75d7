"""Why a source cannot be read, said as `FILE[:LINE]: field: problem`, never as a library's bare
message or a traceback.

Two kinds of failure. A row's text can be wrong (bytes that are not UTF-8, a JSON escape of half a
surrogate pair such as `"\\ud800"`, JSON nested deeper than Python's parser goes): that row is
rejected with its line, like any bad row. The file itself can be broken (a truncated `.gz`, a
corrupt Parquet footer): `guarded` turns what the decompressor or Arrow raised into a ReadError
that names the file and the last line read, and annotation.ingest.batch writes nothing from that file,
whatever `--on-error` says (the rows past the break are unknown).

    >>> surrogate_field({"prompt": "ok", "response_a": "half \\ud800 a pair"})
    'response_a'
    >>> surrogate_field({"prompt": ["fine", {"k": "\\udcff"}]})
    'prompt'
    >>> utf8_problem(b'{"prompt": "caf\\xe9"}')
    'not valid UTF-8 (byte 0xe9 at column 16); save the file as UTF-8'
"""

from __future__ import annotations

import gzip
import zlib
from collections.abc import Callable, Iterator

import pyarrow as pa


class ReadError(ValueError):
    """The source cannot be read (missing, unknown type, broken); the message names it and says what
    to do instead."""


def utf8_problem(data: bytes) -> str:
    """What is wrong with bytes that fail to decode as UTF-8 (where, and the fix)."""
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as exc:
        return (f"not valid UTF-8 (byte 0x{data[exc.start]:02x} at column {exc.start + 1}); "
                "save the file as UTF-8")
    return "valid UTF-8"


def encodes(text: str) -> bool:
    """Whether `text` is valid Unicode (no lone surrogate, which UTF-8 cannot encode)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def surrogate_field(row: dict) -> str | None:
    """The first top-level field whose key or value (at any depth) holds a lone surrogate; None when
    every text is valid Unicode. Iterative, so a deeply nested value cannot exhaust the stack."""
    for key, value in row.items():
        stack = [key, value]
        while stack:
            item = stack.pop()
            if isinstance(item, str) and not encodes(item):
                return key if encodes(str(key)) else repr(key)
            if isinstance(item, dict):
                stack.extend(item.keys())
                stack.extend(item.values())
            elif isinstance(item, list):
                stack.extend(item)
    return None


class LongInteger(str):
    """A JSON integer with more digits than Python turns into an int (sys.get_int_max_str_digits,
    4,300 by default): kept as its digits, so that the row holding it is named, not the file."""


def parse_int(digits: str) -> int | LongInteger:
    """json.loads' `parse_int`: an int, or a LongInteger where int() refuses the length.

    >>> parse_int("12"), type(parse_int("9" * 5000)).__name__
    (12, 'LongInteger')
    """
    try:
        return int(digits)
    except ValueError:
        return LongInteger(digits)


def long_integer_problem(row: dict) -> str | None:
    """`field: problem` for the first top-level field holding a LongInteger at any depth; None when
    there is none.

    >>> long_integer_problem({"prompt": "p", "strength": [parse_int("1" * 5000)]})
    'strength: a number of 5,000 digits, more than any field takes; fix the value in the source'
    """
    for key, value in row.items():
        stack = [value]
        while stack:
            item = stack.pop()
            if isinstance(item, LongInteger):
                return (f"{key}: a number of {len(item.lstrip('-')):,} digits, more than any field "
                        "takes; fix the value in the source")
            if isinstance(item, dict):
                stack.extend(item.values())
            elif isinstance(item, list):
                stack.extend(item)
    return None


SURROGATE_PROBLEM = ("holds a lone surrogate such as \\ud800 (half of a UTF-16 pair), which is not "
                     "valid Unicode text; fix the escape in the source")
DEEP_JSON_PROBLEM = "json: nested too deeply for the JSON parser; flatten the row"


def _gzip_ended(exc: BaseException) -> str:
    return ("the compressed stream ends early: the .gz file is truncated "
            "(copy or download it again)")


def _corrupt(exc: BaseException) -> str:
    return f"the compressed data is corrupt ({exc}); copy or download the file again"


def _arrow(exc: BaseException) -> str:
    first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return f"cannot be read: {first.rstrip('.')}; a Parquet file that says so was cut short or damaged: copy or write it again"


def _decode(exc: BaseException) -> str:
    assert isinstance(exc, UnicodeDecodeError)
    return utf8_problem(exc.object)


def _too_deep(exc: BaseException) -> str:
    return DEEP_JSON_PROBLEM


def _os(exc: BaseException) -> str:
    return f"cannot be read: {getattr(exc, 'strerror', None) or exc}"


# exception type -> what it means for a source; looked up along the type's MRO (gzip.BadGzipFile is
# an OSError, so the more specific entries are found first)
FAILURES: dict[type, Callable[[BaseException], str]] = {
    EOFError: _gzip_ended,
    zlib.error: _corrupt,
    UnicodeDecodeError: _decode,
    RecursionError: _too_deep,
    pa.ArrowException: _arrow,
    OSError: _os,
}
FAILURES = {gzip.BadGzipFile: _corrupt, **FAILURES}


def describe(exc: BaseException) -> str | None:
    """What a read failure means, or None when `exc` is not one."""
    for kind in type(exc).__mro__:
        if kind in FAILURES:
            return FAILURES[kind](exc)
    return None


def guarded(name: str, records: Iterator) -> Iterator:
    """`records` (annotation.ingest.readers.Record items), with a failure of the file itself re-raised as
    ReadError("FILE:LINE: file: problem"), LINE the one after the last row read."""
    line = 0
    try:
        for record in records:
            line = record.line
            yield record
    except ReadError:
        raise
    except tuple(FAILURES) as exc:
        where = f":{line + 1}" if line else ""
        raise ReadError(f"{name}{where}: file: {describe(exc)}") from None
