"""Every route of `create_app` states who may call it in its signature, and
what a caller without a key may see. The route list comes from the app itself, so a route added
later without `caller: Keyed` fails here instead of shipping open."""

from __future__ import annotations

import httpx
import pytest
from fastapi.routing import APIRoute
from fastapi.testclient import TestClient

from service.api import deps
from service.api.app import create_app
from service.api.settings import load_settings
from tests.service.conftest import API_KEY, make_db

# (method, path) -> why it is open. Everything else must refuse a request without a key.
OPEN = {
    ("GET", "/healthz"): "liveness probe",
    ("GET", "/readyz"): "readiness probe (names the served model, as every /score answer does)",
    ("POST", "/score"): "scoring, open unless BRADLEY_SCORE_REQUIRES_KEY (budgeted without a key)",
    ("POST", "/get_reward"): "scoring, as /score",
    ("GET", "/models"): "model ids only without a key",
    ("GET", "/metrics"): "Prometheus scrapes, unless BRADLEY_METRICS_REQUIRE_KEY",
    ("GET", "/watch"): "the watch's numbers per model and run, readable as /metrics is",
    ("GET", "/limits"): "what a request may hold, so clients split their work to fit",
}
SCORING = {("POST", "/score"), ("POST", "/get_reward")}
# Dependencies that refuse a caller without a key: Keyed, and the Label Studio webhook's, which also
# takes its shared secret header instead (tests/service/api/test_webhook_label_studio.py)
KEYED = (deps.require_key, deps.webhook_caller)
KEY = {"Authorization": f"Bearer {API_KEY}"}


def flat(routes):
    """APIRoutes, looking into included routers (FastAPI >= 0.16x wraps each include_router in an
    `_IncludedRouter` whose `effective_route_contexts()` yields the routes it holds)."""
    for route in routes:
        if isinstance(route, APIRoute):
            yield route
        elif hasattr(route, "effective_route_contexts"):
            yield from flat(ctx.original_route for ctx in route.effective_route_contexts())


def routes(app) -> list[tuple[str, str, APIRoute]]:
    return [(method, route.path, route) for route in flat(app.routes)
            for method in sorted(route.methods)]


def concrete(path: str) -> str:
    return path.replace("{model_id}", "rm-tiny-b").replace("{name}", "latest.json")


def depends_on(dependant, call) -> bool:
    return any(d.call is call or depends_on(d, call) for d in dependant.dependencies)


@pytest.fixture
def app(tmp_path, tiny_models):
    settings = load_settings(db=make_db(tmp_path / "policy.duckdb", tiny_models), api_keys=API_KEY,
                             model="rm-tiny-a", device="cpu")
    return create_app(settings)


def test_every_route_outside_the_open_list_refuses_a_request_without_a_key(app):
    found = routes(app)
    assert len(found) >= 13 and set(OPEN) <= {(m, p) for m, p, _ in found}
    oversized = b"x" * (16 * 1024 * 1024)  # auth is checked before the body is read
    with TestClient(app, raise_server_exceptions=False) as c:
        for method, path, route in found:
            if (method, path) in OPEN:
                continue
            assert any(depends_on(route.dependant, keyed) for keyed in KEYED), f"{method} {path}: no Keyed"
            r = c.request(method, concrete(path), content=oversized if method == "POST" else None)
            assert (r.status_code, r.json()["field"]) == (401, "Authorization"), (method, path)
            wrong = c.request(method, concrete(path), headers={"Authorization": "Bearer nope-nope-1"})
            assert wrong.status_code == 403, (method, path)


def test_open_routes_answer_without_a_key_and_scoring_can_require_one(tmp_path, tiny_models):
    db = make_db(tmp_path / "open.duckdb", tiny_models)
    body = {"/score": {"items": [{"prompt": "p", "response": "r"}]}, "/get_reward": {"query": ["x"]}}
    for requires in (False, True):
        settings = load_settings(db=db, api_keys=API_KEY, model="rm-tiny-a", device="cpu",
                                 score_requires_key=requires, metrics_require_key=requires)
        with TestClient(create_app(settings)) as c:
            for method, path in OPEN:
                r = c.request(method, path, json=body.get(path))
                closed = requires and ((method, path) in SCORING or path in ("/metrics", "/watch"))
                assert r.status_code == (401 if closed else 200), (requires, path, r.text)


def test_a_wrong_key_is_refused_even_where_none_is_needed(app):
    with TestClient(app) as c:
        r = c.post("/score", json={"items": [{"prompt": "p", "response": "r"}]},
                   headers={"Authorization": "Bearer not-a-key-1"})
        assert r.status_code == 403 and r.json()["field"] == "Authorization"


def test_what_a_caller_without_a_key_may_see(app, tiny_models):
    """Item 9: no filesystem paths or training configs without a key; the schema needs the key."""
    with TestClient(app) as c:
        anonymous = c.get("/models").json()["models"]
        assert {m["id"] for m in anonymous} == {"rm-tiny-a", "rm-tiny-b"}
        assert all(set(m) <= {"id", "kind", "base_model", "created_at", "active"} for m in anonymous)
        keyed = {m["id"]: m for m in c.get("/models", headers=KEY).json()["models"]}
        assert keyed["rm-tiny-a"]["path"] == tiny_models["rm-tiny-a"]
        text = c.get("/metrics").text
        assert 'bradley_model_info{model_id="rm-tiny-a"} 1.0' in text
        for folder in tiny_models.values():
            assert folder not in text and folder not in c.get("/readyz").text
        assert c.get("/openapi.json").status_code == 401
        schema = c.get("/openapi.json", headers=KEY).json()
        assert "/score" in schema["paths"] and "/openapi.json" not in schema["paths"]
        assert c.get("/docs").status_code == 404


def test_keyed_routes_declare_the_key_before_the_body(app):
    """FastAPI solves a route's parameters in order: the key must come first."""
    for method, path, route in routes(app):
        calls = [d.call for d in route.dependant.dependencies]
        body = [i for i, call in enumerate(calls) if call in (deps.json_body, deps.upload_records)]
        who = [i for i, call in enumerate(calls)
               if call in (deps.require_key, deps.scoring_caller, deps.webhook_caller)]
        if body:
            assert who and who[0] < body[0], (method, path)


def test_live_server_refuses_anonymous_writes(live):
    """The same check through real HTTP, on the shared live server."""
    for method, path, _ in routes(live.app):
        if (method, path) not in OPEN:
            r = httpx.request(method, live.url + concrete(path), timeout=30)
            assert r.status_code == 401, (method, path)
