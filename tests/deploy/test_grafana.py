"""Every Grafana panel queries something real: each query parses as PromQL (promtool checks it as a
recording rule) and every metric it names is exported by the service or recorded by rules.yml."""

from __future__ import annotations

import json
import subprocess

import yaml

from tests.deploy.conftest import (
    DEPLOY,
    PROMETHEUS_SERIES,
    exported_names,
    metric_names,
    recording_rules,
    tool,
)

DASHBOARDS = sorted((DEPLOY / "grafana" / "dashboards").glob("*.json"))
GRAFANA_VARIABLES = {"$__rate_interval": "5m", "$__interval": "1m", "$__range": "1h"}


def panel_queries() -> list[tuple[str, str]]:
    """(dashboard: panel title, expr) for every target of every panel, rows included."""
    queries = []
    for path in DASHBOARDS:
        panels = list(json.loads(path.read_text())["panels"])
        while panels:
            panel = panels.pop()
            panels.extend(panel.get("panels", []))
            for target in panel.get("targets", []):
                expr = target["expr"]
                for variable, value in GRAFANA_VARIABLES.items():
                    expr = expr.replace(variable, value)
                queries.append((f"{path.name}: {panel.get('title')}", expr))
    return queries


def test_there_are_dashboards_with_queries():
    assert DASHBOARDS and len(panel_queries()) >= 8


def test_every_panel_names_only_exported_metrics():
    known = exported_names() | recording_rules() | PROMETHEUS_SERIES
    for where, expr in panel_queries():
        names = metric_names(expr)
        assert names, f"{where}: {expr!r} reads no metric"
        assert names <= known, f"{where}: {expr!r} names {sorted(names - known)}, which bradley " \
                               "does not export"


def test_every_panel_query_parses(tmp_path):
    rules = [{"record": f"panel:query_{i}", "expr": expr} for i, (_, expr) in enumerate(panel_queries())]
    path = tmp_path / "panels.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "panels", "rules": rules}]}))
    done = subprocess.run([tool("promtool"), "check", "rules", str(path)], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
