"""POST /webhooks/label-studio through TestClient, with the real webhook bodies Label Studio 1.23.2
sent (shared/data/label_studio/webhooks.jsonl): the shared-secret header, ANNOTATION_UPDATED
replacing a verdict, ANNOTATIONS_DELETED retracting it, HTTP-speaking errors, and the project's
access token going nowhere."""

from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient

from service.api.app import create_app
from service.api.settings import load_settings

SECRET = "shared-secret-0123456789"
TOKEN = "project-token-that-must-not-be-stored-0123"


@pytest.fixture
def bodies(shared_data):
    lines = (shared_data / "label_studio" / "webhooks.jsonl").read_text().splitlines()
    out = [json.loads(line) for line in lines]
    for body in out:
        body["project"]["token"] = TOKEN
    return out


@pytest.fixture
def client(tmp_path):
    settings = load_settings(db=str(tmp_path / "hooks.duckdb"), device="cpu",
                             api_keys="api-key-0123456789", label_studio_webhook_secret=SECRET)
    with TestClient(create_app(settings), raise_server_exceptions=False) as c:
        yield c


def post(client, body, secret=SECRET):
    headers = {} if secret is None else {"X-Bradley-Webhook-Secret": secret}
    return client.post("/webhooks/label-studio", json=body, headers=headers)


def store_of(client):
    svc = client.app.state.service
    return svc, svc.store


def winners(client):
    svc, store = store_of(client)
    t = svc.call_store(store.judgments)
    return sorted(zip(t.column("prompt").to_pylist(), t.column("winner").to_pylist(), strict=True))


def test_secret_header_is_required_and_checked(client, bodies):
    assert post(client, bodies[1], secret=None).status_code == 401
    wrong = post(client, bodies[1], secret="not-the-secret-0000")
    assert wrong.status_code == 403 and "X-Bradley-Webhook-Secret" in wrong.json()["error"]
    assert post(client, bodies[1]).status_code == 201
    assert post(client, bodies[1]).json()["duplicate"] is True


def test_update_replaces_and_delete_retracts(client, bodies):
    assert post(client, bodies[0]).status_code == 202  # TASKS_CREATED carries no verdict
    assert [post(client, b).status_code for b in bodies[1:3]] == [201, 201]
    assert winners(client) == [("Name a prime.", "b"), ("What is 2+2?", "a")]
    updated = json.loads(json.dumps(bodies[1]))
    updated["action"] = "ANNOTATION_UPDATED"
    updated["annotation"]["result"][0]["value"]["selected"] = "right"
    updated["annotation"]["updated_at"] = "2026-12-02T11:00:00.000000Z"
    assert post(client, updated).json()["rows_ok"] == 1
    assert winners(client) == [("Name a prime.", "b"), ("What is 2+2?", "b")]
    deleted = {"action": "ANNOTATIONS_DELETED", "annotations": [{"id": 1}], "project": bodies[1]["project"]}
    answer = post(client, deleted)
    assert answer.status_code == 201 and answer.json() == {"deleted": 1, "retracted": 1}
    assert winners(client) == [("Name a prime.", "b")]
    assert post(client, bodies[1]).status_code in (200, 201)  # the old body again: still deleted
    assert winners(client) == [("Name a prime.", "b")]


def test_invalid_annotations_are_422_in_http_terms_and_nothing_keeps_the_token(client, bodies):
    answers = [post(client, b) for b in bodies]
    bad = [a.json() for a in answers if a.status_code == 422]
    assert [b["field"] for b in bad] == ["annotation[3].result.value.selected",
                                         "annotation[4].result[0].from_name",
                                         "annotation[7].result.value.selected",
                                         "annotation[8].result[0].from_name"]
    assert all("--on-error" not in b["error"] and "not stored" in b["error"] for b in bad)
    missing = json.loads(json.dumps(bodies[1]))
    missing["task"] = None
    assert post(client, missing).json()["field"] == "task.data"
    assert post(client, {"action": "ANNOTATIONS_DELETED", "annotations": [{"id": "x"}]}
                ).json()["field"] == "annotations[0].id"
    svc, store = store_of(client)
    dump = svc.call_store(lambda: store.con.execute(
        "SELECT string_agg(CAST(metadata AS VARCHAR), ' ') FROM judgments").fetchone()[0]
        + str(store.con.execute("SELECT * FROM batches").fetchall()))
    assert TOKEN not in dump
