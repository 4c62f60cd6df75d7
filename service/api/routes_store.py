"""Routes that let a command work beside a running server, which owns the store's one DuckDB writer
(`bradley --server URL export|train|eval|label|snapshots|models register`, service/remote/stores.py):
snapshots, a snapshot's rows as Arrow IPC or Parquet, model registration and the reference
log-prob cache. Every one needs `Authorization: Bearer <key>` (`caller: Keyed`): rows and paths
describe the operator's data. And `GET /limits`, open to all: what one request may hold, so that a
client splits its work to fit instead of learning the limits from a 413 (service/client.py).

Rows stream as an Arrow IPC stream (`.arrow`, batches of STREAM_ROWS rows, the types a direct read
gives, so an export through the server equals a direct one byte for byte) or one Parquet file
(`.parquet`); the `X-Bradley-Snapshot` header names the snapshot they belong to, so a run trained
on them records it and stays replayable.
"""

from __future__ import annotations

import io
from collections.abc import Iterator

from fastapi import APIRouter, Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from service.api.deps import JsonBody, Keyed, Viewer
from service.api.payloads import PayloadError
from service.engine.runtime import Forbidden, NotFound

router = APIRouter()
STREAM_ROWS = 65_536  # rows per Arrow record batch on the wire
ROW_TABLES = ("judgments", "pairs", "feedback", "verdicts", "comparisons")
ROW_FORMATS = {"arrow": "application/vnd.apache.arrow.stream", "parquet": "application/vnd.apache.parquet"}


def _service(request: Request):
    return request.app.state.service


def _writable(svc) -> None:
    if svc.settings.read_only:
        raise Forbidden("this server is read-only (--read-only); send writes to the writer")


async def store_call(svc, fn, *args):
    """`fn(*args)` on the store thread; a snapshot or model the store does not hold is 404."""
    from annotation.store import StoreError

    try:
        return await svc.in_store(fn, *args)
    except StoreError as exc:
        if "not found" in str(exc):
            raise NotFound(str(exc)) from None
        raise


@router.get("/limits")
async def limits(request: Request, caller: Viewer) -> JSONResponse:
    """What one request from this caller may hold: body bytes (413 beyond), items per /score and
    /get_reward request, characters per text and, without a key, characters per request and
    requests in flight (null for a keyed caller)."""
    settings = _service(request).settings
    anonymous = not caller.keyed
    return JSONResponse({
        "keyed": caller.keyed, "max_body_bytes": settings.max_body_bytes,
        "body_read_timeout_s": settings.body_read_timeout_s,
        "max_items_per_request": settings.max_items_per_request,
        "max_get_reward_items": settings.max_get_reward_items,
        "max_text_chars": settings.max_text_chars,
        "max_request_chars": settings.anon_max_request_chars if anonymous else None,
        "max_concurrent": settings.anon_max_concurrent if anonymous else None})


@router.get("/snapshots")
async def list_snapshots(request: Request, caller: Keyed) -> JSONResponse:
    """Every snapshot, oldest first (what `bradley snapshots` lists)."""
    svc = _service(request)
    return JSONResponse({"snapshots": await svc.in_store(svc.store.snapshots)})


@router.post("/snapshots", status_code=201)
async def create_snapshot(request: Request, caller: Keyed, value: JsonBody) -> JSONResponse:
    """`{"raters": "human" | "ai" | PREFIX | null}` -> `{"id", "raters"}`: freeze what a run will read."""
    svc = _service(request)
    _writable(svc)
    raters = _optional_text(value, "raters")
    snapshot_id = await svc.in_store(svc.store.create_snapshot, raters)
    return JSONResponse({"id": snapshot_id, "raters": raters}, 201)


@router.get("/rows/{name}")
async def rows(name: str, request: Request, caller: Keyed) -> Response:
    """`judgments|pairs|feedback|verdicts|comparisons` `.arrow` (IPC stream) or `.parquet`, with
    `?snapshot=ID` (default: everything now) and `?raters=human|ai|PREFIX`; comparisons take
    `?raters=`, `?unjudged_by=RATER` and `?limit=N` (`bradley label`'s selection)."""
    svc = _service(request)
    table_name, _, fmt = name.partition(".")
    if table_name not in ROW_TABLES or fmt not in ROW_FORMATS:
        raise PayloadError("name", f"unknown rows {name!r}; use one of {', '.join(ROW_TABLES)} "
                           "with .arrow or .parquet", 404)
    query = request.query_params
    snapshot = query.get("snapshot") or None
    table = await store_call(svc, _reader(svc.store, table_name, query), snapshot)
    headers = {"X-Bradley-Snapshot": snapshot or ""}
    if fmt == "parquet":
        body = await svc.in_store(_parquet_bytes, table)  # the store thread: one file at a time
        return Response(body, media_type=ROW_FORMATS[fmt], headers=headers)
    return StreamingResponse(ipc_stream(table), media_type=ROW_FORMATS[fmt], headers=headers)


def _reader(store, table_name: str, query):
    """The store read behind a table name, as a function of the snapshot id."""
    raters = query.get("raters") or None
    if table_name == "comparisons":
        limit = query.get("limit")
        if limit is not None and not (limit.isdigit() and int(limit) > 0):
            raise PayloadError("limit", "must be a positive integer")
        unjudged_by = query.get("unjudged_by") or None
        return lambda snapshot: store.comparisons(raters, unjudged_by, int(limit) if limit else None)
    read = {"judgments": store.judgments, "pairs": store.pairs, "feedback": store.feedback,
            "verdicts": store.verdict_arrays}[table_name]
    return lambda snapshot: read(snapshot, raters)


def ipc_stream(table) -> Iterator[bytes]:
    """The table as an Arrow IPC stream, a record batch at a time (a sync generator: Starlette runs
    it in a worker thread, off the event loop).

    >>> import pyarrow as pa
    >>> t = pa.table({"x": list(range(5))})
    >>> pa.ipc.open_stream(b"".join(ipc_stream(t))).read_all().equals(t)
    True
    """
    import pyarrow as pa

    out: list[bytes] = []

    class Sink(io.RawIOBase):
        def writable(self) -> bool:
            return True

        def write(self, data) -> int:
            out.append(bytes(data))
            return len(data)

    with pa.ipc.new_stream(Sink(), table.schema) as writer:
        for batch in table.to_batches(max_chunksize=STREAM_ROWS):
            writer.write_batch(batch)
            yield b"".join(out)
            out.clear()
    yield b"".join(out)  # the end-of-stream marker


def _parquet_bytes(table) -> bytes:
    import pyarrow.parquet as pq

    buffer = io.BytesIO()
    pq.write_table(table, buffer)
    return buffer.getvalue()


@router.post("/models", status_code=201)
async def register_model(request: Request, caller: Keyed, value: JsonBody) -> JSONResponse:
    """Register a model folder trained beside the server: `{"path", "config": train_config.json,
    "metrics": metrics.json, "retire": [ids its --overwrite replaced]}` -> `{"id", "registered"}`
    (201; 200 with `registered: false` when that id is already registered with that path)."""
    from service.engine.registry import register_record

    svc = _service(request)
    _writable(svc)
    if not isinstance(value, dict):
        raise PayloadError("body", "expected a JSON object with path, config and metrics")
    path = _optional_text(value, "path")
    config, metrics = (_object(value, key) for key in ("config", "metrics"))
    retire = value.get("retire") or []
    if not path or not isinstance(retire, list) or not all(isinstance(r, str) for r in retire):
        raise PayloadError("path" if not path else "retire", "path: the model folder; retire: a "
                           "list of model ids")
    model_id, new = await svc.in_store(register_record, svc.store, path, config, metrics, retire)
    return JSONResponse({"id": model_id, "registered": new}, 201 if new else 200)


@router.post("/ref_logps/lookup")
async def ref_logps_lookup(request: Request, caller: Keyed, value: JsonBody) -> JSONResponse:
    """`{"model_hash", "template", "response_ids"}` -> `{"logps": {response_id: [logp, n_tokens]}}`
    for the ids the cache holds (a policy run's reference pass skips them)."""
    svc = _service(request)
    model_hash, template = _optional_text(value, "model_hash"), _optional_text(value, "template")
    ids = value.get("response_ids") if isinstance(value, dict) else None
    if not (model_hash and template and isinstance(ids, list)):
        raise PayloadError("body", "expected {model_hash, template, response_ids: [...]}")
    found = await svc.in_store(svc.store.ref_logps, model_hash, template, [str(i) for i in ids])
    return JSONResponse({"logps": {k: list(v) for k, v in found.items()}})


@router.post("/ref_logps", status_code=201)
async def ref_logps_put(request: Request, caller: Keyed, value: JsonBody) -> JSONResponse:
    """`{"model_hash", "template", "rows": [[response_id, logp, n_tokens], ...]}`: cache them."""
    svc = _service(request)
    _writable(svc)
    model_hash, template = _optional_text(value, "model_hash"), _optional_text(value, "template")
    rows = value.get("rows") if isinstance(value, dict) else None
    if not (model_hash and template and isinstance(rows, list)
            and all(isinstance(r, list) and len(r) == 3 for r in rows)):
        raise PayloadError("body", "expected {model_hash, template, rows: [[response_id, logp, n]]}")
    await svc.in_store(svc.store.put_ref_logps, model_hash, template, rows)
    return JSONResponse({"rows": len(rows)}, 201)


def _optional_text(value, key: str) -> str | None:
    if not isinstance(value, dict):
        raise PayloadError("body", "expected a JSON object")
    got = value.get(key)
    if got is not None and not isinstance(got, str):
        raise PayloadError(key, f"must be a string, not {type(got).__name__}")
    return got


def _object(value: dict, key: str) -> dict:
    got = value.get(key)
    if not isinstance(got, dict):
        raise PayloadError(key, "must be a JSON object (the folder's train_config.json / metrics.json)")
    return got
