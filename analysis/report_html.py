"""The report as one self-contained HTML page: matplotlib figures inlined as base64 PNGs, no scripts,
no external resources, so it opens the same from a mail attachment, a CI artifact or `GET /reports`.

Sections (ids used by tests): verdict, length-bias, agreement, cycles, floors.

    >>> figure_tag(b"\\x89PNG", "x")
    '<img alt="x" src="data:image/png;base64,iVBORw==">'
"""

from __future__ import annotations

import base64
import html
import io
import math

LN2 = math.log(2)
MAX_RATERS_SHOWN = 30  # the agreement matrix and per-rater bars keep the busiest raters
MIN_ROWS_SHOWN = 20  # per-rater length-bias rows need this many verdicts to say anything

STYLE = """
body { font-family: system-ui, sans-serif; max-width: 1100px; margin: 2em auto; color: #222; }
h1 { margin-bottom: 0.2em; } .meta { color: #666; }
.verdict { border-left: 6px solid #c60; background: #fff6ec; padding: 0.6em 1em; margin: 1em 0; }
.verdict.ok { border-color: #393; background: #f0fff0; }
table { border-collapse: collapse; margin: 0.5em 0; font-size: 0.9em; }
td, th { border: 1px solid #ccc; padding: 3px 8px; text-align: left; vertical-align: top; }
img { max-width: 100%; } figure { margin: 0.5em 0; }
"""


def figure_tag(png: bytes, alt: str) -> str:
    return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{base64.b64encode(png).decode()}">'


def _png(fig) -> bytes:
    import matplotlib.pyplot as plt

    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=90, bbox_inches="tight")
    plt.close(fig)
    return buffer.getvalue()


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # no display on servers and CI
    import matplotlib.pyplot as plt

    return plt


def plot_length_curve(curve: dict) -> bytes | None:
    if not len(curve.get("abs_delta") or []):
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 3.6))
    ax.plot(curve["abs_delta"], curve["p_longer_wins"], "o-", color="#c60")
    ax.axhline(0.5, color="#888", lw=1, ls="--")
    ax.set_xscale("log")  # equal lengths are left out, so every |Δ| > 0
    ax.set_xlabel("length difference |len_a − len_b| (characters, bin mean)")
    ax.set_ylabel("share won by the longer")
    ax.set_ylim(0, 1)
    ax.set_title("Win rate of the longer response against length difference")
    return _png(fig)


def _busiest(per_rater: dict) -> list[str]:
    ranked = sorted(per_rater, key=lambda r: -per_rater[r].get("n", 0))
    return sorted(ranked[:MAX_RATERS_SHOWN])


def plot_agreement_matrix(kappas: list, raters: list[str]) -> bytes | None:
    """Cohen's kappa per pair of raters (blank where they share too few items)."""
    import numpy as np

    if not kappas or len(raters) < 2:
        return None
    index = {r: i for i, r in enumerate(raters)}
    matrix = np.full((len(raters), len(raters)), np.nan)
    for pair in kappas:
        i, j = index.get(pair["rater_1"]), index.get(pair["rater_2"])
        if i is not None and j is not None and pair.get("kappa") is not None:
            matrix[i, j] = matrix[j, i] = pair["kappa"]
    plt = _pyplot()
    size = 3 + 0.25 * len(raters)
    fig, ax = plt.subplots(figsize=(size + 1.5, size))
    image = ax.imshow(matrix, cmap="RdYlGn", vmin=-1, vmax=1)
    ax.set_xticks(range(len(raters)), raters, rotation=90, fontsize=7)
    ax.set_yticks(range(len(raters)), raters, fontsize=7)
    fig.colorbar(image, ax=ax, label="Cohen's kappa")
    ax.set_title("Agreement matrix of raters")
    return _png(fig)


def plot_per_rater(per_rater: dict, raters: list[str]) -> bytes | None:
    """Agreement with the leave-one-out majority, Wilson interval as error bar; flagged in red."""
    rows = [(r, per_rater[r]) for r in raters if per_rater[r].get("agreement") is not None]
    if not rows:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 1 + 0.25 * len(rows)))
    values = [v["agreement"] for _, v in rows]
    # Clamped: rounding can put a Wilson bound a hair on the wrong side of its point estimate.
    errors = [[max(0.0, v["agreement"] - _bound(v, "low")) for _, v in rows],
              [max(0.0, _bound(v, "high") - v["agreement"]) for _, v in rows]]
    colors = ["#c33" if v.get("flagged") else "#48a" for _, v in rows]
    ax.barh(range(len(rows)), values, xerr=errors, color=colors)
    ax.set_yticks(range(len(rows)), [r for r, _ in rows], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlim(0, 1)
    ax.set_xlabel("agreement with the leave-one-out majority (red: flagged)")
    ax.set_title("Per-rater agreement")
    return _png(fig)


def _bound(stats: dict, key: str) -> float:
    value = stats.get(key)
    return stats["agreement"] if value is None else value


def plot_floors(cycles: dict) -> bytes | None:
    ent, bt = cycles.get("entropy_floor"), cycles.get("bt_floor")
    if ent is None or bt is None:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 2.6))
    names = ["entropy floor\n(any model)", "Bradley–Terry floor\n(one score)", "ln 2\n(coin flip)"]
    ax.barh(names, [ent, bt, LN2], color=["#393", "#48a", "#aaa"])
    for y, value in enumerate([ent, bt, LN2]):
        ax.text(value + 0.005, y, f"{value:.3f}", va="center", fontsize=8)
    ax.set_xlim(0, max(LN2, ent, bt) * 1.15)
    ax.invert_yaxis()
    ax.set_xlabel("mean log-loss, nats per judgment")
    ax.set_title("Loss floors")
    return _png(fig)


# --- page --------------------------------------------------------------------------------------


def _esc(value) -> str:
    return html.escape(str(value))


def _table(header: list[str], rows: list[list]) -> str:
    head = "".join(f"<th>{_esc(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{_cell(c)}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _cell(value) -> str:
    """A list renders as one line per entry."""
    return "<br>".join(map(_esc, value)) if isinstance(value, list) else _esc(value)


def _num(value, digits: int = 3) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def _ci(pair) -> str:
    return "n/a" if not pair or pair[0] is None else f"[{pair[0]:.3f}, {pair[1]:.3f}]"


def _figure(png: bytes | None, alt: str, missing: str) -> str:
    return f"<figure>{figure_tag(png, alt)}</figure>" if png else f"<p><em>{_esc(missing)}</em></p>"


def _length_section(lb: dict) -> str:
    by_rater = lb.get("by_rater") or {}
    shown = {r: v for r, v in by_rater.items() if v.get("n", 0) >= MIN_ROWS_SHOWN}
    rows = [[name, _num(v.get("p_longer_wins")), _ci(v.get("p_longer_wins_ci95")), v.get("n"),
             _num(v.get("slope")), _ci(v.get("slope_ci95"))]
            for name, v in [*(lb.get("by_kind") or {}).items(), *shown.items()]]
    hidden = len(by_rater) - len(shown)
    note = (f"<p>{hidden} rater(s) with fewer than {MIN_ROWS_SHOWN} decided verdicts on pairs of "
            "different length are left out of this table (they are in the JSON).</p>") if hidden else ""
    header = ["group", "p_longer_wins", "95% CI", "n", "slope", "95% CI"]
    overall = [["all", _num(lb.get("p_longer_wins")), _ci(lb.get("p_longer_wins_ci95")), lb.get("n"),
                _num(lb.get("slope")), _ci(lb.get("slope_ci95"))]]
    sources = ""
    if lb.get("sources"):
        sources = "<h3>Win rate per source, raw and length-controlled</h3>" + _table(
            ["source", "win rate", "length-controlled", "n"],
            [[s, _num(v["win_rate"]), _num(v["lc_win_rate"]), v["n"]] for s, v in lb["sources"].items()])
    return (f'<section id="length-bias"><h2>Length bias</h2>'
            f"<p>Slope: logistic coefficient on {_esc(lb.get('feature', ''))}.</p>"
            f"{_figure(plot_length_curve(lb['curve']), 'win rate against length difference', 'no decided verdicts')}"
            f"{_table(header, overall + rows)}{note}{sources}</section>")


def _agreement_section(ag: dict) -> str:
    per_rater = ag.get("per_rater") or {}
    raters = _busiest(per_rater)
    stats = [["pairwise agreement, with ties", _num(ag.get("pairwise_with_ties"))],
             ["pairwise agreement, without ties", _num(ag.get("pairwise_without_ties"))],
             ["Krippendorff's alpha (nominal)", _num(ag.get("krippendorff_alpha"))],
             ["Fleiss' kappa", _num((ag.get("fleiss_kappa") or {}).get("kappa"))],
             ["items with 2+ verdicts", ag.get("n_items_multi")]]
    for rater, v in sorted((ag.get("human_ai") or {}).items()):
        stats.append([f"humans vs {rater} (with / without ties, n)",
                      f"{_num(v.get('with_ties'))} / {_num(v.get('without_ties'))}, {v.get('n')}"])
    for rater, v in sorted((ag.get("position_consistency") or {}).items()):
        stats.append([f"position consistency of {rater} (n)", f"{_num(v.get('consistency'))} ({v.get('n')})"])
    return (f'<section id="agreement"><h2>Rater agreement</h2>{_table(["statistic", "value"], stats)}'
            f"{_overlap_note(ag.get('cohen_kappa') or [], raters)}"
            f"{_figure(plot_agreement_matrix(ag.get('cohen_kappa') or [], raters), 'agreement matrix of raters', 'no two raters share enough items for a kappa')}"
            f"{_figure(plot_per_rater(per_rater, raters), 'per-rater agreement', 'no rater shares an item with another')}"
            "</section>")


def _overlap_note(kappas: list, raters: list[str]) -> str:
    """Says why the agreement matrix is mostly blank when few pairs of raters judged the same items
    (MT-Bench's experts each judged a few dozen comparisons, rarely the same ones)."""
    shown = set(raters)
    pairs = len(shown) * (len(shown) - 1) // 2
    filled = sum(1 for k in kappas if k.get("kappa") is not None
                 and k.get("rater_1") in shown and k.get("rater_2") in shown)
    if pairs < 2 or filled >= pairs / 2:
        return ""
    return (f"<p class=\"note\"><em>Only {filled} of the {pairs} pairs of raters shown judged enough of the "
            "same items for a kappa, so most cells of the matrix are blank: few raters overlap. "
            "The per-rater agreement with the majority below does not need overlap.</em></p>")


def _cycles_section(cy: dict) -> str:
    stats = [[k, cy.get(k)] for k in ("n_triads", "n_cyclic_triads", "n_prompts_with_cycles")]
    rows = []
    for cycle in cy.get("worst_cycles") or []:
        texts = cycle.get("response_texts") or cycle.get("responses") or []
        steps = [f"[{i + 1}] {t}" for i, t in enumerate(texts)]
        shares = " → ".join(f"{s:.0%}" for s in cycle.get("shares") or [])
        rows.append([cycle.get("prompt_text") or cycle.get("prompt_id"), steps,
                     f"{shares} ({sum(cycle.get('n_votes') or [])} votes)"])
    worst = _table(["prompt", "responses: [1] beats [2] beats [3] beats [1]",
                    "majority shares 1>2, 2>3, 3>1"], rows) if rows else "<p>No majority cycle.</p>"
    return (f'<section id="cycles"><h2>Condorcet cycles</h2>{_table(["count", "value"], stats)}'
            f"<h3>Worst cycles</h3>{worst}</section>")


def _floor_value(value) -> str:
    """A floor, gap or p-value as shown; one the data cannot give (null in the JSON) says so.

    >>> _floor_value(0.12345), _floor_value(None)
    ('0.1235', 'n/a (not computed for these data: see the note below)')
    """
    if value is None:
        return "n/a (not computed for these data: see the note below)"
    return _num(value, 4) if isinstance(value, float) else str(value)


def _floors_section(cy: dict) -> str:
    # Every floor, gap and test the cycles analysis gives, in its order (it may add corrections).
    rows = [[k, _floor_value(v)] for k, v in cy.items()
            if any(word in k for word in ("floor", "gap", "p_value")) and not isinstance(v, (list, dict))]
    note = cy.get("correction", "")
    return (f'<section id="floors"><h2>Loss floors</h2>'
            f"{_figure(plot_floors(cy), 'loss floors beside ln 2', 'floors unavailable')}"
            f"{_table(['floor (nats per judgment)', 'value'], rows)}<p>{_esc(note)}</p></section>")


def render(report: dict) -> str:
    vd = report["verdict"]
    flags = vd.get("problem") or [False] * len(vd["findings"])
    findings = "".join(f"<li><strong>Problem:</strong> {_esc(t)}</li>" if bad else f"<li>{_esc(t)}</li>"
                       for t, bad in zip(vd["findings"], flags, strict=True))
    klass = "verdict ok" if vd["problems"] == 0 else "verdict"
    return (
        f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>bradley report</title>'
        f"<style>{STYLE}</style></head><body><h1>Preference data report</h1>"
        f'<p class="meta">snapshot {_esc(report["snapshot_id"])} · {report["n_judgments"]:,} judgments · '
        f'{report["n_prompts"]:,} prompts · {report["n_raters"]} raters ({_esc(report["raters"])})</p>'
        f'<section id="verdict" class="{klass}"><h2>{_esc(vd["headline"])}</h2><ul>{findings}</ul></section>'
        f"{_length_section(report['length_bias'])}{_agreement_section(report['agreement'])}"
        f"{_cycles_section(report['cycles'])}{_floors_section(report['cycles'])}</body></html>")
