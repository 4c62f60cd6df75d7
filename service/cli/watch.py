"""`bradley --server URL watch [--html OUT]`: a running server's reward-hacking watch (GET /watch,
service/engine/watch.py) as a terminal table, one row per served model and run, and with `--html` a
self-contained page with each signal over time (the server's history, one line per model and run).

    >>> print(table({"watching": True, "window": 4, "models": {"rm-a": {"reference": {
    ...     "length_correlation": 0.1}, "runs": {"ppo": {"current": {"items": 4,
    ...     "reward_z_mean": 0.5, "reward_z_p05": -1.0, "reward_z_p50": 0.4, "reward_z_p95": 2.0,
    ...     "reward_length_correlation": 0.62, "response_chars": 420.0, "response_chars_ratio": 1.5,
    ...     "duplicate_share": 0.0, "ood_share": 0.25, "disagreement": None}}}}}}))
    model  run  items  z mean  z p05  z p50  z p95  len r (val)  chars (x val)  dup   ood   disagree
    rm-a   ppo      4    0.50  -1.00   0.40   2.00  0.62 (0.10)  420 (1.50x)    0.00  0.25  -
"""

from __future__ import annotations

import argparse
import html
import sys
from pathlib import Path

COLUMNS = ("model", "run", "items", "z mean", "z p05", "z p50", "z p95", "len r (val)",
           "chars (x val)", "dup", "ood", "disagree")
SIGNALS = {  # history key -> chart title
    "reward_z_mean": "reward, validation stds from the validation mean (window mean)",
    "reward_length_correlation": "reward-length Pearson r",
    "response_chars_ratio": "mean response length / validation's",
    "duplicate_share": "duplicate responses (share)",
    "ood_share": "beyond validation's 99th-percentile Mahalanobis distance (share)",
    "disagreement": "ensemble disagreement (std of standardised members)",
}


def add(sub) -> None:
    p = sub.add_parser("watch", help="a running server's reward-hacking watch: reward drift, "
                       "length, duplicates, out-of-distribution share, ensemble disagreement",
                       description="Reads GET /watch of `bradley --server URL`; key from env "
                       "BRADLEY_API_KEY when the server keeps /metrics private.")
    p.add_argument("--server", default=argparse.SUPPRESS, metavar="URL",
                   help="the running `bradley serve` to read; also before the command")
    p.add_argument("--html", default=None, metavar="OUT",
                   help="also write a page with every signal over time (the server's history)")


def run(args) -> int:
    if not args.server:
        raise ValueError("watch reads a running server: `bradley --server URL watch`")
    from service.remote.commands import server

    with server(args.server, "watch") as client:
        watched = client.request("GET", "/watch")
    print(table(watched), flush=True)
    if args.html:
        Path(args.html).write_text(page(watched, args.server))
        print(f"wrote {args.html}", file=sys.stderr, flush=True)
    return 0


def table(watched: dict) -> str:
    """The current window of every (model, run), aligned; a line saying why when nothing is
    watched."""
    if not watched.get("watching"):
        return f"not watching: {watched.get('reason')}"
    rows = [COLUMNS]
    for model, entry in watched["models"].items():
        reference = entry["reference"]
        for run_name, run in entry["runs"].items():
            c = run["current"]
            rows.append((model, run_name, str(c["items"]), *(_num(c[f"reward_z_{s}"]) for s in
                                                           ("mean", "p05", "p50", "p95")),
                         f"{_num(c['reward_length_correlation'])} "
                         f"({_num(reference['length_correlation'])})",
                         f"{_num(c['response_chars'], 0)} ({_num(c['response_chars_ratio'])}x)",
                         _num(c["duplicate_share"]), _num(c["ood_share"]), _num(c["disagreement"])))
    if len(rows) == 1:
        return f"watching {', '.join(watched['models'])}: no items scored yet"
    widths = [max(len(row[i]) for row in rows) for i in range(len(COLUMNS))]
    numeric = range(2, 7)  # items and the z columns read best right-aligned
    lines = ["  ".join(cell.rjust(w) if i in numeric and k else cell.ljust(w)
                       for i, (cell, w) in enumerate(zip(row, widths, strict=True)))
             for k, row in enumerate(rows)]
    return "\n".join(line.rstrip() for line in lines)


def _num(value, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def page(watched: dict, url: str) -> str:
    """A self-contained HTML page: the table, then one chart per signal over the history."""
    from analysis.report_html import STYLE

    charts = "".join(_chart(watched, key, title) for key, title in SIGNALS.items())
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>bradley watch</title>"
            f"<style>{STYLE}</style></head><body><h1>bradley watch: {html.escape(url)}</h1>"
            f"<pre>{html.escape(table(watched))}</pre>"
            f"<p>Windows of the last {watched.get('window')} items per model and run; one point "
            f"per {watched.get('history_interval_s')} s.</p>{charts}</body></html>")


def _chart(watched: dict, key: str, title: str) -> str:
    """One signal over time, a line per (model, run), as an inlined PNG (none without history)."""
    from analysis.report_html import _png, _pyplot, figure_tag

    series = [(f"{model} / {run_name}", [(h["time"], h[key]) for h in run.get("history", [])
                                         if h.get(key) is not None])
              for model, entry in watched.get("models", {}).items()
              for run_name, run in entry["runs"].items()]
    series = [(label, points) for label, points in series if points]
    if not series:
        return ""
    start = min(points[0][0] for _, points in series)
    fig, ax = _pyplot().subplots(figsize=(8, 2.6))
    for label, points in series:
        ax.plot([(t - start) / 60 for t, _ in points], [v for _, v in points], label=label)
    ax.set_xlabel("minutes")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=7, loc="best")
    return f"<h2>{html.escape(title)}</h2><figure id='{key}'>{figure_tag(_png(fig), title)}</figure>"
