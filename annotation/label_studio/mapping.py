"""Label Studio annotations -> judgment rows: the one mapping that export files, webhooks and pulls
share, and the labeling config bradley sets projects up with.

A task of bradley's pairwise project shows `prompt`, `answer1` (left) and `answer2` (right). When
bradley pushed it, which of the pair's two responses went on the left was drawn at random and the task
data says so (`bradley_swapped`); the mapping undoes it, so a judgment's response_a / response_b are
the pair's own order (ascending response id) whatever the annotator saw, and position bias cannot
leak into the store. Results:

- `comparison` (type `pairwise`, value `{"selected": "left" | "right"}`): the verdict;
- `verdict` (type `choices`, `Tie` or `Both bad`): a tie (both-bad is a tie, marked in metadata);
  it wins over a left/right pick in the same annotation (the annotator said neither is better);
- `rationale` (type `textarea`): kept as the judgment's rationale;
- `rank` (type `ranker`, Label Studio's ranking template, `value.ranker.answers` best first): a
  ranking of n answers becomes its n(n-1)/2 pairwise judgments.

Label Studio stores whatever a client posts (it accepted `"selected": "middle"`), so every result is
checked here: an unknown `from_name`, a result of the wrong type, a missing task or no verdict is a
RowError naming the annotation id. Cancelled (skipped) annotations yield no judgment.

A judgment's id hashes the annotation id and its `updated_at`: the same version of an annotation is the
same judgment however it arrives (export file, webhook, pull), and an edited annotation is a new
judgment that replaces the old one (annotation.label_studio.ledger).

    >>> task = {"id": 3, "data": {"prompt": "2+2?", "answer1": "5", "answer2": "4",
    ...                           "bradley_swapped": True}}
    >>> ann = {"id": 9, "completed_by": 2, "updated_at": "2026-12-02T09:17:32Z",
    ...        "result": [{"from_name": "comparison", "type": "pairwise", "value": {"selected": "right"}}]}
    >>> row = annotation_rows(task, ann)[0]
    >>> row["response_a"], row["response_b"], row["winner"], row["rater"]
    ('4', '5', 'a', 'human:ls:2')
"""

from __future__ import annotations

import itertools
from datetime import datetime, timezone

from annotation.ids import content_id

PAIRWISE = "comparison"   # the <Pairwise> control of bradley's project
CONTROLS = {PAIRWISE: "pairwise", "verdict": "choices", "rationale": "textarea", "rank": "ranker"}
SELECTED = {"left": "a", "right": "b"}
TIE_CHOICES = {"Tie": "tie", "Both bad": "both-bad"}
SWAPPED = "bradley_swapped"  # task data: the pair's response_b is shown on the left
RATER_PREFIX = "human:ls:"

LABEL_CONFIG = """<View>
  <Header value="Prompt"/>
  <Text name="prompt" value="$prompt"/>
  <Header value="Which answer is better? Click it."/>
  <Pairwise name="comparison" toName="answer1,answer2"/>
  <Text name="answer1" value="$answer1"/>
  <Text name="answer2" value="$answer2"/>
  <Header value="Or neither:"/>
  <Choices name="verdict" toName="prompt" choice="single" showInline="true">
    <Choice value="Tie"/>
    <Choice value="Both bad"/>
  </Choices>
  <TextArea name="rationale" toName="prompt" placeholder="Why? (optional)" maxSubmissions="1"
            editable="true"/>
</View>"""


class AnnotationError(ValueError):
    """One annotation cannot be a verdict: `field` says where (it names the annotation id)."""

    def __init__(self, annotation_id, field: str, problem: str):
        self.field = f"annotation[{annotation_id}].{field}"
        super().__init__(f"{self.field}: {problem}")


def version(ann: dict) -> str:
    """The annotation's updated_at (else created_at) as a canonical UTC ISO string, '' if none.

    >>> version({"updated_at": "2026-12-02T09:17:32.649968Z"})
    '2026-12-02T09:17:32.649968'
    """
    value = ann.get("updated_at") or ann.get("created_at")
    if not value:
        return ""
    try:
        stamp = datetime.fromisoformat(str(value))
    except ValueError:
        return str(value)
    return (stamp.astimezone(timezone.utc).replace(tzinfo=None) if stamp.tzinfo else stamp).isoformat()


def annotation_rows(task: dict | None, ann: dict) -> list[dict]:
    """Judgment rows (formats' `judgments` vocabulary) for one annotation of a task; [] when it was
    cancelled; AnnotationError when it holds no valid verdict."""
    aid = ann.get("id")
    if ann.get("was_cancelled"):
        return []
    if not isinstance(task, dict) or not isinstance(task.get("data"), dict):
        raise AnnotationError(aid, "task", "missing: the annotation came without its task's data")
    results = _checked_results(aid, ann.get("result"))
    base = {"rater": f"{RATER_PREFIX}{ann.get('completed_by')}", "created_at": ann.get("created_at"),
            "metadata": {"task_id": task.get("id"), "annotation_id": aid, "updated_at": version(ann),
                         "project": ann.get("project")}}
    if "rank" in results:
        return _ranking_rows(aid, task["data"], results["rank"], base, version(ann))
    return [_pairwise_row(aid, task["data"], results, base, version(ann))]


def _checked_results(aid, result) -> dict[str, dict]:
    if not isinstance(result, list) or not result:
        raise AnnotationError(aid, "result", "empty: the annotation holds no verdict")
    found = {}
    for i, r in enumerate(result):
        name = r.get("from_name") if isinstance(r, dict) else None
        if name not in CONTROLS:
            raise AnnotationError(aid, f"result[{i}].from_name", f"unknown control {name!r:.40}; "
                                  f"bradley's projects have {', '.join(CONTROLS)}")
        if r.get("type") != CONTROLS[name]:
            raise AnnotationError(aid, f"result[{i}].type", f"{r.get('type')!r:.20} from {name!r}, "
                                  f"expected {CONTROLS[name]!r}")
        if not isinstance(r.get("value"), dict):
            raise AnnotationError(aid, f"result[{i}].value", "must be an object")
        found[name] = r["value"]
    return found


def _task_text(aid, data: dict, key: str) -> str:
    value = data.get(key)
    if not isinstance(value, str):
        raise AnnotationError(aid, f"task.data.{key}", "missing: expected the text shown")
    return value


def _pairwise_row(aid, data: dict, results: dict, base: dict, ver: str) -> dict:
    left, right = _task_text(aid, data, "answer1"), _task_text(aid, data, "answer2")
    winner, kind = _pairwise_winner(aid, results)
    swapped = bool(data.get(SWAPPED))
    if swapped:  # undo the presentation: the pair's response_a was shown on the right
        left, right = right, left
        winner = {"a": "b", "b": "a"}.get(winner, winner)
    metadata = {**base["metadata"], "swapped": swapped, **({"verdict": kind} if kind else {})}
    return {**base, "prompt": _task_text(aid, data, "prompt"), "messages": data.get("messages"),
            "response_a": left, "response_b": right, "winner": winner,
            "rationale": _rationale(results.get("rationale")), "metadata": metadata,
            "id": content_id("label-studio", str(aid), ver)}


def _pairwise_winner(aid, results: dict) -> tuple[str, str | None]:
    """(winner as shown, 'both-bad' or None)."""
    choices = results.get("verdict", {}).get("choices")
    if choices is not None:
        picked = choices if isinstance(choices, list) else [choices]
        if len(picked) != 1 or picked[0] not in TIE_CHOICES:
            raise AnnotationError(aid, "result.verdict.choices", f"{picked!r:.40} is not one of "
                                  f"{', '.join(TIE_CHOICES)}")
        return "tie", (None if TIE_CHOICES[picked[0]] == "tie" else TIE_CHOICES[picked[0]])
    if PAIRWISE not in results:
        raise AnnotationError(aid, "result.from_name", f"no result from the {PAIRWISE!r} control "
                              "nor a Tie / Both bad choice: the annotation holds no verdict")
    selected = results[PAIRWISE].get("selected")
    if selected not in SELECTED:
        raise AnnotationError(aid, "result.value.selected", f"{selected!r:.20} is not 'left' or 'right'")
    return SELECTED[selected], None


def _rationale(value: dict | None) -> str | None:
    texts = (value or {}).get("text")
    texts = [texts] if isinstance(texts, str) else texts or []
    joined = "\n".join(t for t in texts if isinstance(t, str) and t.strip())
    return joined or None


def _ranking_rows(aid, data: dict, value: dict, base: dict, ver: str) -> list[dict]:
    """Each pair of ranked answers: the higher-ranked wins. The pair's order (response_a) is the
    order of the task's items, not of the ranking, so nothing of the ranking leaks into a/b."""
    items = data.get("items")
    if not isinstance(items, list):
        raise AnnotationError(aid, "task.data.items", "missing: a ranking task lists its answers")
    bodies = {i.get("id"): i.get("body") for i in items if isinstance(i, dict)}
    ranking = value.get("ranker")
    ranked = next(iter(ranking.values()), None) if isinstance(ranking, dict) and ranking else None
    if not isinstance(ranked, list) or len(ranked) < 2 or len(set(ranked)) != len(ranked):
        raise AnnotationError(aid, "result.value.ranker", "expected a list of two or more "
                              "distinct answer ids, best first")
    unknown = [r for r in ranked if not isinstance(bodies.get(r), str)]
    if unknown:
        raise AnnotationError(aid, "result.value.ranker", f"answers {unknown!r:.60} are not items "
                              "of the task")
    position = {item: n for n, item in enumerate(bodies)}
    rank = {item: n for n, item in enumerate(ranked)}
    rows = []
    for a, b in itertools.combinations(sorted(ranked, key=position.get), 2):
        rows.append({**base, "prompt": _task_text(aid, data, "prompt"), "messages": data.get("messages"),
                     "response_a": bodies[a], "response_b": bodies[b],
                     "winner": "a" if rank[a] < rank[b] else "b",
                     "metadata": {**base["metadata"], "items": [a, b]},
                     "id": content_id("label-studio", str(aid), ver, str(a), str(b))})
    return rows
