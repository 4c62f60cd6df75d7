"""Routes for trainers and operators: /score, /get_reward (OpenRLHF), models, health, metrics.
Who may call each is declared in its signature (`service.api.deps`)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.responses import JSONResponse, Response

from service.api.deps import (
    Body,
    JsonBody,
    Keyed,
    MetricsViewer,
    Scorer,
    Viewer,
    bounded_body,
    json_body,
    scoring_caller,
)
from service.api.errors import FastJSON, error_response
from service.api.payloads import parse_get_reward, parse_score
from service.engine.rewards import combine, group_fields, label_checks, parse_checks, parse_weights
from service.engine.verify_whole import GROUND_TRUTH, score_whole

router = APIRouter()
PUBLIC_MODEL_FIELDS = ("id", "kind", "base_model", "created_at", "active")  # no paths, no configs


def _service(request: Request):
    return request.app.state.service


@router.post("/score")
async def score(request: Request, caller: Scorer, body: Body) -> Response:
    svc = _service(request)
    limits = svc.limits_for(caller)
    if GROUND_TRUTH not in body:
        return await _score(svc, body, limits, None)
    with svc.verifiers.announce():  # other requests see this one while it is decoded
        known = None
        if svc.verifiers.wants_whole():  # decoded and checked in a worker
            answered, known = await score_whole(svc, body, limits)
            if answered is not None:
                return answered
        return await _score(svc, body, limits, known)


class ScoreLane:
    """`POST /score`'s own way in, a plain ASGI app that `service.api.app.App` hands the request to before
    Starlette's middleware stack: past FastAPI's router, dependency solver and response plumbing,
    and the framework's error, telemetry and body-limit middleware, which together were more than
    half of this route's Python per request in issue 20's profiles (1-token items). It calls the
    route's own dependencies in the order FastAPI solves them (the caller, then the body) and ends
    errors with `error_response`, as the app's handlers do. The route stays declared, so the schema
    and the policy tests see it as before."""

    def __init__(self, routes):
        self.route = next(r for r in routes if getattr(r, "path", None) == "/score")

    @staticmethod
    def takes(scope) -> bool:
        return scope["type"] == "http" and scope["path"] == "/score" and scope["method"] == "POST"

    async def __call__(self, scope, receive, send):
        scope["route"] = self.route  # RouteMetrics labels the request with it
        request = Request(scope, receive)
        try:
            response = await score(request, await scoring_caller(request), await bounded_body(request))
        except Exception as exc:  # noqa: BLE001 - the app's handlers do the same: a complete answer
            response = error_response(exc)
        await response(scope, receive, send)


async def _score(svc, body: bytes, limits, known: dict | None) -> Response:
    """The main path: decoded here, calls spread over the verifier workers, the RM batched.
    `known`: verdicts a whole request's worker gave before it was killed."""
    value = await json_body(body)
    req = parse_score(value, limits)
    names = svc.verifiers.names()
    checks = parse_checks(value["items"], limits, names, svc.settings.default_verifier)
    weights = parse_weights(value.get("weights"), names)
    if any(checks) or weights is not None:
        known = {i: v for i, v in (known or {}).items() if i < len(checks) and checks[i]}
        combined = await combine(svc, req.prompts, req.responses, checks, weights, known)
        out, correct = combined.reply(), combined.correct
    else:  # the reward model alone, as before verifiers existed
        model_id, scores = await svc.score(req.prompts, req.responses)
        out, correct = {"scores": scores, "model": model_id}, [None] * len(scores)
    if req.group_size is not None:
        out.update(group_fields(svc, req, out["scores"], correct))
    return FastJSON(out)


@router.post("/get_reward")
async def get_reward(request: Request, caller: Scorer, value: JsonBody) -> JSONResponse:
    """OpenRLHF's remote reward model: `--remote_rm_url http://HOST:PORT/get_reward`. With `labels`
    (ground truth), `rewards` is the combined reward and `scores` the 0/1 correctness (OpenRLHF's
    dynamic filter keeps a prompt when 0 < mean(scores) < 1); items without a verdict score their
    reward. `extra_logs` holds numbers per item (see rewards.Combined.item_logs)."""
    svc = _service(request)
    limits = svc.limits_for(caller)
    req = parse_get_reward(value, limits)
    names = svc.verifiers.names()
    checks = label_checks(value, len(req.queries), limits, names, svc.settings.default_verifier)
    if any(checks):
        splits = await svc.split_queries(req)
        combined = await combine(svc, [s.prompt for s in splits], [s.response for s in splits],
                                 checks, None)
        model_id, rewards = combined.model, combined.rewards
        scores = [float(c) if c is not None else r for c, r in zip(combined.correct, rewards,
                                                                    strict=True)]
        verdict_logs = combined.item_logs()
    else:
        model_id, rewards, splits = await svc.get_reward(req)
        scores, verdict_logs = rewards, {}
    # extra_logs: numbers per item (OpenRLHF averages each key); unsplit 1.0 = scored without prompt
    logs = {"response_chars": [float(len(s.response)) for s in splits],
            "unsplit": [float(s.how == "unsplit") for s in splits], **verdict_logs}
    if req.single:
        rewards, scores, logs = rewards[0], scores[0], {k: v[0] for k, v in logs.items()}
    return FastJSON({"rewards": rewards, "scores": scores, "extra_logs": logs},
                        headers={"X-Bradley-Model": model_id or ""})


@router.get("/models")
async def list_models(request: Request, caller: Viewer) -> JSONResponse:
    """Every registered model; without a key only ids, kinds and which one is active (paths and
    training configs describe the operator's machine and data)."""
    models = await _service(request).models()
    if not caller.keyed:
        models = [{k: m[k] for k in PUBLIC_MODEL_FIELDS if k in m} for m in models]
    return JSONResponse({"models": models})


@router.post("/models/{model_id}/load")
async def load_model(model_id: str, request: Request, caller: Keyed) -> JSONResponse:
    loaded = await _service(request).load_model(model_id)
    return JSONResponse({"model": loaded.id, "path": loaded.path, "active": True})


@router.get("/healthz")
async def healthz() -> JSONResponse:
    return JSONResponse({"status": "ok"})


@router.get("/readyz")
async def readyz(request: Request) -> JSONResponse:
    current = _service(request).current
    if current is None:
        return JSONResponse({"status": "not ready", "error": "no model is loaded", "field": None},
                            503)
    return JSONResponse({"status": "ready", "model": current.id})


@router.get("/metrics")
async def metrics(request: Request, caller: MetricsViewer) -> Response:
    return Response(_service(request).metrics.render(), media_type=CONTENT_TYPE_LATEST)


@router.get("/openapi.json", include_in_schema=False)
async def openapi(request: Request, caller: Keyed) -> JSONResponse:
    """The API schema lists every route and field: for operators, so behind the key."""
    return JSONResponse(request.app.openapi())
