"""GET /watch: the reward-hacking watch's current windows and their history (service/engine/watch.py).
Readable by whoever may read /metrics: it names models and runs, and holds numbers, no text."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Request
from starlette.responses import JSONResponse

from service.api.deps import MetricsViewer

router = APIRouter()


@router.get("/watch")
async def watch(request: Request, caller: MetricsViewer, history: bool = True) -> JSONResponse:
    """Per served model its reference statistics and per run the signals over the last N scored
    items (`current`) and, unless `?history=false`, one summary per history interval (`history`,
    oldest first). `watching` is false, with the `reason`, for a model without reference
    statistics or with BRADLEY_WATCH=off."""
    svc = request.app.state.service
    if svc.watch is None:
        return JSONResponse({"watching": False, "reason": "BRADLEY_WATCH=off", "models": {}})

    def current() -> dict:  # folding and summarising stay off the event loop
        svc.watch.refresh()
        return svc.watch.snapshot(history)

    return JSONResponse(await asyncio.get_running_loop().run_in_executor(None, current))
