"""The HTTP app: `create_app(settings)` wires the routes to one `Service`, and `serve_from_args` is
`bradley serve` (uvicorn, one worker because the process owns the DuckDB writer).

Shutdown on SIGTERM/SIGINT: uvicorn stops accepting connections and waits (up to
BRADLEY_DRAIN_TIMEOUT_S) for requests in flight; those requests wait on the batcher, which keeps
scoring; then the lifespan hook drains what is left in the queue and closes the store.

This module imports no torch: the model (and torch with it) loads when the service starts.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import sys
import time
from contextlib import asynccontextmanager

import uvicorn
from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException

from service.api import errors as http
from service.api import routes_data, routes_score, routes_store, routes_watch
from service.api.deps import ClientSlots, release_held
from service.api.settings import Settings, load_settings
from service.engine.runtime import Service

log = logging.getLogger("bradley.service")
SWITCH_INTERVAL_S = 0.0005  # the interpreter lock's hand-over time while serving (tune_interpreter)


def create_app(settings: Settings, service: Service | None = None) -> FastAPI:
    """A new app and its own Service (store, model, batcher, metrics); nothing global."""
    service = service or Service(settings)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        service.start()
        yield
        await asyncio.get_running_loop().run_in_executor(None, service.stop)

    # the schema is served by routes_score.openapi, behind the key
    app = FastAPI(title="bradley", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.service = service
    app.state.anon_slots = ClientSlots(settings.anon_max_concurrent)
    for router in (routes_score.router, routes_data.router, routes_store.router,
                   routes_watch.router):
        # the routes themselves, not include_router: FastAPI 0.16x keeps an included router's
        # routes behind a wrapper, where app.routes (the route policy test, the docs) cannot see them
        app.router.routes.extend(router.routes)
    app.add_exception_handler(ValueError, http.handle_error)
    app.add_exception_handler(Exception, http.handle_error)
    app.add_exception_handler(HTTPException, http.handle_http_error)
    app.add_exception_handler(RequestValidationError, http.handle_validation_error)
    app.add_middleware(http.SafetyNet)  # inside RouteMetrics, which then counts its 500s
    app.add_middleware(RouteMetrics, service=service)
    return app


class RouteMetrics:
    """Pure ASGI middleware: latency and status per route template (not per raw path, which would
    let clients create unbounded label values). Outermost, so it also gives back what a request's
    dependencies held (`release_held`) however the request ended."""

    def __init__(self, app, service: Service):
        self.app, self.metrics = app, service.metrics
        self._children: dict[tuple, tuple] = {}  # labels() takes a lock and validates: once per key

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started, status = time.perf_counter(), [500]

        async def send_and_note(message):
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_and_note)
        finally:
            release_held(scope)  # the anonymous /score slot (service.api.deps.scoring_caller)
            key = (getattr(scope.get("route"), "path", "unmatched"), scope["method"], status[0])
            children = self._children.get(key)
            if children is None:  # route templates x methods x statuses: a bounded set
                children = self._children[key] = (
                    self.metrics.request_seconds.labels(key[0], key[1]),
                    self.metrics.responses.labels(key[0], str(key[2])))
            children[0].observe(time.perf_counter() - started)
            children[1].inc()


def serve_from_args(args) -> int:
    """`bradley serve`: settings from the environment, overridden by the command line."""
    models = args.model if isinstance(args.model, list) else [args.model] if args.model else []
    settings = load_settings(db=args.db, host=args.host, port=args.port,
                             model=",".join(models) or None, device=getattr(args, "device", None),
                             read_only=True if args.read_only else None,
                             ensemble_aggregate=getattr(args, "aggregate", None),
                             ensemble_uncertainty_weight=getattr(args, "uncertainty_weight", None))
    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(name)s %(message)s")
    if settings.host not in ("127.0.0.1", "localhost", "::1") and not settings.api_keys:
        log.warning("listening on %s without BRADLEY_API_KEYS: writes are disabled", settings.host)
    service = Service(settings)
    try:
        service.start()  # fail here, with a message, before binding the port
    except BaseException:
        service.stop()
        raise

    tune_interpreter()
    config = uvicorn.Config(create_app(settings, service), host=settings.host, port=settings.port,
                            workers=1, log_level=settings.log_level, access_log=False,
                            timeout_graceful_shutdown=int(settings.drain_timeout_s) or None)
    DrainingServer(config, service).run()
    return 0


def tune_interpreter() -> None:
    """Interpreter settings for a server under load, once start-up is done.

    What start-up built (torch, the model, the app) goes out of the collector's full passes, and a
    request's many short-lived objects no longer start a collection every 700 allocations.

    A /score request crosses threads three times (event loop, tokenizer thread, batcher worker,
    event loop), and a thread woken while another runs Python waits for the interpreter lock until
    the switch interval ends: 5 ms by default, longer than a cheap model's forward.
    """
    gc.freeze()
    gc.set_threshold(10_000)
    sys.setswitchinterval(SWITCH_INTERVAL_S)


class DrainingServer(uvicorn.Server):
    """On SIGTERM/SIGINT, also tell the batcher to stop waiting for fuller batches, so the requests
    uvicorn now waits for finish at once."""

    def __init__(self, config: uvicorn.Config, service: Service):
        super().__init__(config)
        self.service = service
        self.loop: asyncio.AbstractEventLoop | None = None

    def handle_exit(self, sig, frame) -> None:
        if self.loop is not None:  # a signal handler must not take locks: hand over to the loop
            self.loop.call_soon_threadsafe(self.service.batcher.hurry)
        super().handle_exit(sig, frame)

    async def serve(self, sockets=None) -> None:
        self.loop = asyncio.get_running_loop()
        await super().serve(sockets)
