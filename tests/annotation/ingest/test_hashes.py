"""Content ids in bulk (annotation.ids.keyed_ids and joined_ids, in C where annotation/_sha256.c is
built and with hashlib) equal sha256 of key, 0x1f, text; the ids a batch has seen, in C tables and
in Python sets, flag the same rows."""

from __future__ import annotations

import hashlib

import numpy as np
import pyarrow as pa
import pytest

import annotation.ids as ids_mod
import annotation.ingest.seen as seen_mod
from annotation.ids import content_id, joined_ids, keyed_ids

KEYS = ["What is 2+2?", "", "é" * 300, "[{\"content\":\"hi\",\"role\":\"user\"}]"]
TEXTS = ["4", "", "ü" * 1000, "five", "a\x1fb", "long " * 400]


@pytest.fixture(params=["c", "hashlib"], autouse=True)
def hashing(request, monkeypatch):
    if request.param == "hashlib":
        monkeypatch.setattr(ids_mod, "native", None)
        monkeypatch.setattr(seen_mod, "native", None)  # the seen ids in Python sets, too
    elif ids_mod.native is None:
        pytest.skip("annotation/_sha256.c is not built here (no C compiler or OpenSSL headers)")
    return request.param


def expected(keys, key_of_row, texts):
    return [hashlib.sha256(f"{keys[k]}\x1f{t}".encode()).hexdigest()[:24]
            for k, t in zip(key_of_row, texts, strict=True)]


def test_keyed_ids_equal_sha256_of_key_separator_text():
    key_of_row = [0, 1, 2, 3, 0, 2]
    ids = keyed_ids(pa.array(KEYS), pa.array(key_of_row, pa.int32()), pa.array(TEXTS))
    assert ids.to_pylist() == expected(KEYS, key_of_row, TEXTS)
    assert ids.to_pylist()[0] == content_id("What is 2+2?", "4")


def test_sliced_and_chunked_arrays_hash_their_own_rows():
    keys = pa.array(["skip", *KEYS]).slice(1)
    texts = pa.chunked_array([pa.array(["skip", *TEXTS[:3]]).slice(1), pa.array(TEXTS[3:])])
    key_of_row = pa.array([9, 3, 2, 1, 0, 3, 2], pa.int32()).slice(1)
    ids = keyed_ids(keys, key_of_row, texts)
    assert ids.to_pylist() == expected(KEYS, [3, 2, 1, 0, 3, 2], TEXTS)


def test_large_string_columns_hash_like_plain_ones():
    texts = pa.array(TEXTS, pa.large_string())
    ids = keyed_ids(pa.array(KEYS, pa.large_string()), pa.array([1, 0, 3, 2, 1, 0]), texts)
    assert ids.to_pylist() == expected(KEYS, [1, 0, 3, 2, 1, 0], TEXTS)


def test_empty_and_null_inputs():
    assert keyed_ids(pa.array(["k"]), pa.array([], pa.int32()), pa.array([], pa.string())).to_pylist() == []
    with pytest.raises(ValueError, match="cannot be null"):
        keyed_ids(pa.array(["k"]), pa.array([0], pa.int32()), pa.array([None], pa.string()))


def test_seen_ids_flag_the_first_row_of_each_new_id_across_chunks():
    from annotation.ingest.seen import SeenIds

    rid = [hashlib.sha256(str(i % 5).encode()).hexdigest()[:24] for i in range(12)]
    p, q = (hashlib.sha256(t).hexdigest()[:24] for t in (b"p", b"q"))
    chunk = pa.table({"pid": [p, q, p] * 4, "rid_a": rid, "rid_b": rid[::-1],
                      "jid": rid[:6] * 2, "id": pa.nulls(12, pa.string())})
    seen = SeenIds()
    flagged = seen.flag("judgments", chunk)
    assert flagged.column("new_p").to_pylist() == [True, True] + [False] * 10
    assert flagged.column("new_a").to_pylist() == [True] * 5 + [False] * 7
    assert flagged.column("new_b").to_pylist() == [False] * 12  # the same five ids, already seen
    assert flagged.column("new_j").to_pylist() == [True] * 5 + [False] * 7  # a judgment id is kept once too
    again = seen.flag("judgments", chunk)
    assert again.column("new_a").to_pylist() == again.column("new_j").to_pylist() == [False] * 12


def test_joined_ids_hash_the_parts_joined_by_the_separator():
    parts = [pa.array(TEXTS), pa.array([None, *TEXTS[1:]]).slice(0)]
    ids = joined_ids(parts)
    assert ids.to_pylist() == [content_id(a, b or "") for a, b in zip(TEXTS, [None, *TEXTS[1:]], strict=True)]


def test_the_c_digests_refuse_offsets_and_indices_out_of_range(hashing):
    if hashing != "c":
        pytest.skip("the C function's own checks")
    good = (np.array([0, 1], np.int32), b"k", np.zeros(1, np.int32), np.array([0, 2], np.int32), b"ab")
    assert ids_mod.native.digests(*good) == hashlib.sha256(b"kab").digest()
    for i, bad in ((3, np.array([0, 3], np.int32)), (2, np.array([1], np.int32)),
                   (3, np.array([2, 1], np.int32)), (0, np.array([0, 2], np.int32))):
        with pytest.raises(ValueError, match="digests"):
            ids_mod.native.digests(*good[:i], bad, *good[i + 1:])


def test_c_tables_and_python_sets_flag_the_same_rows_as_they_grow(hashing, monkeypatch):
    monkeypatch.setattr(seen_mod, "FIRST_IDS", 100)  # a table made for 100 ids, then given 5,000
    rng = np.random.default_rng(0)
    pool = [hashlib.sha256(str(i).encode()).hexdigest()[:24] for i in range(3000)]
    table, reference = seen_mod._empty_sets()["responses"], set()
    assert isinstance(table, seen_mod.IdSet if hashing == "hashlib" else seen_mod.IdTable)
    for size in (1, 10, 300, 1000, 2000, 0, 700):
        chunk = [pool[i] for i in rng.integers(0, len(pool), size)]
        expected = []
        for value in chunk:
            expected.append(value not in reference)
            reference.add(value)
        assert table.first_rows(pa.array(chunk, pa.string())).tolist() == expected
        assert len(table) == len(reference)


def test_the_c_table_refuses_what_is_not_a_content_id(hashing):
    if hashing != "c":
        pytest.skip("the C function's own checks")
    table = seen_mod.IdTable()
    for bad in ("abc", "g" * 24, "A" * 24):
        with pytest.raises(ValueError, match="24 hex"):
            table.first_rows(pa.array([bad]))
    full = np.zeros(2 * 4, np.uint64)
    ids = pa.array([hashlib.sha256(str(i).encode()).hexdigest()[:24] for i in range(5)])
    with pytest.raises(ValueError, match="full"):
        ids_mod.native.first_new(full, *ids_mod.string_layout(ids), np.zeros(5, np.uint8))
