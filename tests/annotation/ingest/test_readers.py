"""The columnar path's raw reads: blocks of whole lines, mapped from a plain file or streamed from
a gzip, and the source's sha256 over mapped windows."""

from __future__ import annotations

import gzip
import hashlib
import random

import pytest

from annotation.ingest import readers


def _lines(seed: int) -> bytes:
    rng = random.Random(seed)
    lengths = rng.choices([1, 30, 400, 5_000, 70_000], k=300)  # some lines longer than any block
    return b"".join(b"x" * n + b"\n" for n in lengths) + b'{"last": "line without a newline"}'


@pytest.mark.parametrize("size", [64, 4096, 5_000, 1 << 20])
def test_blocks_are_whole_lines_mapped_or_streamed(tmp_path, size):
    data = _lines(size)
    plain, packed = tmp_path / "a.jsonl", tmp_path / "a.jsonl.gz"
    plain.write_bytes(data)
    packed.write_bytes(gzip.compress(data))
    mapped = [b.to_pybytes() for b in readers._mapped_blocks(plain, size)]
    with readers._stream(packed) as stream:
        streamed = [b.to_pybytes() for b in readers._line_blocks(stream, size)]
    for blocks in (mapped, streamed):
        assert b"".join(blocks) == data
        assert all(block.endswith(b"\n") for block in blocks[:-1])
        assert len(blocks) > 1


def test_source_sha256_of_mapped_windows_is_the_files(tmp_path, monkeypatch):
    monkeypatch.setattr(readers, "HASH_BLOCK", 4096)  # many windows, the last one short
    path = tmp_path / "a.jsonl"
    path.write_bytes(_lines(0))
    assert readers.source_sha256(str(path)) == hashlib.sha256(path.read_bytes()).hexdigest()
    path.write_bytes(b"")
    assert readers.source_sha256(str(path)) == hashlib.sha256(b"").hexdigest()
