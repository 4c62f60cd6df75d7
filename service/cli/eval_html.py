"""`bradley eval`'s result for people: a terminal table and a self-contained HTML page with a
per-subset bar chart (matplotlib inlined as a PNG, styled as the report's page, analysis/report_html.py).

Rows follow the leaderboard's layout: RewardBench's four sections, each with its subsets under it;
RewardBench 2's six subsets; a pairs file's subsets; the overall score last.

    >>> print(table({"model_id": "rm-x", "data": "f.jsonl", "n_pairs": 2, "accuracy": 0.5,
    ...              "per_subset": {"a": {"n": 2, "accuracy": 0.5}}}))
    rm-x on f.jsonl
      subset                      n   score
      a                           2   0.500
      accuracy                    2   0.500
"""

from __future__ import annotations

import html
from pathlib import Path

from analysis.report_html import STYLE, _png, _pyplot, figure_tag
from rm.eval.leaderboards import REWARDBENCH2_SUBSETS, REWARDBENCH_SECTIONS

TITLES = {"rewardbench": "RewardBench", "rewardbench2": "RewardBench 2", None: "pairs"}
COLOURS = {"Chat": "#4c72b0", "Chat Hard": "#dd8452", "Safety": "#55a868", "Reasoning": "#c44e52"}


def score_rows(result: dict) -> list[tuple[str, int | None, float | None, str | None]]:
    """(label, n, score, section) in display order; section None for a total or a section's own
    row, else the section a subset belongs to ("" outside RewardBench)."""
    per_subset, benchmark = result.get("per_subset", {}), result.get("benchmark")
    rows: list = []
    if benchmark == "rewardbench":
        for section, subsets in REWARDBENCH_SECTIONS.items():
            rows.append((section, None, result["sections"][section], None))
            rows += [(s, per_subset[s]["n"], per_subset[s]["score"], section)
                     for s in subsets if s in per_subset]
    elif benchmark == "rewardbench2":
        rows += [(s, per_subset[s]["n"], per_subset[s]["score"], "")
                 for s in REWARDBENCH2_SUBSETS if s in per_subset]
    else:
        rows += [(s, v["n"], v["accuracy"], "") for s, v in per_subset.items()]
        return rows + [("accuracy", result.get("n_pairs"), result.get("accuracy"), None)]
    return rows + [("score", result.get("n_rows"), result.get("score"), None)]


def _number(value) -> str:
    return "—" if value is None else f"{value:.3f}"


def _heading(result: dict) -> str:
    where = f" via {result['server']}" if result.get("server") else ""
    bench = f" ({TITLES[result['benchmark']]})" if result.get("benchmark") else ""
    return f"{result.get('model_id')}{where} on {result.get('data')}{bench}"


def table(result: dict) -> str:
    """The scores as aligned text; subsets indented under their RewardBench section."""
    lines = [_heading(result), f"  {'subset':<24}{'n':>5}   score"]
    for label, n, value, section in score_rows(result):
        name = f"  {label}" if section else label
        lines.append(f"  {name:<24}{'' if n is None else n:>5}   {_number(value)}")
    missing = result.get("missing_subsets")
    if missing:
        lines.append(f"  no overall score: {len(missing)} of the benchmark's subsets are not in the "
                     f"file ({', '.join(missing[:4])}{', …' if len(missing) > 4 else ''})")
    return "\n".join(lines)


def plot_subsets(result: dict) -> bytes | None:
    """Horizontal bars, one per subset (coloured by RewardBench section), with chance marked."""
    bars = [(label, value or 0.0, COLOURS.get(section, "#4c72b0"))
            for label, _, value, section in score_rows(result) if section is not None]
    if not bars:
        return None
    fig, ax = _pyplot().subplots(figsize=(7, 0.8 + 0.3 * len(bars)))
    ax.barh([b[0] for b in bars][::-1], [b[1] for b in bars][::-1], color=[b[2] for b in bars][::-1])
    if result.get("benchmark") != "rewardbench2":  # one pair: a coin scores ½
        ax.axvline(0.5, color="#888", lw=1, ls="--")
    if result.get("benchmark") == "rewardbench":
        from matplotlib.patches import Patch

        shown = {section for _, _, _, section in score_rows(result) if section}
        ax.legend(handles=[Patch(color=c, label=s) for s, c in COLOURS.items() if s in shown],
                  loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=8)
    ax.set_xlim(0, max(1.0, max(b[1] for b in bars)))
    ax.set_xlabel("accuracy" if result.get("benchmark") != "rewardbench2" else "score")
    ax.set_title(f"Per-subset scores: {TITLES[result.get('benchmark')]}")
    return _png(fig)


def render(result: dict) -> str:
    """One self-contained page: heading, the overall score, the chart and the table."""
    png = plot_subsets(result)
    cells = "".join(
        f"<tr><td>{'&nbsp;&nbsp;' if section else ''}{html.escape(label)}</td>"
        f"<td>{'' if n is None else n}</td><td>{_number(value)}</td></tr>"
        for label, n, value, section in score_rows(result))
    overall = result.get("score", result.get("accuracy"))
    missing = result.get("missing_subsets") or []
    note = (f"<p class='meta'>No overall score: the file lacks {len(missing)} of the benchmark's "
            f"subsets ({html.escape(', '.join(missing))}).</p>" if missing else "")
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>bradley eval</title>"
            f"<style>{STYLE}</style></head><body><h1>bradley eval</h1>"
            f"<p class='meta'>{html.escape(_heading(result))}</p>"
            f"<p id='overall'>Overall: <b>{_number(overall)}</b></p>{note}"
            f"<figure id='subsets'>{figure_tag(png, 'per-subset scores') if png else ''}</figure>"
            f"<table id='scores'><tr><th>subset</th><th>n</th><th>score</th></tr>{cells}</table>"
            f"</body></html>")


def write_html(path: str, result: dict) -> None:
    Path(path).write_text(render(result), encoding="utf-8")
