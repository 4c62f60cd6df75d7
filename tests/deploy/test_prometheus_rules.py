"""The Prometheus files are checked by Prometheus's own tool: `promtool check config` (the config and
the rule files it names), `check rules`, and `test rules` (deploy/prometheus/rules_test.yml: each
alert fires on a series past its threshold, stays quiet below it, and each recording rule gives a
hand-computed value). Every name the rules read is one the service exports."""

from __future__ import annotations

import subprocess

import yaml

from tests.deploy.conftest import (
    DEPLOY,
    PROMETHEUS_SERIES,
    RULES,
    exported_names,
    metric_names,
    recording_rules,
    tool,
)

PROM = DEPLOY / "prometheus"


def promtool(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([tool("promtool"), *args], cwd=PROM, capture_output=True, text=True,
                          timeout=120)


def test_promtool_check_config_and_its_rule_files():
    done = promtool("check", "config", "prometheus.yml")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "rules.yml" in done.stdout + done.stderr   # the rule file was found and checked too


def test_promtool_check_rules():
    done = promtool("check", "rules", "rules.yml")
    assert done.returncode == 0, done.stdout + done.stderr


def test_promtool_unit_tests_of_every_alert():
    done = promtool("test", "rules", "rules_test.yml")
    assert done.returncode == 0 and "SUCCESS" in done.stdout, done.stdout + done.stderr


def test_every_alert_has_a_firing_unit_test():
    alerts = {r["alert"] for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]
              if "alert" in r}
    fired = {t["alertname"] for case in yaml.safe_load((PROM / "rules_test.yml").read_text())["tests"]
             for t in case.get("alert_rule_test", []) if t.get("exp_alerts")}
    assert alerts >= {"BradleyHighErrorRatio", "BradleyScoreLatencyHigh", "BradleyQueueSaturated",
                      "BradleyRewardLengthCorrelationHigh", "BradleyIngestRejectsSpiking",
                      "BradleyModelNotReady"}
    assert alerts == fired, f"alerts without a firing unit test: {sorted(alerts - fired)}"


def test_rules_read_only_exported_metrics():
    known = exported_names() | recording_rules() | PROMETHEUS_SERIES
    for group in yaml.safe_load(RULES.read_text())["groups"]:
        for rule in group["rules"]:
            names = metric_names(rule["expr"])
            assert names, f"{rule}: reads no metric"
            unknown = names - known
            assert not unknown, f"{rule.get('record') or rule.get('alert')}: unknown {sorted(unknown)}"
