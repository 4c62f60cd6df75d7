"""The report computed in bounded memory gives the figures of the in-memory report it replaced
(pinned in tests/analysis/fixtures/report_before/, see tests/analysis/report_stores.py): integers
and strings equal, floats within 1e-9, on simulated stores (with and without the bootstrap, an AI
judge in both orders, self-comparisons) and on MT-Bench and hh-rlhf; and under a tiny memory limit
and tiny blocks of prompts, the same figures again."""

from __future__ import annotations

import json
import math

import pytest

from analysis import report, store_analyses
from annotation.store import Store
from tests.analysis.report_stores import CASES, FIXTURES, fixture_name


def assert_same(got, want, path="report"):
    if isinstance(want, dict):
        assert isinstance(got, dict) and list(got) == list(want), f"{path}: keys differ"
        for key in want:
            assert_same(got[key], want[key], f"{path}.{key}")
    elif isinstance(want, list):
        assert isinstance(got, list) and len(got) == len(want), f"{path}: lengths differ"
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            assert_same(g, w, f"{path}[{i}]")
    elif isinstance(want, float) and not isinstance(got, bool):
        assert isinstance(got, float | int) and math.isclose(got, want, rel_tol=0, abs_tol=1e-9), \
            f"{path}: {got!r} != {want!r}"
    else:
        assert type(got) is type(want) and got == want, f"{path}: {got!r} != {want!r}"


def _store(tmp_path, case, shared_data):
    build, needs_data, _ = CASES[case]
    store = Store(tmp_path / f"{case}.duckdb")
    build(store, shared_data) if needs_data else build(store)
    return store


def _built(store, raters, **kwargs):
    built = report.build_report(store, raters=raters, **kwargs)
    built.pop("snapshot_id")
    return json.loads(json.dumps(built))  # as the JSON file holds it: tuples become lists


@pytest.mark.parametrize("case", list(CASES))
def test_the_report_is_the_pinned_one(case, tmp_path, shared_data):
    with _store(tmp_path, case, shared_data) as store:
        for raters in CASES[case][2]:
            pinned = json.loads((FIXTURES / fixture_name(case, raters)).read_text())
            assert_same(_built(store, raters), pinned, f"{case}/{raters or 'all'}")


def test_small_blocks_and_a_small_memory_limit_change_nothing(tmp_path, shared_data, monkeypatch):
    # 6,000 prompts in blocks of ~1,000 verdicts: the worst cycles are chosen across blocks, ties
    # kept in item order; DuckDB spills under 64 MB
    pinned = json.loads((FIXTURES / fixture_name("simulated_medium", None)).read_text())
    blocks = []
    coded = store_analyses.coded_verdicts
    monkeypatch.setattr(store_analyses, "BLOCK_VERDICTS", 1_000)
    monkeypatch.setattr(store_analyses, "coded_verdicts", lambda *a: blocks.append(a[0]) or coded(*a))
    with _store(tmp_path, "simulated_medium", shared_data) as store:
        assert_same(_built(store, None, memory_limit="64MB"), pinned)
        limit = store.con.execute("SELECT current_setting('memory_limit')").fetchone()[0]
    assert limit != "64.0 MiB"  # the store's own setting is back
    assert len(blocks) >= 55 and sum(map(len, blocks)) == pinned["n_judgments"]
    firsts, lasts = [b[0] for b in blocks], [b[-1] for b in blocks]
    assert all(last < first for last, first in zip(lasts[:-1], firsts[1:], strict=True)), \
        "a prompt was split"


def test_pinned_comparison_catches_a_difference():
    with pytest.raises(AssertionError, match=r"report.a.b\[1\]"):
        assert_same({"a": {"b": [1, 2.0]}}, {"a": {"b": [1, 2.0 + 1e-8]}})
    with pytest.raises(AssertionError, match="report.n"):
        assert_same({"n": 2.0}, {"n": 2})
