"""Routing and policy through TestClient (no sockets): readiness, read-only mode, keys, error JSON."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from service.api.app import create_app
from service.api.settings import load_settings
from tests.service.conftest import API_KEY, make_db

ITEM = {"items": [{"prompt": "p", "response": "r"}]}


def client_for(tmp_path, **overrides) -> TestClient:
    settings = load_settings(db=str(tmp_path / "app.duckdb"), device="cpu", **overrides)
    return TestClient(create_app(settings), raise_server_exceptions=False)


def test_without_a_model_readyz_and_score_are_503_with_the_fix(tmp_path):
    with client_for(tmp_path) as c:
        assert c.get("/healthz").status_code == 200
        assert c.get("/readyz").status_code == 503
        r = c.post("/score", json=ITEM)
        assert r.status_code == 503 and "--model" in r.json()["error"]
        assert r.headers["retry-after"] == "1"


def test_read_only_server_refuses_uploads(tmp_path, tiny_models):
    db = make_db(tmp_path / "ro.duckdb", tiny_models)
    settings = load_settings(db=db, read_only=True, api_keys=API_KEY, model="rm-tiny-a", device="cpu")
    with TestClient(create_app(settings)) as c:
        assert c.post("/score", json=ITEM).status_code == 200
        r = c.post("/judgments", json=[{"prompt": "p"}], headers={"Authorization": f"Bearer {API_KEY}"})
        assert r.status_code == 403 and "read-only" in r.json()["error"]
        assert [m["id"] for m in c.get("/models").json()["models"]] == ["rm-tiny-a", "rm-tiny-b"]


def test_a_server_without_keys_disables_writes(tmp_path):
    with client_for(tmp_path) as c:
        r = c.post("/pairs", json=[{}], headers={"Authorization": "Bearer some-key-123"})
        assert r.status_code == 403 and "BRADLEY_API_KEYS" in r.json()["error"]


def test_score_can_require_a_key(tmp_path, tiny_models):
    with client_for(tmp_path, model=tiny_models["rm-tiny-a"], api_keys=API_KEY,
                    score_requires_key=True) as c:
        assert c.post("/score", json=ITEM).status_code == 401
        assert c.post("/get_reward", json={"query": ["x"]}).status_code == 401
        ok = c.post("/score", json=ITEM, headers={"Authorization": f"Bearer {API_KEY}"})
        assert ok.status_code == 200 and ok.json()["model"] == "rm-tiny-a"


def test_unknown_routes_and_methods_answer_error_json(tmp_path):
    with client_for(tmp_path) as c:
        assert c.get("/nope").json() == {"error": "Not Found", "field": None}
        r = c.get("/score")
        assert r.status_code == 405 and r.json()["field"] is None


def test_too_many_items_is_413(tmp_path, tiny_models):
    with client_for(tmp_path, model=tiny_models["rm-tiny-a"], max_items_per_request=2) as c:
        r = c.post("/score", json={"items": ITEM["items"] * 3})
        assert (r.status_code, r.json()["field"]) == (413, "items")


def test_apps_do_not_share_state(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    with client_for(tmp_path / "a") as a, client_for(tmp_path / "b") as b:
        a.get("/healthz")
        a.get("/healthz")
        assert 'bradley_responses_total{route="/healthz",status="200"} 2.0' in a.get("/metrics").text
        assert 'route="/healthz"' not in b.get("/metrics").text


@pytest.mark.parametrize("path", ["/judgments", "/pairs", "/feedback"])
def test_uploads_check_on_error(tmp_path, path):
    with client_for(tmp_path, api_keys=API_KEY) as c:
        r = c.post(f"{path}?on_error=ignore", json=[{}], headers={"Authorization": f"Bearer {API_KEY}"})
        assert (r.status_code, r.json()["field"]) == (422, "on_error")


def test_serve_shortens_the_interpreter_lock_hand_over(tmp_path, monkeypatch):
    """`bradley serve` hands the interpreter lock over every 0.5 ms, not every 5 ms (a /score
    request crosses three threads)."""
    import gc
    import sys
    from types import SimpleNamespace

    from service.api import app

    seen = {}

    def run(server):  # instead of serving: note the settings, stop what start-up started
        seen.update(interval=sys.getswitchinterval(), gen0=gc.get_threshold()[0])
        server.service.stop()

    monkeypatch.setattr(app.DrainingServer, "run", run)
    before, thresholds = sys.getswitchinterval(), gc.get_threshold()
    args = SimpleNamespace(db=str(tmp_path / "s.duckdb"), host=None, port=None, model=None,
                           read_only=False)
    try:
        assert app.serve_from_args(args) == 0
    finally:
        sys.setswitchinterval(before)
        gc.set_threshold(*thresholds)
        gc.unfreeze()
    assert seen == {"interval": 0.0005, "gen0": 10_000}
