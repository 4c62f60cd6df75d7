"""Routes that write to or read from the store: uploads, reports, the Label Studio webhook.
All of them need `Authorization: Bearer <key>`: each declares `caller: Keyed` (`service.api.deps`); the
webhook declares `caller: WebhookCaller` (Label Studio's shared secret, or a key)."""

from __future__ import annotations

import math

from fastapi import APIRouter, Request
from starlette.responses import HTMLResponse, JSONResponse

from service.api.deps import JsonBody, Keyed, Records, WebhookCaller
from service.api.payloads import PayloadError
from service.api.routes_store import store_call
from service.api.webhook import webhook_event

router = APIRouter()
REPORT_TYPES = {"": "json", ".json": "json", ".html": "html"}
ON_ERROR = ("abort", "skip")


def _on_error(request: Request) -> str:
    """`?on_error=abort` (default: one bad row writes nothing) or `?on_error=skip` (bad rows go to
    the rejects table, the rest is written)."""
    on_error = request.query_params.get("on_error", "abort")
    if on_error not in ON_ERROR:
        raise PayloadError("on_error", "must be abort (a bad row writes nothing) or skip (bad rows "
                           "go to rejects)")
    return on_error


async def _upload(request: Request, route: str, records: list[dict]) -> JSONResponse:
    svc = request.app.state.service
    result = await svc.ingest(route, records, _on_error(request))
    body = {k: getattr(result, k, None) for k in
            ("batch_id", "rows_in", "rows_ok", "rows_rejected", "duplicate")}
    if result.failed:
        errors = [str(e)[:500] for e in (result.errors or [])[:50]]
        first = errors[0] if errors else "the upload was refused"
        return JSONResponse({**body, "error": first, "field": None, "errors": errors}, 422)
    if result.errors:
        body["errors"] = [str(e)[:500] for e in result.errors[:50]]
    return JSONResponse(body, 200 if result.duplicate else 201)


@router.post("/judgments", status_code=201)
async def judgments(request: Request, caller: Keyed, records: Records) -> JSONResponse:
    return await _upload(request, "judgments", records)


@router.post("/pairs", status_code=201)
async def pairs(request: Request, caller: Keyed, records: Records) -> JSONResponse:
    return await _upload(request, "pairs", records)


@router.post("/feedback", status_code=201)
async def feedback(request: Request, caller: Keyed, records: Records) -> JSONResponse:
    return await _upload(request, "feedback", records)


@router.get("/reports/{name}")
async def report(name: str, request: Request, caller: Keyed):
    """`latest` (everything now) or a snapshot id, as `.json` (default) or `.html`;
    `?raters=human|ai|PREFIX` filters raters."""
    svc = request.app.state.service
    stem, dot, ext = name.rpartition(".") if "." in name else (name, "", "")
    kind = REPORT_TYPES.get(dot + ext)
    if kind is None:
        raise PayloadError("name", f"unknown report type {dot + ext!r}; use .json or .html", 404)
    from analysis.report import build_report, render_html

    snapshot = None if stem == "latest" else stem
    raters = request.query_params.get("raters")
    if snapshot is not None:
        await store_call(svc, svc.store.snapshot_filter, snapshot)  # 404 for an unknown id
    if kind == "html":  # plotting is slow and matplotlib is not thread-safe: the store thread
        def page():
            return render_html(build_report(svc.store, raters=raters, snapshot_id=snapshot))

        return HTMLResponse(await svc.in_store(page))
    data = await svc.in_store(build_report, svc.store, raters=raters, snapshot_id=snapshot)
    return JSONResponse(_plain(data))


def _plain(value):
    """JSON-safe copy: NaN/inf become null (JSON has no NaN), numpy scalars become numbers."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if hasattr(value, "item") and callable(value.item):  # numpy scalar
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return str(value)


@router.post("/webhooks/label-studio")
async def label_studio_webhook(request: Request, caller: WebhookCaller,
                               value: JsonBody) -> JSONResponse:
    """ANNOTATION_CREATED / ANNOTATION_UPDATED become judgments (an update replaces the verdict it
    edits), ANNOTATIONS_DELETED retracts them; other actions are acknowledged and ignored. Needs
    the X-Bradley-Webhook-Secret header (BRADLEY_LABEL_STUDIO_WEBHOOK_SECRET) or a bearer key.
    The body is never logged: it carries the project's access token."""
    svc = request.app.state.service
    event = webhook_event(value)
    if event is None:
        return JSONResponse({"ignored": value["action"]}, 202)
    body = await svc.label_studio_event(*event)
    return JSONResponse(body, 200 if body.get("duplicate") else 201)
