"""FastAPI dependencies that each route declares in its signature: who is calling (and whether that
caller may use the route), and the request body, read within its bound and decoded off the event loop.
Each is a coroutine: FastAPI runs a plain `def` dependency in a worker thread, a hop per request
for a few dictionary look-ups.

Declaring them as parameters (`caller: Keyed, value: JsonBody`) keeps policy out of the handlers: a
handler cannot forget a check it never calls, and FastAPI solves the parameters in order, so the
key is checked before a byte of the body is read. `tests/service/api/test_routes_policy.py` enumerates
every route of `create_app` and fails on any write or admin route that answers without a key.

Who may do what (README "Who may see what"):

- `Keyed`: a valid `Authorization: Bearer <key>` (401 without one, 403 with a wrong one, 403 when
  the server has no keys): uploads, reports, model loads, /openapi.json.
- `WebhookCaller`: the Label Studio webhook: the X-Bradley-Webhook-Secret header equal to
  BRADLEY_LABEL_STUDIO_WEBHOOK_SECRET (403 when wrong), or else a key as for `Keyed`.
- `Scorer`: /score and /get_reward. A key when BRADLEY_SCORE_REQUIRES_KEY is set; otherwise
  anyone, but a caller without a key holds one of BRADLEY_ANON_MAX_CONCURRENT slots of its client
  address while its request runs (429 beyond) and gets `Limits` with BRADLEY_ANON_MAX_REQUEST_CHARS.
- `Viewer`: /models (ids only without a key) and /metrics (key with BRADLEY_METRICS_REQUIRE_KEY).

    >>> slots = ClientSlots(limit=1)
    >>> release = slots.acquire("10.0.0.7")
    >>> slots.acquire("10.0.0.7")
    Traceback (most recent call last):
    ...
    service.api.deps.TooManyRequests: 1 requests without a key are already running from 10.0.0.7 (limit 1, BRADLEY_ANON_MAX_CONCURRENT); wait for one to finish, or send a key
    >>> release()
    >>> slots.in_flight
    {}
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request

from service.api.errors import check_key, check_webhook_secret, read_body
from service.api.payloads import decode_json, parse_records

INLINE_DECODE_BYTES = 64 * 1024  # smaller bodies decode in microseconds: not worth a thread hop
HELD = "bradley.held"  # scope key: releases owed when the request ends


class TooManyRequests(ValueError):
    """A client already has its share of requests running (429, Retry-After)."""

    field, status = "client", 429


@dataclass(frozen=True)
class Caller:
    keyed: bool
    client: str  # the peer address (X-Forwarded-For is not trusted: anyone can set it)


class ClientSlots:
    """Requests in flight per client address, at most `limit` each. Only the event loop touches it,
    so a plain dict needs no lock."""

    def __init__(self, limit: int):
        self.limit = limit
        self.in_flight: dict[str, int] = {}

    def acquire(self, client: str) -> Callable[[], None]:
        """Take a slot (TooManyRequests beyond the limit); returns the call that gives it back."""
        running = self.in_flight.get(client, 0)
        if running >= self.limit:
            raise TooManyRequests(f"{running} requests without a key are already running from "
                                  f"{client} (limit {self.limit}, BRADLEY_ANON_MAX_CONCURRENT); "
                                  "wait for one to finish, or send a key")
        self.in_flight[client] = running + 1

        def release() -> None:
            left = self.in_flight.pop(client) - 1
            if left:
                self.in_flight[client] = left

        return release


def _settings(request: Request):
    return request.app.state.service.settings


def _client(request: Request) -> str:
    return request.client.host if request.client else "unknown"


async def require_key(request: Request) -> Caller:
    check_key(request, _settings(request).api_keys)
    return Caller(True, _client(request))


async def webhook_caller(request: Request) -> Caller:
    """Label Studio's webhook: its shared secret (X-Bradley-Webhook-Secret) or a bearer key."""
    settings = _settings(request)
    check_webhook_secret(request, settings.label_studio_webhook_secret, settings.api_keys)
    return Caller(True, _client(request))


async def optional_key(request: Request) -> Caller:
    """Keyed when an Authorization header is sent (a wrong key is refused, not ignored)."""
    if "authorization" in request.headers:
        return await require_key(request)
    return Caller(False, _client(request))


async def scoring_caller(request: Request) -> Caller:
    """A plain coroutine, neither a generator (FastAPI wraps those in an exit stack and a cancel
    scope per request, a large part of the hot routes' framework cost) nor a
    `def` (run in a worker thread, and the slots are the event loop's alone). The anonymous slot is
    given back by `release_held` when the response has gone."""
    needs_key = _settings(request).score_requires_key
    caller = await (require_key(request) if needs_key else optional_key(request))
    if not caller.keyed:
        release = request.app.state.anon_slots.acquire(caller.client)
        request.scope.setdefault(HELD, []).append(release)
    return caller


def release_held(scope) -> None:
    """Give back what a request's dependencies held (RouteMetrics calls it as the request ends)."""
    for release in scope.pop(HELD, ()):
        release()


async def metrics_caller(request: Request) -> Caller:
    needs_key = _settings(request).metrics_require_key
    return await (require_key(request) if needs_key else optional_key(request))


async def bounded_body(request: Request) -> bytes:
    settings = _settings(request)
    return await read_body(request, settings.max_body_bytes, settings.body_read_timeout_s)


async def _off_loop_if_large(parse, body: bytes):
    """Small bodies parse in place; large ones in a worker thread so the event loop keeps serving."""
    if len(body) <= INLINE_DECODE_BYTES:
        return parse(body)
    return await asyncio.to_thread(parse, body)


async def json_body(body: Annotated[bytes, Depends(bounded_body)]):
    return await _off_loop_if_large(decode_json, body)


async def upload_records(body: Annotated[bytes, Depends(bounded_body)]) -> list[dict]:
    """An upload's records: a JSON object, a JSON list of objects, or JSONL."""
    return await _off_loop_if_large(parse_records, body)


Keyed = Annotated[Caller, Depends(require_key)]
WebhookCaller = Annotated[Caller, Depends(webhook_caller)]
Scorer = Annotated[Caller, Depends(scoring_caller)]
Viewer = Annotated[Caller, Depends(optional_key)]
MetricsViewer = Annotated[Caller, Depends(metrics_caller)]
JsonBody = Annotated[object, Depends(json_body)]
Records = Annotated[list[dict], Depends(upload_records)]
