"""HTTP plumbing shared by the routes: bounded body reading, bearer-key checks (routes reach both
through `service.api.deps`), and the one place where library errors become `{"error": ..., "field": ...}`
responses (never a traceback): the exception handlers for known errors, and `SafetyNet` for the rest,
so that every request ends in a complete response on a connection the client can go on using.

A client that hangs up before its body has arrived is no server error: it is answered (to nobody)
and counted as 499, nginx's "client closed request", with one log line and no traceback, so the 5xx
alert (deploy/prometheus/rules.yml) never sees it.
"""

from __future__ import annotations

import asyncio
import hmac
import logging

import orjson
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse

from service.api import payloads
from service.engine import batcher, runtime

log = logging.getLogger("bradley.service")


class Unauthorized(ValueError):
    """No usable `Authorization: Bearer <key>` header (401)."""

    field = "Authorization"


class WrongKey(runtime.Forbidden):
    """A bearer key that is not one of the server's keys (403)."""

    field = "Authorization"


CLIENT_CLOSED = 499  # nginx's status for a request whose client went away before the answer

# Most specific first: the first matching class decides the status.
ERROR_STATUS: list[tuple[type[BaseException], int]] = [
    (ClientDisconnect, CLIENT_CLOSED),
    (Unauthorized, 401),
    (runtime.Forbidden, 403),
    (runtime.NotFound, 404),
    (runtime.NotReady, 503),
    (batcher.BatcherError, 503),
    (ValueError, 422),
]


async def read_body(request: Request, limit: int, timeout_s: float | None = None) -> bytes:
    """The whole body, refusing (413) as soon as it is known to exceed `limit` bytes, and (408)
    when it has not all arrived `timeout_s` seconds after the read began: a sender that stalls
    would otherwise hold what its request holds (an anonymous /score slot) for as long as it likes."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise BodyTooLarge("body", f"{declared} bytes, limit {limit}; split the upload", 413)
    chunks, size = [], 0
    try:
        async with asyncio.timeout(timeout_s):
            async for chunk in request.stream():
                size += len(chunk)
                if size > limit:
                    raise BodyTooLarge("body", f"over {limit} bytes; split the upload", 413)
                chunks.append(chunk)
    except TimeoutError:
        raise BodyTooSlow("body", f"{size} bytes arrived in {timeout_s:g} s and then no more "
                          "(BRADLEY_BODY_READ_TIMEOUT_S); send the whole body at once", 408) from None
    return b"".join(chunks)


class UnreadBody(payloads.PayloadError):
    """Refused before the whole body was read: the answer closes the connection, since the unread
    rest would otherwise be taken for the client's next request."""

    close = True


class BodyTooLarge(UnreadBody):
    """Over BRADLEY_MAX_BODY_BYTES (413)."""


class BodyTooSlow(UnreadBody):
    """Not all there within BRADLEY_BODY_READ_TIMEOUT_S (408)."""


def check_key(request: Request, keys: tuple[str, ...]) -> None:
    """401 without a bearer key, 403 with a wrong one, 403 when the server has no keys at all."""
    header = request.headers.get("authorization", "")
    scheme, _, given = header.partition(" ")
    if scheme.lower() != "bearer" or not given.strip():
        raise Unauthorized("send `Authorization: Bearer <key>` (keys are set with BRADLEY_API_KEYS)")
    if not keys:
        raise runtime.Forbidden("this server has no API keys configured (BRADLEY_API_KEYS), so "
                                "writes and admin routes are disabled")
    given_bytes = given.strip().encode()
    # compare against every key so timing does not reveal which prefix matched
    matches = [hmac.compare_digest(given_bytes, key.encode()) for key in keys]
    if not any(matches):
        raise WrongKey("invalid API key; use one of the keys in the server's BRADLEY_API_KEYS")


WEBHOOK_SECRET_HEADER = "x-bradley-webhook-secret"


def check_webhook_secret(request: Request, secret: str | None, keys: tuple[str, ...]) -> None:
    """Label Studio's webhook: the shared secret in X-Bradley-Webhook-Secret (403 when wrong, or
    when the server has none), else a bearer key as for any write."""
    given = request.headers.get(WEBHOOK_SECRET_HEADER)
    if given is None:
        check_key(request, keys)
        return
    if not secret:
        raise runtime.Forbidden("this server has no BRADLEY_LABEL_STUDIO_WEBHOOK_SECRET; set it to "
                                "the secret Label Studio's webhook sends, or use a bearer key")
    if not hmac.compare_digest(given.encode(), secret.encode()):
        raise WrongKey("wrong X-Bradley-Webhook-Secret; it must equal the server's "
                       "BRADLEY_LABEL_STUDIO_WEBHOOK_SECRET")


# Headers a status needs so the client knows what to do next.
STATUS_HEADERS = {401: {"WWW-Authenticate": "Bearer"}, 429: {"Retry-After": "1"},
                  503: {"Retry-After": "1"}}


class FastJSON(JSONResponse):
    """A JSON response rendered by orjson: the score routes' replies are lists of floats, which the
    standard library's encoder walks in Python. (A NaN becomes null, valid JSON, where the standard
    encoder would fail the request.)"""

    def render(self, content) -> bytes:
        return orjson.dumps(content)


def error_response(exc: BaseException) -> JSONResponse:
    """`{"error", "field"}` with the status the exception's class (or its own `status`) names; an
    unexpected exception is a 500 whose details go to the log only."""
    status = getattr(exc, "status", None) if isinstance(exc, ValueError) else None
    status = status or next((code for cls, code in ERROR_STATUS if isinstance(exc, cls)), 500)
    if status == CLIENT_CLOSED:  # nobody reads the answer; the metrics and one log line do
        log.info("client closed the connection before its request was read")
        return JSONResponse({"error": "client closed the request", "field": None}, status)
    if status == 500:
        log.error("internal error: %s: %s", type(exc).__name__, exc, exc_info=exc)
        return JSONResponse({"error": "internal error; see the server log", "field": None}, 500)
    body = {"error": str(exc), "field": getattr(exc, "field", None)}
    errors = getattr(exc, "errors", None)
    if isinstance(errors, list) and errors:
        body["errors"] = [str(e)[:500] for e in errors[:50]]
    headers = dict(STATUS_HEADERS.get(status, {}))
    if getattr(exc, "close", False):  # the client still has body bytes on the way: say so
        headers["Connection"] = "close"
    return JSONResponse(body, status, headers=headers or None)


async def handle_error(request: Request, exc: Exception) -> JSONResponse:
    return error_response(exc)


async def handle_http_error(request: Request, exc: HTTPException) -> JSONResponse:
    return JSONResponse({"error": str(exc.detail), "field": None}, exc.status_code,
                        headers=getattr(exc, "headers", None))


async def handle_validation_error(request: Request, exc) -> JSONResponse:
    first = (exc.errors() or [{}])[0]
    field = ".".join(str(p) for p in first.get("loc", ())[1:]) or None
    return JSONResponse({"error": first.get("msg", "invalid request"), "field": field}, 422)


class SafetyNet:
    """Pure ASGI middleware: an exception no handler took becomes a complete 500 JSON response.

    Starlette hands `Exception` to its outermost ServerErrorMiddleware, which sends the handler's
    response and then re-raises; uvicorn, seeing an exception after the response started, closes
    the connection without `Connection: close`, so a keep-alive client's next request fails with
    "connection reset". Here the exception ends with the response, the connection stays
    usable, and the traceback goes to the log only. After the response has started nothing can be
    repaired, so the exception goes on (and uvicorn closes the connection, the only honest option).
    """

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started = False

        async def note_start(message):
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, note_start)
        except Exception as exc:  # noqa: BLE001 - the edge where anything becomes a response
            if started:
                raise
            await error_response(exc)(scope, receive, send)
