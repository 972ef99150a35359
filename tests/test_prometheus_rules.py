"""deploy/prometheus/alerts.yml: Prometheus's alerting rules on the exported metrics
are valid, and each fires on the series that should fire it and on no other
(``promtool test rules`` with deploy/prometheus/alerts_test.yml). The metric names
they use are the ones GET /metrics exports."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from task_queue import prometheus

RULES = Path(__file__).resolve().parent.parent / "deploy" / "prometheus"
PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None, reason="promtool is not installed (Debian: apt-get install prometheus)"
)


def promtool(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([PROMTOOL, *args], cwd=RULES, capture_output=True, text=True, timeout=120)


@needs_promtool
def test_promtool_checks_the_rules():
    checked = promtool("check", "rules", "alerts.yml")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "SUCCESS: 7 rules found" in checked.stdout


@needs_promtool
def test_each_alert_fires_on_its_series_and_no_other():
    tested = promtool("test", "rules", "alerts_test.yml")
    assert tested.returncode == 0, tested.stdout + tested.stderr


@pytest.mark.django_db
def test_the_rules_use_only_metrics_that_are_exported():
    """Every automechanica_ metric the rules read is in a scrape (a renamed metric
    would leave its alert silent for ever)."""
    scrape = prometheus.exposition().decode()
    exported = {line.split("{")[0].split()[0] for line in scrape.splitlines() if line[:1] != "#"}
    used = set(re.findall(r"\bautomechanica_\w+", (RULES / "alerts.yml").read_text()))
    assert used and used <= exported, used - exported
