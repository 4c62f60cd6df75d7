"""Routes for trainers and operators: /score, /get_reward (OpenRLHF), models, health, metrics.
Who may call each is declared in its signature (`service.deps`)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.responses import JSONResponse, Response

from service.advantages import group_advantages
from service.deps import JsonBody, Keyed, MetricsViewer, Scorer, Viewer
from service.payloads import parse_get_reward, parse_score

router = APIRouter()
PUBLIC_MODEL_FIELDS = ("id", "kind", "base_model", "created_at", "active")  # no paths, no configs


def _service(request: Request):
    return request.app.state.service


@router.post("/score")
async def score(request: Request, caller: Scorer, value: JsonBody) -> JSONResponse:
    svc = _service(request)
    req = parse_score(value, svc.limits_for(caller))
    model_id, scores = await svc.score(req.prompts, req.responses)
    out: dict = {"scores": scores, "model": model_id}
    if req.group_size is not None:
        out["advantages"], out["degenerate_groups"] = group_advantages(scores, req.group_size,
                                                                       req.advantage)
    return JSONResponse(out)


@router.post("/get_reward")
async def get_reward(request: Request, caller: Scorer, value: JsonBody) -> JSONResponse:
    """OpenRLHF's remote reward model: `--remote_rm_url http://HOST:PORT/get_reward`."""
    svc = _service(request)
    req = parse_get_reward(value, svc.limits_for(caller))
    model_id, scores, splits = await svc.get_reward(req)
    # extra_logs: numbers per item (OpenRLHF averages each key); unsplit 1.0 = scored without prompt
    logs = {"response_chars": [float(len(s.response)) for s in splits],
            "unsplit": [float(s.how == "unsplit") for s in splits]}
    if req.single:
        scores, logs = scores[0], {k: v[0] for k, v in logs.items()}
    return JSONResponse({"rewards": scores, "scores": scores, "extra_logs": logs},
                        headers={"X-Bradley-Model": model_id})


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
