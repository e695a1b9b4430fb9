"""The shipped alerts: a valid PrometheusRule over the engine's own series,
proven by ``promtool check rules`` and ``promtool test rules``.

promtool comes from Debian's ``prometheus`` package. The promtool tests run
whenever it is on PATH; without it they skip, except under ``CI=true``,
where they fail: CI must never pass without having run them.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from service_engine.metrics import DEPENDENCIES, RESET_CAUSES

ROOT = Path(__file__).resolve().parents[1]
RULE = ROOT / "observability" / "service-engine-alerts.yaml"
UNIT_TESTS = sorted((ROOT / "observability" / "tests").glob("*.yaml"))
METRICS = ROOT / "service_engine" / "metrics.py"
RULES_FILE = "service-engine-rules.yaml"
"""The plain rules file the unit tests name in ``rule_files``."""

FIVE = {
    "ServiceEngineNotificationQueueFilling",
    "ServiceEngineNotifyBudgetNearCeiling",
    "ServiceEngineSustainedResetRate",
    "ServiceEngineOutboxBacklogAging",
    "ServiceEngineDeadLettersWaiting",
}


def _promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        message = "promtool is not installed (apt-get install -y prometheus)"
        if os.environ.get("CI") == "true":
            pytest.fail(message + "; under CI=true the alert tests must run")
        pytest.skip(message)
    return found


def _resource() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(RULE.read_text())
    return loaded


def _rules(resource: dict[str, Any]) -> list[dict[str, Any]]:
    return [rule for group in resource["spec"]["groups"] for rule in group["rules"]]


def extract_rules(resource: dict[str, Any], *, annotations: bool = True) -> dict[str, Any]:
    """The PrometheusRule's ``spec`` as a plain Prometheus rules file.

    Without ``annotations`` every rule's annotations are dropped: promtool's
    unit tests compare annotations exactly, and the runbooks are prose
    checked on their own (`test_every_alert_carries_a_runbook`).
    """
    groups = []
    for group in resource["spec"]["groups"]:
        rules = []
        for rule in group["rules"]:
            kept = dict(rule)
            if not annotations:
                kept.pop("annotations", None)
            rules.append(kept)
        groups.append({**group, "rules": rules})
    return {"groups": groups}


def _run(*args: str | Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(a) for a in args], cwd=cwd, capture_output=True, text=True, timeout=60, check=False
    )


def test_the_rule_is_a_prometheus_rule_with_the_five_alerts() -> None:
    """The alerts file is a named PrometheusRule holding exactly the five alerts."""
    resource = _resource()
    assert resource["apiVersion"] == "monitoring.coreos.com/v1"
    assert resource["kind"] == "PrometheusRule"
    assert resource["metadata"]["name"]
    assert {r["alert"] for r in _rules(resource)} == FIVE


def test_every_alert_carries_a_runbook() -> None:
    """Every alert has a summary, a runbook saying what it means and what to do, a severity and a
    for duration."""
    for rule in _rules(_resource()):
        annotations = rule["annotations"]
        assert annotations["summary"], rule["alert"]
        runbook = annotations["runbook"]
        assert "What it means:" in runbook and "What to do:" in runbook, rule["alert"]
        assert rule["labels"]["severity"] in {"warning", "critical"}, rule["alert"]
        assert rule["for"], rule["alert"]


def test_alerts_read_only_series_the_engine_exposes() -> None:
    """Every ``service_engine_*`` name in an expression is declared in metrics.py
    (a counter's ``_total``, a histogram's ``_seconds_bucket`` added by the
    exporter); every expression keeps the service label."""
    source = METRICS.read_text()
    declared = set(re.findall(r'"(service_engine_[a-z_]+)"', source))
    exposed = set(declared)
    for name in declared:
        exposed |= {name + "_total", name + "_seconds", name + "_seconds_bucket"}
    for rule in _rules(_resource()):
        used = set(re.findall(r"service_engine_[a-z_]+", rule["expr"]))
        assert used, rule["alert"]
        assert used <= exposed, (rule["alert"], used - exposed)
    assert "mirrors" in DEPENDENCIES and "postgres" in DEPENDENCIES
    assert set(RESET_CAUSES) == {"overflow", "reconnect", "threshold"}


def test_promtool_checks_the_rules(tmp_path: Path) -> None:
    """promtool check rules accepts the extracted rules, all five."""
    promtool = _promtool()
    rules = tmp_path / RULES_FILE
    rules.write_text(yaml.safe_dump(extract_rules(_resource()), sort_keys=False))
    checked = _run(promtool, "check", "rules", rules, cwd=tmp_path)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "SUCCESS: 5 rules found" in checked.stdout + checked.stderr


def test_promtool_unit_tests_fire_each_alert_and_stay_silent_when_healthy(tmp_path: Path) -> None:
    """promtool's unit tests pass, and each of the five alerts fires in at least one of them."""
    promtool = _promtool()
    assert UNIT_TESTS, "no promtool unit tests in observability/tests/"
    (tmp_path / RULES_FILE).write_text(
        yaml.safe_dump(extract_rules(_resource(), annotations=False), sort_keys=False)
    )
    fired: set[str] = set()
    for source in UNIT_TESTS:
        spec = yaml.safe_load(source.read_text())
        assert spec["rule_files"] == [RULES_FILE], source.name
        for case in spec["tests"]:
            for check in case.get("alert_rule_test", []):
                if check["exp_alerts"]:
                    fired.add(check["alertname"])
        shutil.copy(source, tmp_path / source.name)
        tested = _run(promtool, "test", "rules", source.name, cwd=tmp_path)
        assert tested.returncode == 0, tested.stdout + tested.stderr
    assert fired == FIVE, "every alert has a unit test in which it fires"


def test_promtool_unit_tests_fail_when_an_alert_is_broken(tmp_path: Path) -> None:
    """The harness can fail: a rule whose threshold no longer fires on the
    firing series makes ``promtool test rules`` fail."""
    promtool = _promtool()
    broken = extract_rules(_resource(), annotations=False)
    for group in broken["groups"]:
        for rule in group["rules"]:
            if rule["alert"] == "ServiceEngineOutboxBacklogAging":
                rule["expr"] = rule["expr"].replace("> 300", "> 100000")
    (tmp_path / RULES_FILE).write_text(yaml.safe_dump(broken, sort_keys=False))
    for source in UNIT_TESTS:
        shutil.copy(source, tmp_path / source.name)
    tested = _run(promtool, "test", "rules", *(s.name for s in UNIT_TESTS), cwd=tmp_path)
    assert tested.returncode != 0
    assert "ServiceEngineOutboxBacklogAging" in tested.stdout + tested.stderr
