"""deploy/prometheus-alerts.yml: valid YAML, complete rules, only metrics that /metrics exports;
with promtool (Debian's prometheus package), checked and unit-tested."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from starlette.testclient import TestClient

yaml = pytest.importorskip("yaml", reason="PyYAML is not installed (a dev dependency)")

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy" / "prometheus-alerts.yml"
RULE_TESTS = Path(__file__).with_name("alerts_test.yml")
SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum"), "gauge": ("",)}


def rules() -> list[dict[str, Any]]:
    doc = yaml.safe_load(RULES.read_text(encoding="utf-8"))
    return [rule for group in doc["groups"] for rule in group["rules"]]


def test_rules_are_complete() -> None:
    found = rules()
    assert len(found) >= 8
    names = [r["alert"] for r in found]
    assert len(set(names)) == len(names)
    for rule in found:
        assert rule["expr"].strip(), rule["alert"]
        assert rule["labels"]["severity"] in ("warning", "critical"), rule["alert"]
        assert rule["annotations"]["summary"] and rule["annotations"]["description"]
    covered = " ".join(r["expr"] for r in found)
    for metric in (
        "turnaround_seconds",
        "deadline_misses",
        "deliveries_failing",
        "deliveries_refused",
        "engine_fallbacks",
        "spool_free_bytes",
        "associations_refused",
    ):
        assert f"imaging_ai_{metric}" in covered, metric


def test_every_metric_in_the_rules_is_exported(engine: Any, client: TestClient) -> None:
    exported = set()
    for family in text_string_to_metric_families(client.get("/metrics").text):
        exported |= {family.name + suffix for suffix in SUFFIXES.get(family.type, ("",))}
    used = {m for r in rules() for m in re.findall(r"\bimaging_ai_[a-z0-9_]+", r["expr"])}
    assert used and used <= exported, used - exported


PROMTOOL = shutil.which("promtool")


@pytest.mark.skipif(PROMTOOL is None, reason="promtool missing (apt-get install prometheus)")
def test_promtool_checks_and_unit_tests_the_rules() -> None:
    assert PROMTOOL is not None
    check = subprocess.run([PROMTOOL, "check", "rules", str(RULES)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    unit = subprocess.run(
        [PROMTOOL, "test", "rules", RULE_TESTS.name],
        cwd=RULE_TESTS.parent,
        capture_output=True,
        text=True,
    )
    assert unit.returncode == 0, unit.stdout + unit.stderr
