"""`bradley snapshots`: the snapshots in the store, oldest first: what each report or training run read.

A snapshot is "every batch up to seq N, raters with this prefix" (annotation/snapshots.py); its id
replays that data exactly (`report --snapshot`, `export --snapshot`, `train … --snapshot`), also
through a running server (`bradley --server URL snapshots`, GET /snapshots). The table
says when each was taken, its rater filter, how many judgments it holds and which models were trained
on it; `--json` prints one JSON object per snapshot instead.

    $ bradley snapshots
    created_at           snapshot                  raters  batches  judgments  models
    2026-12-03 17:20:11  817b71523784dd01c46f64df  all     ≤ 1          1,502  rm-3f2a9c1b7e44
"""

from __future__ import annotations

import json

HEADER = ("created_at", "snapshot", "raters", "batches", "judgments", "models")


def add(sub) -> None:
    p = sub.add_parser("snapshots", help="list the snapshots that reports and training runs read")
    p.add_argument("--json", action="store_true", help="one JSON object per snapshot")


def rows(snapshots: list[dict]) -> list[tuple[str, ...]]:
    """The table's rows, as text.

    >>> rows([{"id": "ab", "created_at": "2026-01-02 03:04:05.123", "raters": None,
    ...        "max_batch_seq": 3, "n_judgments": 1500, "models": ["rm-1"]}])
    [('2026-01-02 03:04:05', 'ab', 'all', '≤ 3', '1,500', 'rm-1')]
    """
    return [(s["created_at"][:19], s["id"], s["raters"] or "all", f"≤ {s['max_batch_seq']}",
             f"{s['n_judgments']:,}", ", ".join(s["models"]) or "-") for s in snapshots]


def run(args) -> int:
    from service.remote.stores import open_store

    with open_store(args, read_only=True) as store:
        snapshots = store.snapshots()
    if args.json:
        for snap in snapshots:
            print(json.dumps(snap), flush=True)
        return 0
    if not snapshots:
        print("no snapshots yet: `bradley report` or `bradley train` records one", flush=True)
        return 0
    table = [HEADER, *rows(snapshots)]
    widths = [max(len(row[i]) for row in table) for i in range(len(HEADER))]
    for row in table:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip(), flush=True)
    return 0
