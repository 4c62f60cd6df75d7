"""`bradley --server URL ingest FILE…` and `bradley --server URL report`: work through a running
`bradley serve`, which owns the store's one DuckDB writer (DESIGN.md: a CLI command either opens the
file or goes through the server). The key comes from BRADLEY_API_KEY.

Rows are read twice, so memory holds one upload, not the file: a first pass checks them with the
parsers of a direct ingest (annotation/ingest/formats.py), the second posts them to their format's route: judgments → POST /judgments, trl and hh → POST /pairs
(an hh transcript pair is split into prompt, chosen and rejected first, as a direct ingest does),
kto → POST /feedback. Label Studio exports go through `bradley label-studio` or the webhook.

Atomicity: with `--on-error abort` (the default) every row is checked before anything is sent, so a
bad row anywhere sends nothing and its error names FILE:LINE and the field. A file larger than one
request body is sent as several uploads of at most UPLOAD_BYTES each (halved while the server
answers 413), and each upload is its own
batch: if the connection fails half-way, the uploads already made stay (the error says how many
the server acknowledged), and running the same command again sends identical uploads, which the
server answers as duplicates (no-ops), then the rest. A row too large for one request is refused
as 413 with the server's limit (GET /limits), before it is sent.

The summary line is followed by the batch ids, one a line (`batch ID`); a progress bar counts the
rows sent when stderr is a terminal.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import urllib.error
import urllib.parse

from annotation.ingest import formats
from annotation.ingest.readers import ReadError, open_parts
from service.client import ClientError, ScoreClient
from service.remote import translated

ROUTES = {"judgments": "judgments", "trl": "pairs", "hh": "pairs", "kto": "feedback"}
UPLOAD_BYTES = 4 * 1024 * 1024  # half the server's default BRADLEY_MAX_BODY_BYTES


class Refused(ValueError):
    """Rows that cannot be sent; `errors` has one FILE:LINE: field: problem line per bad row."""

    def __init__(self, errors: list[str]):
        super().__init__(errors[0] if errors else "nothing to send")
        self.errors = errors


@contextlib.contextmanager
def server(url: str, what: str):
    """A client with the write key, its errors `translated`."""
    with translated(url, what), ScoreClient(url, api_key=os.environ.get("BRADLEY_API_KEY"),
                                            retries=2) as client:
        yield client


def ingest(args) -> int:
    status = 0
    for path in args.files:
        try:
            fmt = file_format(path, args.format)
            bad, total = problems(path, fmt)
            if bad and args.on_error == "abort":
                raise Refused(list(bad.values()))
        except Refused as exc:
            print("\n".join(exc.errors), file=sys.stderr)
            print(f"{path}: nothing sent", file=sys.stderr, flush=True)
            status = 1
            continue
        with server(args.server, path) as client:
            print(send(client, path, ROUTES[fmt], rows(path, fmt, bad), args.on_error, total),
                  flush=True)
    return status


def report(args) -> int:
    """The server's report of its store (GET /reports/{snapshot or latest}.json, and .html for
    --html), written and summarised as `bradley report` does."""
    from analysis import report as reports

    if args.fail_on:
        reports.parse_rules(args.fail_on)  # bad rules fail before any request
    name = urllib.parse.quote(args.snapshot or "latest", safe="")
    query = "?" + urllib.parse.urlencode({"raters": args.raters}) if args.raters else ""
    with server(args.server, "report") as client:
        data = client.request("GET", f"/reports/{name}.json{query}")
        page = lambda: client.request("GET", f"/reports/{name}.html{query}", raw=True).decode()  # noqa: E731
        return reports.finish(data, page, args.html, args.json, args.fail_on)


def records(path: str):
    """Every record of the file (annotation/ingest/readers.py: the reader of a direct ingest); an
    unreadable file raises Refused."""
    try:
        for part in open_parts(path):
            yield from part.records()
    except ReadError as exc:
        raise Refused([str(exc)]) from None


def file_format(path: str, fmt: str) -> str:
    """The row format (`auto`: from the first row's columns), one that --server can send."""
    if fmt == "auto":
        first = next((r.value for r in records(path) if r.value is not None), None)
        if first is None:
            raise Refused([f"{path}: no rows"])
        fmt = formats.detect_format(first.keys())
    if fmt not in ROUTES:
        raise ValueError(f"{path}: --server uploads judgments, trl, hh and kto rows, not {fmt}; use "
                         "`bradley label-studio` for a project, or ingest without --server")
    return fmt


def problems(path: str, fmt: str) -> tuple[dict[int, str], int]:
    """The first pass: (row ordinal -> "FILE:LINE: field: problem" for every bad row, rows in all);
    no row is kept, and a JSON array's rows can share a line."""
    bad, total = {}, 0
    for r in records(path):
        total += 1
        if problem := r.problem or _problem(fmt, r.value, r.line):
            bad[r.row] = f"{path}:{r.line}: {problem}"
    return bad, total


def rows(path: str, fmt: str, bad: dict[int, str]):
    """The second pass: what to post, a row at a time. A bad row (kept by --on-error skip) goes as
    it is, or as its text when it did not parse: the server puts it in rejects."""
    for r in records(path):
        if r.value is None:
            yield r.raw
        elif fmt == "hh" and r.row not in bad:
            yield _as_pair(r.value)
        else:
            yield r.value


def _problem(fmt: str, row: dict, line: int) -> str | None:
    bad = [item for item in formats.normalize(fmt, row, line) if isinstance(item, formats.RowError)]
    return str(bad[0]) if bad else None


def _as_pair(row: dict) -> dict:
    prompt, chosen, rejected = formats.split_transcripts(row["chosen"], row["rejected"])
    return {**row, "prompt": prompt, "chosen": chosen, "rejected": rejected}


def send(client: ScoreClient, path: str, route: str, rows, on_error: str,
         total: int | None = None) -> str:
    """Post `rows` in uploads of at most UPLOAD_BYTES; a summary of what the server wrote (one
    line, then a `batch ID` line per upload). A connection lost half-way is an OSError that says
    how many uploads the server had acknowledged."""
    totals = {"rows_ok": 0, "rows_rejected": 0, "duplicate": 0}
    batches, sent = [], 0
    bar = _bar(path, total)
    try:
        for upload in chunks(rows, UPLOAD_BYTES):
            for result in post(client, f"/{route}?on_error={on_error}", upload):
                totals["rows_ok"] += result.get("rows_ok") or 0
                totals["rows_rejected"] += result.get("rows_rejected") or 0
                totals["duplicate"] += bool(result.get("duplicate"))
                batches.append(result.get("batch_id"))
            sent += len(upload)
            bar.update(len(upload))
    except (urllib.error.URLError, ConnectionError, TimeoutError) as exc:
        raise OSError(f"cannot reach {client.url}: {getattr(exc, 'reason', exc)}; the server had "
                      f"acknowledged {len(batches)} upload(s) of {path} ({sent} rows, "
                      f"{totals['rows_ok']} ok) before the connection was lost. Run the same "
                      "command again: those come back as duplicates, then the rest is sent") from None
    finally:
        bar.close()
    summary = (f"{path}: {sent} rows in {len(batches)} upload(s) to {client.url}/{route}: "
               f"{totals['rows_ok']} ok, {totals['rows_rejected']} rejected, "
               f"{totals['duplicate']} already there")
    return "\n".join([summary, *(f"batch {b}" for b in batches)])


def _bar(path: str, total: int | None):
    from tqdm import tqdm

    return tqdm(total=total, desc=f"sending {path}", unit="row", file=sys.stderr, disable=None,
                leave=False)


def post(client: ScoreClient, path: str, upload: list) -> list[dict]:
    """The server's answers to `upload`, halved until each part fits its body limit (413: a server
    configured below UPLOAD_BYTES with BRADLEY_MAX_BODY_BYTES)."""
    try:
        return [client.request("POST", path, upload)]
    except ClientError as exc:
        if exc.status != 413 or len(upload) == 1:
            raise
    half = len(upload) // 2
    return post(client, path, upload[:half]) + post(client, path, upload[half:])


def chunks(rows, limit: int):
    """Consecutive runs of rows whose JSON stays under `limit` bytes (a longer row goes alone).

    >>> [len(c) for c in chunks([{"a": "x" * 10}] * 5, 50)]   # 2 + 20 bytes a row
    [2, 2, 1]
    """
    current, size = [], 2
    for row in rows:
        n = len(json.dumps(row).encode()) + 1  # ScoreClient's encoding (ASCII escapes)
        if current and size + n > limit:
            yield current
            current, size = [], 2
        current.append(row)
        size += n
    if current:
        yield current
