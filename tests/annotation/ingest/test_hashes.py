"""Content ids in bulk: the C loop (annotation/_hashes.c) and its Python fallback agree with hashlib."""

from __future__ import annotations

import hashlib

import pyarrow as pa
import pytest

from annotation import ids as content_ids
from annotation.ids import content_id

KEYS = ["What is 2+2?", "", "é" * 300, "[{\"content\":\"hi\",\"role\":\"user\"}]"]
TEXTS = ["4", "", "ü" * 1000, "five", "a\x1fb", "long " * 400]


def expected(keys, key_of_row, texts):
    return [hashlib.sha256(f"{keys[k]}\x1f{t}".encode()).hexdigest()[:24]
            for k, t in zip(key_of_row, texts, strict=True)]


@pytest.fixture(params=["c", "python"])
def hasher(request, monkeypatch):
    if request.param == "c":
        if content_ids._hashes is None:
            pytest.fail("annotation._hashes was not built (pip install -e . compiles it; needs "
                        "gcc and OpenSSL's headers)")
    else:
        monkeypatch.setattr(content_ids, "_hashes", None)
    return content_ids.keyed_ids


def test_keyed_ids_equal_sha256_of_key_separator_text(hasher):
    key_of_row = [0, 1, 2, 3, 0, 2]
    ids = hasher(pa.array(KEYS), pa.array(key_of_row, pa.int32()), pa.array(TEXTS))
    assert ids.to_pylist() == expected(KEYS, key_of_row, TEXTS)
    assert ids.to_pylist()[0] == content_id("What is 2+2?", "4")


def test_sliced_and_chunked_arrays_hash_their_own_rows(hasher):
    keys = pa.array(["skip", *KEYS]).slice(1)
    texts = pa.chunked_array([pa.array(["skip", *TEXTS[:3]]).slice(1), pa.array(TEXTS[3:])])
    key_of_row = pa.array([9, 3, 2, 1, 0, 3, 2], pa.int32()).slice(1)
    ids = hasher(keys, key_of_row, texts)
    assert ids.to_pylist() == expected(KEYS, [3, 2, 1, 0, 3, 2], TEXTS)


def test_empty_and_null_inputs(hasher):
    assert hasher(pa.array(["k"]), pa.array([], pa.int32()), pa.array([], pa.string())).to_pylist() == []
    with pytest.raises(ValueError, match="cannot be null"):
        hasher(pa.array(["k"]), pa.array([0], pa.int32()), pa.array([None], pa.string()))


def test_c_loop_rejects_out_of_range_key_indices():
    if content_ids._hashes is None:
        pytest.fail("annotation._hashes was not built")
    with pytest.raises(ValueError, match="out of range"):
        content_ids.keyed_ids(pa.array(["k"]), pa.array([1], pa.int32()), pa.array(["t"]))


def test_id_set_flags_first_occurrences_across_calls():
    if content_ids._hashes is None:
        pytest.fail("annotation._hashes was not built")
    ids = [hashlib.sha256(str(i % 7).encode()).hexdigest()[:24] for i in range(20)]
    seen = content_ids._hashes.IdSet()
    first = seen.firsts(*content_ids.string_buffers(pa.array(ids[:10])), 10)
    again = seen.firsts(*content_ids.string_buffers(pa.array(ids[10:])), 10)
    assert list(first) == [1] * 7 + [0] * 3 and list(again) == [0] * 10 and len(seen) == 7
    with pytest.raises(ValueError, match="not 24 characters"):
        seen.firsts(*content_ids.string_buffers(pa.array(["short"])), 1)


@pytest.mark.parametrize("built", [True, False])
def test_seen_ids_give_the_same_flags_with_and_without_the_c_set(monkeypatch, built):
    import annotation.ingest.seen as seen_mod

    if not built:
        monkeypatch.setattr(seen_mod, "_hashes", None)
    rid = [hashlib.sha256(str(i % 5).encode()).hexdigest()[:24] for i in range(12)]
    chunk = pa.table({"pid": ["p", "q", "p"] * 4, "rid_a": rid, "rid_b": rid[::-1],
                      "jid": [None] * 12, "id": pa.nulls(12, pa.string())})
    seen = seen_mod.SeenIds()
    flagged = seen.flag("judgments", chunk)
    assert flagged.column("new_p").to_pylist() == [True, True] + [False] * 10
    assert flagged.column("new_a").to_pylist() == [True] * 5 + [False] * 7
    assert flagged.column("new_b").to_pylist() == [False] * 12  # the same five ids, already seen
    assert seen.flag("judgments", chunk).column("new_a").to_pylist() == [False] * 12
