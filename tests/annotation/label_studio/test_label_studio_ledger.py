"""Each Label Studio verdict counted exactly once, from the real export of shared/data/label_studio:
an edited annotation replaces its verdict, a deleted one is retracted, an old export re-ingested
changes nothing, and a snapshot taken before replays as it was. Also the mapping of bradley's own
tasks (swap undone, tie, both bad, rationale) and the selection strategies."""

from __future__ import annotations

import json

import numpy as np
import pytest

from annotation.ingest.batch import IngestError, ingest_file, ingest_records
from annotation.label_studio import ledger as ls_ledger
from annotation.label_studio import mapping as ls_mapping
from annotation.label_studio import selection


def winners(store, snapshot=None):
    t = store.judgments(snapshot)
    return sorted(zip(t.column("prompt").to_pylist(), t.column("winner").to_pylist(), strict=True))


def edited(shared_data, selected="right", updated_at="2026-12-02T10:00:00.000001Z"):
    """export_sync.json with annotation 1 edited in Label Studio: a new verdict and updated_at."""
    tasks = json.loads((shared_data / "label_studio" / "export_sync.json").read_text())
    ann = tasks[0]["annotations"][0]
    ann["result"][0]["value"]["selected"] = selected
    ann["updated_at"] = updated_at
    return tasks


def test_an_edited_annotation_replaces_its_verdict_and_old_exports_change_nothing(store, shared_data,
                                                                                   tmp_path):
    export = shared_data / "label_studio" / "export_sync.json"
    ingest_file(store, export)
    before = store.create_snapshot()
    assert winners(store) == [("Name a prime.", "b"), ("What is 2+2?", "a")]
    result = ingest_records(store, edited(shared_data), fmt="label-studio")
    assert (result.rows_ok, result.rows_existing) == (1, 1)
    assert winners(store) == [("Name a prime.", "b"), ("What is 2+2?", "b")]
    assert winners(store, before) == [("Name a prime.", "b"), ("What is 2+2?", "a")]
    copy = tmp_path / "old_export.json"  # the old export again, under another name: a new sha256
    copy.write_text(export.read_text() + "\n")
    assert ingest_file(store, copy).rows_ok == 0
    stale = edited(shared_data, "left", "2026-12-02T09:30:00Z")  # older than the edit
    assert ingest_records(store, stale, fmt="label-studio").rows_ok == 0
    assert winners(store) == [("Name a prime.", "b"), ("What is 2+2?", "b")]
    assert store.counts()["pairs"] == 2


def test_a_deleted_annotation_is_retracted_and_never_counted_again(store, shared_data):
    ingest_file(store, shared_data / "label_studio" / "export_sync.json")
    assert ls_ledger.remove(store, {1: None}, "deleted", "test") == 1
    assert ls_ledger.remove(store, {1: None}, "deleted", "test") == 0  # the same event again
    assert winners(store) == [("Name a prime.", "b")]
    assert ingest_records(store, edited(shared_data), fmt="label-studio").rows_ok == 0
    assert winners(store) == [("Name a prime.", "b")]


def test_webhook_shaped_task_and_export_count_once(store, shared_data):
    bodies = (shared_data / "label_studio" / "webhooks.jsonl").read_text().splitlines()
    body = json.loads(bodies[1])
    task = {"id": body["task"]["id"], "data": body["task"]["data"], "annotations": [body["annotation"]]}
    assert ingest_records(store, [task], fmt="label-studio").rows_ok == 1
    result = ingest_file(store, shared_data / "label_studio" / "export_sync.json")
    assert (result.rows_ok, result.rows_existing) == (1, 1)


def _task(result, swapped=False, **extra):
    return {"id": 5, "data": {"prompt": "p", "answer1": "L", "answer2": "R",
                              ls_mapping.SWAPPED: swapped},
            "annotations": [{"id": 50, "completed_by": 7, "updated_at": "2026-01-01T00:00:00Z",
                             "result": result, **extra}]}


PICK_LEFT = {"from_name": "comparison", "to_name": "answer1,answer2", "type": "pairwise",
             "value": {"selected": "left"}}


@pytest.mark.parametrize("result,swapped,expected", [
    ([PICK_LEFT], False, ("L", "R", "a", None)),
    ([PICK_LEFT], True, ("R", "L", "b", None)),  # shown swapped, "left" = the pair's response_b
    ([{"from_name": "verdict", "type": "choices", "value": {"choices": ["Tie"]}},
      {"from_name": "rationale", "type": "textarea", "value": {"text": ["same facts"]}}],
     False, ("L", "R", "tie", "same facts")),
    ([{"from_name": "verdict", "type": "choices", "value": {"choices": ["Both bad"]}}, PICK_LEFT],
     True, ("R", "L", "tie", None)),
])
def test_bradley_task_mapping(store, result, swapped, expected):
    ingest_records(store, [_task(result, swapped)], fmt="label-studio")
    t = store.judgments()
    row = {c: t.column(c)[0].as_py() for c in ("response_a_text", "response_b_text", "winner",
                                              "rationale", "rater", "metadata")}
    assert (row["response_a_text"], row["response_b_text"], row["winner"], row["rationale"]) == expected
    assert row["rater"] == "human:ls:7" and json.loads(row["metadata"])["swapped"] is swapped


@pytest.mark.parametrize("result,field", [
    ([{"from_name": "comparison", "type": "choices", "value": {"choices": ["Tie"]}}],
     "annotation[50].result[0].type"),
    ([{"from_name": "nosuch", "type": "pairwise", "value": {"selected": "left"}}],
     "annotation[50].result[0].from_name"),
    ([{"from_name": "verdict", "type": "choices", "value": {"choices": ["Maybe"]}}],
     "annotation[50].result.verdict.choices"),
])
def test_invalid_results_are_reported_by_annotation_id(store, result, field):
    with pytest.raises(IngestError) as info:
        ingest_records(store, [_task(result)], fmt="label-studio")
    assert info.value.field == field
    assert ingest_records(store, [_task([PICK_LEFT], was_cancelled=True)],
                          fmt="label-studio").rows_ok == 0  # skipped, not an error


def test_a_missing_task_is_reported(store):
    with pytest.raises(IngestError) as info:
        ingest_records(store, [{"id": 1, "data": None, "annotations": [{"id": 3, "result": []}]}],
                       fmt="label-studio")
    assert info.value.field == "annotation[3].task"


def test_selection_strategies_by_hand():
    cols = {"prompt_id": ["p", "p", "q", "q", "r"], "votes_a": [1, 3, 0, 2, 0],
            "votes_b": [1, 0, 0, 1, 0], "ties": [1, 0, 1, 0, 0], "prompt_judgments": [5, 5, 3, 3, 0]}
    rng = np.random.default_rng(1)
    # split 1-1 (+tie, 3 votes) before tie-only (gap 0, 1 vote) before 2-1 (gap 1); 3-0 cannot flip
    assert selection.disagreement(cols, rng=rng).tolist() == [0, 2, 3]
    # r has no judgments; q's two pairs (3 judgments, then 3 + the first pair) before p's (5)
    order = selection.coverage(cols, rng=rng).tolist()
    assert order[0] == 4 and set(order[1:3]) == {2, 3} and set(order[3:]) == {0, 1}
    # sigma(0) = 0.5 exactly, then |sigma(0.1) - 0.5| = 0.025, then |sigma(-2) - 0.5| = 0.381
    order = selection.select("uncertain", cols, 3, scores=([0, 1, 5, 0, 3], [0, 1.1, 0, 2, 3]))
    assert order.tolist()[:3] in ([0, 4, 1], [4, 0, 1])
    with pytest.raises(ValueError, match="--model"):
        selection.select("uncertain", cols, 3)


def test_choose_reads_candidates_and_votes_from_the_store(store):
    """Pairs of the store's responses not yet pushed; votes from its judgments (two raters split
    on Q0's (x, y), one vote on Q1's): `disagreement` takes the split pair first, `uncertain` the
    pair whose (fake) rewards are closest, and a pushed pair is never a candidate again."""
    from annotation.label_studio import sync as ls

    rows = [{"prompt": "Q0", "response_a": "x", "response_b": "y", "winner": w, "rater": r}
            for w, r in (("a", "u1"), ("b", "u2"))]
    rows += [{"prompt": "Q0", "response_a": "y", "response_b": "zzzz", "winner": "a", "rater": "u1"},
             {"prompt": "Q1", "response_a": "p", "response_b": "qq", "winner": "a", "rater": "u1"}]
    ingest_records(store, rows)
    ls_ledger.record_project(store, "http://ls", 1, "t", 1)
    proj = ls.project(store, "http://ls")
    picked, n = ls.choose(store, proj, "disagreement", 1)
    assert n == 4 and {picked[0]["text_a"], picked[0]["text_b"]} == {"x", "y"}
    by_length = lambda prompts, responses: [float(len(r)) for r in responses]  # noqa: E731
    picked, _ = ls.choose(store, proj, "uncertain", 4, scorer=by_length)
    gaps = [abs(len(r["text_a"]) - len(r["text_b"])) for r in picked]
    assert gaps == sorted(gaps) and gaps[0] == 0  # x vs y: equal rewards, sigma = 1/2
    ls_ledger.record_tasks(store, "http://ls", 1, [(9, picked[0]["prompt_id"], picked[0]["response_a"],
                                                   picked[0]["response_b"], False, "uncertain")])
    assert ls.choose(store, proj, "random", 10)[1] == 3
