"""`bradley report`: everything that says whether preference data can be trusted, in one place.

The only analysis module that opens the store. It freezes a snapshot (so the report can be traced to
the exact judgments it read), runs the three analyses (length_bias, agreement, cycles) on it in
memory that does not grow with the store (analysis/store_analyses.py: counting in DuckDB, per-prompt
work in blocks) and adds a plain-language verdict. Outputs: a JSON dict
(`build_report`), a terminal summary (`summary_text`), one self-contained HTML page (`render_html`)
and threshold checks for pipelines (`check_fail_on`: `bradley report --fail-on` exits 3).

    >>> rules = parse_rules("length_bias>0.65, alpha<0.2")
    >>> rules[0]
    ('length_bias', 'length_bias.p_longer_wins', '>', 0.65)
    >>> check_fail_on({"length_bias": {"p_longer_wins": 0.7}, "agreement": {"krippendorff_alpha": 0.5}},
    ...               "length_bias>0.65,alpha<0.2")
    ['length_bias = 0.7 > 0.65 (length_bias.p_longer_wins)']
"""

from __future__ import annotations

import json
import math
import operator
import re
import sys
from contextlib import nullcontext
from pathlib import Path

EXIT_FAIL_ON = 3
# DuckDB's share of a report's memory unless --memory-limit says otherwise: it spills to disk beyond
# it, and the Python side works on blocks of prompts, so a laptop's report stays about this big.
DEFAULT_MEMORY_LIMIT = "512MB"
LN2 = math.log(2)
TEXT_CHARS = 160  # texts quoted in the report are cut to this many characters

# Short names for --fail-on; any dotted path into the report works too (e.g. cycles.entropy_floor).
RULE_ALIASES = {
    "length_bias": "length_bias.p_longer_wins",
    "p_longer_wins": "length_bias.p_longer_wins",
    "slope": "length_bias.slope",
    "alpha": "agreement.krippendorff_alpha",
    "agreement": "agreement.pairwise_with_ties",
    "agreement_without_ties": "agreement.pairwise_without_ties",
    "gap": "cycles.gap",
    "entropy_floor": "cycles.entropy_floor",
    "bt_floor": "cycles.bt_floor",
    "cyclic_triads": "cycles.n_cyclic_triads",
}
COMPARISONS = {">": operator.gt, ">=": operator.ge, "<": operator.lt, "<=": operator.le}
RULE = re.compile(r"^\s*([A-Za-z_][\w.:-]*)\s*(>=|<=|>|<)\s*([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)\s*$")


class ReportError(ValueError):
    """The report cannot be built as asked; the message says what to change."""


# --- building -----------------------------------------------------------------------------------


def build_report(store, raters: str | None = None, snapshot_id: str | None = None,
                 memory_limit: str | None = None, progress: bool = False,
                 timings: dict | None = None) -> dict:
    """The JSON report of what the store holds (restricted to `raters`: human, ai or an id prefix).

    Without `snapshot_id` a new snapshot is recorded first, so the report names the exact data it
    read. `memory_limit` (e.g. "1GB") caps DuckDB's memory for the report (left as it is when
    None); `progress` shows a bar on a terminal; `timings`, when given, receives the seconds of
    each phase (bench/report.py).
    """
    from analysis import store_analyses  # numpy, pandas and scipy: not on `bradley --help`'s path

    # every read under the limit (a bad one fails first): DuckDB keeps what it scans up to it
    with store.memory_limit(memory_limit) if memory_limit else nullcontext():
        if snapshot_id is None:  # a run that finds nothing records no snapshot
            snapshot_id = store.create_snapshot(raters, if_any=True)
        analyses = store_analyses.analyze(store, snapshot_id, progress, timings) if snapshot_id else None
        if analyses is None:
            where = f"in snapshot {snapshot_id} " if snapshot_id else ""
            raise ReportError(f"no judgments {where}(raters={raters or 'all'}); "
                              "ingest some with `bradley ingest FILE` or widen --raters")
        report = {
            "snapshot_id": snapshot_id,
            "raters": raters or "all",
            "n_judgments": analyses.pop("n_judgments"),
            "n_prompts": analyses.pop("n_prompts"),
            "n_raters": analyses.pop("n_raters"),
            # same text on both sides: kept in the store, left out of every statistic (and of pairs)
            "n_self_comparisons": store.self_comparisons(snapshot_id),
            **analyses,
        }
        _quote_cycles(store, report["cycles"].get("worst_cycles") or [])
    report["verdict"] = verdict(report)
    return report


def _quote_cycles(store, cycles: list) -> None:
    """Add shortened texts to the worst cycles: `prompt_text` and `response_texts` (in cycle order)."""
    ids = set()
    for cycle in cycles:
        ids.add(cycle.get("prompt_id"))
        ids.update(cycle.get("responses") or ())
    texts = store.texts(sorted(i for i in ids if i))
    for cycle in cycles:
        cycle["prompt_text"] = shorten(texts.get(cycle.get("prompt_id"), ""))
        cycle["response_texts"] = [shorten(texts.get(r, "")) for r in cycle.get("responses") or ()]


def shorten(text: str, limit: int = TEXT_CHARS) -> str:
    """One line, at most `limit` characters, cut at a word boundary.

    >>> shorten("a  quick\\nbrown fox jumps", 14)
    'a quick brown…'
    """
    text = " ".join(str(text).split())
    if len(text) <= limit:
        return text
    cut = text[:limit - 1]
    if text[limit - 1] != " ":  # mid-word: drop the partial word
        cut = cut.rsplit(" ", 1)[0]
    return cut + "…"


# --- the plain-language verdict --------------------------------------------------------------------


def _alpha_words(alpha: float) -> str:
    """Krippendorff's own reading: ≥ 0.8 reliable, ≥ 0.667 tentative, below that doubtful."""
    if alpha >= 0.8:
        return "reliable"
    if alpha >= 0.667:
        return "good enough for tentative conclusions"
    if alpha >= 0.2:
        return "low: raters often disagree"
    return "very low: close to chance"


def _length_findings(lb: dict) -> list[tuple[str, bool]]:
    p, (low, high) = lb.get("p_longer_wins"), lb.get("p_longer_wins_ci95") or (0.0, 1.0)
    if p is None:
        return [("No pair of different length was decided, so length bias is unknown.", False)]
    share = f"the longer answer wins {p:.0%} of decided comparisons (95% CI {low:.0%}–{high:.0%})"
    if low > 0.5:
        return [(f"Raters favour length: {share}." if p > 0.6 else f"A mild preference for length: {share}.",
                 p > 0.6)]
    if high < 0.5:
        return [(f"Raters favour the shorter answer: {share}." if p < 0.4
                 else f"A mild preference for the shorter answer: {share}.", p < 0.4)]
    return [(f"No clear length bias: {share}.", False)]


def _agreement_findings(ag: dict) -> list[tuple[str, bool]]:
    """Krippendorff's α below 0.667 (his bound for tentative conclusions) is a problem, and so is
    each group of flagged raters: one finding each, so the headline counts what the list shows."""
    alpha = ag.get("krippendorff_alpha")
    flagged = ag.get("flagged_raters") or []
    if alpha is None:
        out = [("Agreement is unknown: no item was judged by two raters.", False)]
    else:
        out = [(f"Agreement between raters is {_alpha_words(alpha)} (Krippendorff α = {alpha:.2f}).",
                alpha < 0.667)]
    if flagged:
        names = ", ".join(flagged[:5]) + (" …" if len(flagged) > 5 else "")
        out.append((f"{len(flagged)} rater(s) agree with the majority far less than the rest: {names}.",
                    True))
    return out


def _corrected_gap(cy: dict) -> tuple:
    """The best small-sample correction of the gap the cycles analysis gives, its p-value and name."""
    for gap, p_value, how in (("gap_bootstrap_corrected", "gap_bootstrap_p_value",
                               "subtracting its mean under a transitive bootstrap"),
                              ("gap_corrected", "transitivity_p_value", "the asymptotic correction")):
        if cy.get(gap) is not None:
            return cy[gap], cy.get(p_value), how
    return None, None, ""


def _cycles_findings(cy: dict) -> list[tuple[str, bool]]:
    ent, bt, gap = cy.get("entropy_floor"), cy.get("bt_floor"), cy.get("gap")
    if ent is None or bt is None:
        return [("Loss floors are unknown.", False)]
    text = (f"No model can reach a loss below {ent:.3f} nats per judgment on these verdicts, and no "
            f"single-score reward model below {bt:.3f} (a coin flip is ln 2 = {LN2:.3f})")
    n_tri, n_cyc = cy.get("n_triads") or 0, cy.get("n_cyclic_triads") or 0
    if n_cyc:
        text += f"; {n_cyc} of {n_tri} compared triads are majority cycles, costing {gap:.3f} nats"
    else:
        text += f"; no majority cycle among {n_tri} compared triads (gap {gap:.3f} nats)"
    corrected, p_value, how = _corrected_gap(cy)
    if corrected is not None:
        text += f"; the gap is {max(corrected, 0.0):.3f} after {how}"
        if p_value is not None:
            text += f" (transitivity test p = {p_value:.2g})"
    per_item = (cy.get("n_judgments") or 0) / max(cy.get("n_items") or 1, 1)
    if per_item < 1.5:
        text += (f"; with {per_item:.1f} votes per item these in-sample floors say little: "
                 "collect several verdicts per pair")
    text += "."
    # Plug-in floors are biased low on few votes per item: judge the gap by its corrected value
    # and the likelihood-ratio test when the cycles analysis provides them.
    real_gap = (corrected if corrected is not None else gap or 0) > 0.05 and (p_value or 0) < 0.05
    return [(text, ent > LN2 - 0.05 or real_gap)]


def _self_comparison_findings(report: dict) -> list[tuple[str, bool]]:
    n = report.get("n_self_comparisons") or 0
    if not n:
        return []
    return [(f"{n:,} judgment(s) compare a response with itself (the same text on both sides); they "
             "are kept in the store but left out of every figure here and of the pairs.", False)]


def verdict(report: dict) -> dict:
    """A headline and the findings behind it, one per problem (`problem[i]` says whether finding i
    is one), so the headline counts exactly the problems the list shows."""
    from analysis import hidden_bias

    parts = [*_length_findings(report["length_bias"]), *hidden_bias.findings(report["length_bias"]),
             *_agreement_findings(report["agreement"]), *_cycles_findings(report["cycles"]),
             *_self_comparison_findings(report)]
    problems = sum(bad for _, bad in parts)
    headline = {0: "Looks usable for training.", 1: "Usable with care: one problem to look at."}.get(
        problems, f"Fix the data first: {problems} problems.")
    return {"headline": headline, "findings": [text for text, _ in parts],
            "problem": [bad for _, bad in parts], "problems": problems}


# --- --fail-on ---------------------------------------------------------------------------------


def parse_rules(rules: str) -> list[tuple[str, str, str, float]]:
    """'name>number,...' as (name, report path, comparison, threshold); ValueError on bad syntax."""
    parsed = []
    for rule in filter(None, (r.strip() for r in rules.split(","))):
        match = RULE.match(rule)
        if not match:
            raise ReportError(f"--fail-on: cannot read {rule!r}; write NAME>NUMBER or NAME<NUMBER, "
                              f"NAME one of {', '.join(RULE_ALIASES)} or a dotted path into the JSON")
        name, op, number = match.groups()
        parsed.append((name, RULE_ALIASES.get(name, name), op, float(number)))
    if not parsed:
        raise ReportError("--fail-on: no rule given; e.g. 'length_bias>0.65,alpha<0.2,gap>0.05'")
    return parsed


def lookup(report: dict, path: str):
    """The value at a dotted path; ReportError when the path names nothing in the report."""
    value = report
    for key in path.split("."):
        if not isinstance(value, dict) or key not in value:
            raise ReportError(f"--fail-on: the report has no {path!r}; use one of "
                              f"{', '.join(RULE_ALIASES)} or a dotted path such as cycles.gap")
        value = value[key]
    return value


def check_fail_on(report: dict, rules: str) -> list[str]:
    """The crossed rules, human readable; a metric that could not be computed (None) crosses nothing."""
    crossed = []
    for name, path, op, threshold in parse_rules(rules):
        value = lookup(report, path)
        if value is not None and COMPARISONS[op](float(value), threshold):
            shown = f"{value:.4g}" if isinstance(value, float) else str(value)
            crossed.append(f"{name} = {shown} {op} {threshold:g} ({path})")
    return crossed


# --- terminal summary --------------------------------------------------------------------------


def _fmt(value, digits: int = 3) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def _flags(vd: dict) -> list[bool]:
    return vd.get("problem") or [False] * len(vd["findings"])  # reports saved before the flags


def summary_text(report: dict) -> str:
    """A few lines for the terminal."""
    lb, ag, cy, vd = report["length_bias"], report["agreement"], report["cycles"], report["verdict"]
    low, high = lb.get("p_longer_wins_ci95") or (None, None)
    slope_ci = lb.get("slope_ci95") or (None, None)
    lines = [
        f"bradley report · snapshot {report['snapshot_id']} · {report['n_judgments']:,} judgments, "
        f"{report['n_prompts']:,} prompts, {report['n_raters']} raters ({report['raters']})",
        f"verdict: {vd['headline']}",
        *(f"  {'✗' if bad else '-'} {text}" for text, bad in zip(vd["findings"], _flags(vd), strict=True)),
        f"length bias   p_longer_wins {_fmt(lb.get('p_longer_wins'))} [{_fmt(low)}, {_fmt(high)}] "
        f"n={lb.get('n', 0):,}; slope {_fmt(lb.get('slope'))} [{_fmt(slope_ci[0])}, "
        f"{_fmt(slope_ci[1])}]",
        f"agreement     pairwise {_fmt(ag.get('pairwise_with_ties'))} with ties, "
        f"{_fmt(ag.get('pairwise_without_ties'))} without; Krippendorff alpha "
        f"{_fmt(ag.get('krippendorff_alpha'))}; flagged: {', '.join(ag.get('flagged_raters') or []) or 'none'}",
        f"cycles        {cy.get('n_cyclic_triads', 0):,} cyclic of {cy.get('n_triads', 0):,} triads; "
        f"entropy floor {_fmt(cy.get('entropy_floor'))}, BT floor {_fmt(cy.get('bt_floor'))}, "
        f"gap {_fmt(cy.get('gap'), 4)} nats (ln 2 = {LN2:.3f})",
    ]
    for rater, values in sorted((ag.get("human_ai") or {}).items()):
        lines.append(f"human vs {rater}: {_fmt(values.get('with_ties'))} with ties, "
                     f"{_fmt(values.get('without_ties'))} without (n={values.get('n', 0)})")
    return "\n".join(lines)


# --- the CLI's body ----------------------------------------------------------------------------


def render_html(report: dict) -> str:
    """One self-contained HTML page (plots inlined); see analysis/report_html.py."""
    from analysis import report_html

    return report_html.render(report)


def _write_text(path: str | Path, text: str) -> None:
    """`-` or a stream as it is, through a symlink, atomically for a regular file (annotation/outputs.py)."""
    from annotation.outputs import write_output

    write_output(path, lambda fh: fh.write(text.encode("utf-8")))


def run(db, raters=None, snapshot_id=None, html=None, json_out=None, fail_on=None,
        memory_limit: str = DEFAULT_MEMORY_LIMIT) -> int:
    """Build the report, write what was asked, print the summary; 3 when a --fail-on rule is crossed."""
    from annotation.store import Store

    if fail_on is not None:
        parse_rules(fail_on)  # bad rules fail before any work
    if str(db) != ":memory:" and not Path(db).exists():
        raise ReportError(f"no store at {db}; ingest data first (`bradley --db {db} ingest FILE`)")
    with Store(db) as store:
        report = build_report(store, raters=raters, snapshot_id=snapshot_id,
                              memory_limit=memory_limit, progress=True)
    return finish(report, lambda: render_html(report), html, json_out, fail_on)


def finish(report: dict, page, html=None, json_out=None, fail_on=None) -> int:
    """Write what was asked (`page()` renders the HTML), print the summary; 3 when a --fail-on rule
    is crossed. `bradley --server URL report` calls it with the server's report and page."""
    crossed = check_fail_on(report, fail_on) if fail_on else []
    if json_out:
        _write_text(json_out, json.dumps(report, indent=1, default=str))
    if html:
        _write_text(html, page())
    from annotation.outputs import is_stdout

    to_stdout = any(out and is_stdout(out) for out in (json_out, html))  # keep that stream clean
    print(summary_text(report), flush=True, file=sys.stderr if to_stdout else sys.stdout)
    for line in crossed:
        print(f"fail-on: {line}", flush=True, file=sys.stderr if to_stdout else sys.stdout)
    return EXIT_FAIL_ON if crossed else 0
