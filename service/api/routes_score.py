"""Routes for trainers and operators: /score, /get_reward (OpenRLHF), models, health, metrics.
Who may call each is declared in its signature (`service.api.deps`)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.responses import JSONResponse, Response

from service.api.deps import JsonBody, Keyed, MetricsViewer, Scorer, Viewer
from service.api.errors import FastJSON
from service.api.payloads import parse_get_reward, parse_score
from service.api.schemas import GetRewardBody, GetRewardReply, ScoreBody, ScoreReply, documented
from service.engine.ensemble import ScoreOptions, parse_aggregation
from service.engine.rewards import combine, group_fields, label_checks, parse_checks, parse_weights
from service.engine.watch import run_of

router = APIRouter()
PUBLIC_MODEL_FIELDS = ("id", "kind", "base_model", "created_at", "active")  # no paths, no configs


def _service(request: Request):
    return request.app.state.service


@router.post("/score", openapi_extra=documented(ScoreBody, ScoreReply))
async def score(request: Request, caller: Scorer, value: JsonBody) -> Response:
    """Rewards of (prompt, response) items: the reward model's scores, batched with other requests,
    and where items carry ground truth the verifiers' (worker processes), combined by weight;
    with `group_size`, GRPO's group fields. An ensemble answers its aggregate as `scores`, with
    `members` and `disagreement`; `run` (or X-Bradley-Run) names the trainer's run for the watch."""
    svc = _service(request)
    limits = svc.limits_for(caller)
    req = parse_score(value, limits)
    options = _options(svc, value, request)
    names = svc.verifiers.names()
    checks = parse_checks(value["items"], limits, names, svc.settings.default_verifier)
    weights = parse_weights(value.get("weights"), names)
    if any(checks) or weights is not None:
        combined = await combine(svc, req.prompts, req.responses, checks, weights, options)
        out, correct = combined.reply(), combined.correct
    else:  # the reward model alone, as before verifiers existed
        scored = await svc.score_detail(req.prompts, req.responses, options)
        out = {"scores": scored.scores, "model": scored.model, **scored.reply_fields()}
        correct = [None] * len(scored.scores)
    if req.group_size is not None:
        out.update(group_fields(svc, req, out["scores"], correct))
    return FastJSON(out)


@router.post("/get_reward", openapi_extra=documented(GetRewardBody, GetRewardReply))
async def get_reward(request: Request, caller: Scorer, value: JsonBody) -> JSONResponse:
    """OpenRLHF's remote reward model: `--remote_rm_url http://HOST:PORT/get_reward`. With `labels`
    (ground truth), `rewards` is the combined reward and `scores` the 0/1 correctness (OpenRLHF's
    dynamic filter keeps a prompt when 0 < mean(scores) < 1); items without a check score their
    reward. `extra_logs` holds numbers per item (see rewards.Combined.item_logs)."""
    svc = _service(request)
    limits = svc.limits_for(caller)
    req = parse_get_reward(value, limits)
    options = _options(svc, value, request)
    names = svc.verifiers.names()
    checks = label_checks(value, len(req.queries), limits, names, svc.settings.default_verifier)
    if any(checks):
        splits = await svc.split_queries(req)
        combined = await combine(svc, [s.prompt for s in splits], [s.response for s in splits],
                                 checks, None, options)
        model_id, rewards = combined.model, combined.rewards
        scores = [float(c) if c is not None else r for c, r in zip(combined.correct, rewards,
                                                                    strict=True)]
        check_logs = combined.item_logs()
    else:
        scored, splits = await svc.get_reward(req, options)
        model_id, rewards = scored.model, scored.scores
        scores, check_logs = rewards, _member_logs(scored)
    # extra_logs: numbers per item (OpenRLHF averages each key); unsplit 1.0 = scored without prompt
    logs = {"response_chars": [float(len(s.response)) for s in splits],
            "unsplit": [float(s.how == "unsplit") for s in splits], **check_logs}
    if req.single:
        rewards, scores, logs = rewards[0], scores[0], {k: v[0] for k, v in logs.items()}
    return FastJSON({"rewards": rewards, "scores": scores, "extra_logs": logs},
                        headers={"X-Bradley-Model": model_id or ""})


def _options(svc, value, request: Request) -> ScoreOptions:
    """The request's run (body `run` or X-Bradley-Run) and ensemble aggregation."""
    return ScoreOptions(run_of(value, request.headers), parse_aggregation(value, svc.aggregation))


def _member_logs(scored) -> dict[str, list[float]]:
    """An ensemble's /get_reward extra_logs: each member's standardised score and the disagreement."""
    if scored.disagreement is None:
        return {}
    return {**{f"member_{k}": v.tolist() for k, v in scored.z.items()},
            "disagreement": scored.disagreement}


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
