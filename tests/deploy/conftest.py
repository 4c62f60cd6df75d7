"""Shared helpers of the deploy checks: where the files are, which metric names the service exports,
which names a PromQL expression reads, and the Prometheus tools (Debian's `prometheus` package;
`.ci/run` installs it when missing). A missing tool fails these tests rather than skipping them, so
the checks cannot pass by not running."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
RULES = DEPLOY / "prometheus" / "rules.yml"
# series Prometheus itself adds to every scrape target
PROMETHEUS_SERIES = {"up", "scrape_duration_seconds", "scrape_samples_scraped"}
SUFFIXES = {"counter": ("_total", "_created"), "histogram": ("_bucket", "_sum", "_count", "_created"),
            "gauge": ("",), "info": ("_info",), "summary": ("", "_sum", "_count", "_created")}
PROMQL_WORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or",
                "unless", "offset", "inf", "nan",
                # aggregations, which may stand before `by (...)` rather than their `(`
                "sum", "min", "max", "avg", "group", "stddev", "stdvar", "count", "count_values",
                "bottomk", "topk", "quantile"}


def tool(name: str) -> str:
    """Path of a Prometheus binary; fails (never skips) with the fix when it is missing."""
    found = shutil.which(name)
    if found is None:
        pytest.fail(f"{name} not found: apt-get install prometheus (Debian's package carries "
                    "prometheus and promtool; `make test` installs it, .ci/system-tools)")
    return found


def exported_names() -> set[str]:
    """Every series name a bradley /metrics body can contain, from a fresh app's registry (names of
    labelled series exist before their first observation, so they come from the family type)."""
    from service.api.metrics import Metrics

    names = set()
    for family in Metrics().registry.collect():
        names |= {family.name + suffix for suffix in SUFFIXES[family.type]}
    return names


def recording_rules(path: Path = RULES) -> set[str]:
    doc = yaml.safe_load(path.read_text())
    return {r["record"] for g in doc["groups"] for r in g["rules"] if "record" in r}


def metric_names(expr: str) -> set[str]:
    """Metric names a PromQL expression reads: identifiers that are not functions, keywords, label
    names in matchers or grouping clauses, or durations.

    >>> sorted(metric_names('histogram_quantile(0.99, sum by (le, route) '
    ...                     '(rate(bradley_request_seconds_bucket{route="/score"}[5m])))'))
    ['bradley_request_seconds_bucket']
    >>> sorted(metric_names('a_total / on (job) group_left b offset 5m > bool 1'))
    ['a_total', 'b']
    >>> sorted(metric_names('sum by (job) (rate(x_total[1m])) / count without (i) (up)'))
    ['up', 'x_total']
    """
    expr = re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'', '""', expr)   # strings
    expr = re.sub(r"\{[^}]*\}|\[[^\]]*\]", " ", expr)                       # matchers, ranges
    expr = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", r"\1", expr)
    found = re.finditer(r"(?<![\w:.])([A-Za-z_:][\w:]*)(\s*\()?", expr)
    return {m.group(1) for m in found if not m.group(2) and m.group(1).lower() not in PROMQL_WORDS}
