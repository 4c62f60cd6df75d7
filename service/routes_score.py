"""Routes for trainers and operators: /score, /get_reward (OpenRLHF), models, health, metrics."""

from __future__ import annotations

from fastapi import APIRouter, Request
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.responses import JSONResponse, Response

from service.advantages import group_advantages
from service.http import check_key, read_body
from service.payloads import decode_json, parse_get_reward, parse_score

router = APIRouter()


def _service(request: Request):
    return request.app.state.service


async def _scoring_body(request: Request):
    svc = _service(request)
    if svc.settings.score_requires_key:
        check_key(request, svc.settings.api_keys)
    return svc, decode_json(await read_body(request, svc.settings.max_body_bytes))


@router.post("/score")
async def score(request: Request) -> JSONResponse:
    svc, value = await _scoring_body(request)
    req = parse_score(value, svc.limits)
    model_id, scores = await svc.score(req.prompts, req.responses)
    out: dict = {"scores": scores, "model": model_id}
    if req.group_size is not None:
        out["advantages"], out["degenerate_groups"] = group_advantages(scores, req.group_size,
                                                                       req.advantage)
    return JSONResponse(out)


@router.post("/get_reward")
async def get_reward(request: Request) -> JSONResponse:
    """OpenRLHF's remote reward model: `--remote_rm_url http://HOST:PORT/get_reward`."""
    svc, value = await _scoring_body(request)
    req = parse_get_reward(value, svc.limits)
    model_id, scores, splits = await svc.get_reward(req)
    # extra_logs: numbers per item (OpenRLHF averages each key); unsplit 1.0 = scored without prompt
    logs = {"response_chars": [float(len(s.response)) for s in splits],
            "unsplit": [float(s.how == "unsplit") for s in splits]}
    if req.single:
        scores, logs = scores[0], {k: v[0] for k, v in logs.items()}
    return JSONResponse({"rewards": scores, "scores": scores, "extra_logs": logs},
                        headers={"X-Bradley-Model": model_id})


@router.get("/models")
async def list_models(request: Request) -> JSONResponse:
    return JSONResponse({"models": await _service(request).models()})


@router.post("/models/{model_id}/load")
async def load_model(model_id: str, request: Request) -> JSONResponse:
    svc = _service(request)
    check_key(request, svc.settings.api_keys)
    loaded = await svc.load_model(model_id)
    return JSONResponse({"model": loaded.id, "path": loaded.path, "active": True})


@router.get("/healthz")
async def healthz(request: Request) -> JSONResponse:
    return JSONResponse({"status": "ok"})


@router.get("/readyz")
async def readyz(request: Request) -> JSONResponse:
    current = _service(request).current
    if current is None:
        return JSONResponse({"status": "not ready", "error": "no model is loaded", "field": None},
                            503)
    return JSONResponse({"status": "ready", "model": current.id})


@router.get("/metrics")
async def metrics(request: Request) -> Response:
    return Response(_service(request).metrics.render(), media_type=CONTENT_TYPE_LATEST)
