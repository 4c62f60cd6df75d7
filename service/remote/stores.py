"""Where a command's store is: the DuckDB file (`--db`), or a running `bradley serve` that holds it
(`--server URL`: DuckDB allows one writing process, and the server is it).

`open_store(args)` gives either an annotation.store.Store or a `RemoteStore`, which answers the
reads the commands make (judgments, pairs, feedback, verdicts, comparisons, snapshots, models, the
reference log-prob cache) from the server's routes (service/api/routes_store.py): rows arrive as an
Arrow IPC stream with the types a direct read gives, so what a command does with them is the same
either way. Writes go through authenticated routes: snapshots, model registration, judgments (the
upload route `bradley --server URL ingest` uses). The key comes from BRADLEY_API_KEY.
"""

from __future__ import annotations

import os
import urllib.parse
from pathlib import Path

from service.client import ScoreClient
from service.remote import translated


class NoStore(ValueError):
    """`--db` names no store and the command only reads one (it would create an empty file)."""


def open_store(args, read_only: bool = False, create: bool = False):
    """The store `args` name: a RemoteStore with `--server`, else the file (created only when
    `create`; a command that reads one refuses a missing file rather than make an empty store)."""
    if getattr(args, "server", None):
        return RemoteStore(args.server)
    from annotation.store import Store

    if not create and str(args.db) != ":memory:" and not Path(args.db).exists():
        raise NoStore(f"no store at {args.db}; ingest data first (`bradley --db {args.db} ingest "
                      "FILE`), or pass --db PATH or --server URL")
    return Store(args.db, read_only=read_only)


def is_remote(store) -> bool:
    return isinstance(store, RemoteStore)


def write_judgments(store, rows: list[dict], source: str) -> tuple[int, str | None]:
    """(judgments written, batch id) of `rows` ingested into the store, or posted to the server
    that holds it (there, one batch per upload: the ids joined by commas)."""
    if is_remote(store):
        answers = store.upload("judgments", rows)
        return (sum(a.get("rows_ok") or 0 for a in answers),
                ",".join(str(a.get("batch_id")) for a in answers))
    from annotation.ingest.batch import ingest_records

    result = ingest_records(store, rows, fmt="judgments", source=source)
    return result.rows_ok, result.batch_id


class RemoteStore:
    """The reads and writes commands make of a store, through a server that holds it. Errors are
    the CLI's: a refusal is a ValueError with the server's message, an unreachable server an
    OSError naming the URL."""

    def __init__(self, url: str):
        key = os.environ.get("BRADLEY_API_KEY")
        if not key:
            raise ValueError(f"--server {url}: set BRADLEY_API_KEY to one of the server's "
                             "BRADLEY_API_KEYS (its store's rows and models need a key)")
        self.url = self.path = url.rstrip("/")
        self.client = ScoreClient(self.url, api_key=key, retries=2)

    def __enter__(self) -> RemoteStore:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self.client.close()

    def call(self, method: str, path: str, body=None, raw: bool = False):
        with translated(self.url):
            return self.client.request(method, path, body, raw=raw)

    # -- rows ----------------------------------------------------------------------------------

    def rows(self, table: str, snapshot_id: str | None = None, **query):
        """`table` of the server's store (routes_store.ROW_TABLES) as an Arrow table."""
        import pyarrow as pa

        params = {k: v for k, v in {"snapshot": snapshot_id, **query}.items() if v is not None}
        content = self.call("GET", f"/rows/{table}.arrow?{urllib.parse.urlencode(params)}", raw=True)
        return pa.ipc.open_stream(pa.py_buffer(content)).read_all()

    def judgments(self, snapshot_id: str | None = None, raters: str | None = None):
        return self.rows("judgments", snapshot_id, raters=raters)

    def pairs(self, snapshot_id: str | None = None, raters: str | None = None):
        return self.rows("pairs", snapshot_id, raters=raters)

    def feedback(self, snapshot_id: str | None = None, raters: str | None = None):
        return self.rows("feedback", snapshot_id, raters=raters)

    def verdict_arrays(self, snapshot_id: str | None = None, raters: str | None = None):
        return self.rows("verdicts", snapshot_id, raters=raters)

    def comparisons(self, raters: str | None = None, unjudged_by: str | None = None,
                    limit: int | None = None):
        return self.rows("comparisons", raters=raters, unjudged_by=unjudged_by, limit=limit)

    # -- snapshots, models, the reference cache ------------------------------------------------

    def create_snapshot(self, raters: str | None = None) -> str:
        return self.call("POST", "/snapshots", {"raters": raters})["id"]

    def snapshots(self) -> list[dict]:
        return self.call("GET", "/snapshots")["snapshots"]

    def models(self) -> list[dict]:
        return [m for m in self.call("GET", "/models")["models"] if "path" in m]

    def model(self, model_id: str) -> dict:
        for row in self.models():
            if row["id"] == model_id:
                return row
        raise ValueError(f"model {model_id!r} is not registered at {self.url}; `bradley --server "
                         f"{self.url} models list` lists them")

    def register(self, path: str, record: dict, metrics: dict, retire=()) -> tuple[str, bool]:
        """(model id, whether it is new), as service.engine.registry.register_record."""
        answer = self.call("POST", "/models", {"path": path, "config": record, "metrics": metrics,
                                               "retire": list(retire)})
        return answer["id"], answer["registered"]

    def ref_logps(self, model_hash: str, template_hash: str, response_ids) -> dict:
        body = {"model_hash": model_hash, "template": template_hash, "response_ids": list(response_ids)}
        found = self.call("POST", "/ref_logps/lookup", body)["logps"]
        return {k: (v[0], v[1]) for k, v in found.items()}

    def upload(self, route: str, rows: list[dict]) -> list[dict]:
        """POST `rows` to /judgments, /pairs or /feedback in uploads under the body limit (the
        path of `bradley --server URL ingest`); the server's answer to each."""
        from service.remote.commands import UPLOAD_BYTES, chunks, post

        with translated(self.url):
            return [answer for upload in chunks(rows, UPLOAD_BYTES)
                    for answer in post(self.client, f"/{route}", upload)]

    def put_ref_logps(self, model_hash: str, template_hash: str, rows) -> None:
        rows = [[rid, float(lp), int(n)] for rid, lp, n in rows]
        if rows:
            self.call("POST", "/ref_logps", {"model_hash": model_hash, "template": template_hash,
                                             "rows": rows})
