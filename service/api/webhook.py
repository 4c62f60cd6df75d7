"""Label Studio's webhook bodies, checked as hostile as every other body (service/api/payloads.py):
POST /webhooks/label-studio (service/api/routes_data.py) ingests the verdict one carries, or retracts
the annotations one deletes."""

from __future__ import annotations

from service.api.payloads import PayloadError, expect_object

WEBHOOK_VERDICTS = ("ANNOTATION_CREATED", "ANNOTATION_UPDATED")
WEBHOOK_DELETED = "ANNOTATIONS_DELETED"


def webhook_event(value) -> tuple[str, object] | None:
    """A Label Studio webhook body -> ("verdict", one task of its JSON export holding just that
    annotation), ("deleted", [annotation ids]) or None for actions that carry no verdict
    (TASKS_CREATED, ...). Only the fields a judgment needs are kept: the body also carries the
    project's access token, which must go no further.

    >>> webhook_event({"action": "ANNOTATIONS_DELETED", "annotations": [{"id": 4}, {"id": 5}]})
    ('deleted', [4, 5])
    """
    expect_object(value)
    action = value.get("action")
    if not isinstance(action, str):
        raise PayloadError("action", "missing; is this a Label Studio webhook?")
    if action == WEBHOOK_DELETED:
        return "deleted", _deleted_ids(value.get("annotations"))
    if action not in WEBHOOK_VERDICTS:
        return None
    annotation, task = value.get("annotation"), value.get("task")
    if not isinstance(annotation, dict):
        raise PayloadError("annotation", "must be an object")
    if not isinstance(task, dict) or not isinstance(task.get("data"), dict):
        raise PayloadError("task.data", f"annotation {annotation.get('id')!r:.20}: the task is "
                           "missing; expected an object with prompt, answer1 and answer2")
    kept = {k: annotation.get(k) for k in
            ("id", "result", "completed_by", "created_at", "updated_at", "was_cancelled", "project")}
    return "verdict", {"id": task.get("id"), "data": task["data"], "annotations": [kept]}


def _deleted_ids(annotations) -> list[int]:
    if not isinstance(annotations, list) or not annotations:
        raise PayloadError("annotations", "must be a non-empty list of {\"id\": N} objects")
    ids = [a.get("id") if isinstance(a, dict) else None for a in annotations]
    bad = next((i for i, v in enumerate(ids) if not isinstance(v, int) or isinstance(v, bool)), None)
    if bad is not None:
        raise PayloadError(f"annotations[{bad}].id", "must be an integer annotation id")
    return ids
