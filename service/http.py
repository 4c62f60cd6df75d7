"""HTTP plumbing shared by the routes: bounded body reading, bearer-key checks, and the one place
where library errors become `{"error": ..., "field": ...}` responses (never a traceback).
"""

from __future__ import annotations

import hmac
import logging

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse

from service import batcher, payloads, runtime

log = logging.getLogger("bradley.service")


class Unauthorized(ValueError):
    """No usable `Authorization: Bearer <key>` header (401)."""

    field = "Authorization"


class WrongKey(runtime.Forbidden):
    """A bearer key that is not one of the server's keys (403)."""

    field = "Authorization"


# Most specific first: the first matching class decides the status.
ERROR_STATUS: list[tuple[type[BaseException], int]] = [
    (Unauthorized, 401),
    (runtime.Forbidden, 403),
    (runtime.NotFound, 404),
    (runtime.Unavailable, 501),
    (runtime.NotReady, 503),
    (batcher.BatcherError, 503),
    (ValueError, 422),
]


async def read_body(request: Request, limit: int) -> bytes:
    """The whole body, refusing (413) as soon as it is known to exceed `limit` bytes."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise payloads.PayloadError("body", f"{declared} bytes, limit {limit}; split the upload", 413)
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise payloads.PayloadError("body", f"over {limit} bytes; split the upload", 413)
        chunks.append(chunk)
    return b"".join(chunks)


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


def error_response(exc: BaseException) -> JSONResponse:
    status = next((code for cls, code in ERROR_STATUS if isinstance(exc, cls)), 500)
    if isinstance(exc, payloads.PayloadError):
        status = exc.status
    if status == 500:
        log.error("internal error: %s: %s", type(exc).__name__, exc)
        return JSONResponse({"error": "internal error; see the server log", "field": None}, 500)
    body = {"error": str(exc), "field": getattr(exc, "field", None)}
    errors = getattr(exc, "errors", None)
    if isinstance(errors, list) and errors:
        body["errors"] = [str(e)[:500] for e in errors[:50]]
    headers = {"Retry-After": "1"} if status == 503 else None
    if status == 401:
        headers = {"WWW-Authenticate": "Bearer"}
    return JSONResponse(body, status, headers=headers)


async def handle_error(request: Request, exc: Exception) -> JSONResponse:
    return error_response(exc)


async def handle_http_error(request: Request, exc: HTTPException) -> JSONResponse:
    return JSONResponse({"error": str(exc.detail), "field": None}, exc.status_code,
                        headers=getattr(exc, "headers", None))


async def handle_validation_error(request: Request, exc) -> JSONResponse:
    first = (exc.errors() or [{}])[0]
    field = ".".join(str(p) for p in first.get("loc", ())[1:]) or None
    return JSONResponse({"error": first.get("msg", "invalid request"), "field": field}, 422)
