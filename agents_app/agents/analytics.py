"""AnalyticsAgent: writes the daily report of the queue (``agents_app.analytics``)."""

from __future__ import annotations

from datetime import date
from typing import Any

from task_queue.agent import Agent, InvalidPayload, TaskContext
from task_queue.registry import register

from ..analytics import build_daily_report, yesterday
from ..models import DailyReport


@register
class AnalyticsAgent(Agent):
    """Payload: ``{"day": "YYYY-MM-DD"}`` (a UTC day), or ``{}`` for yesterday (what the
    daily schedule sends). Running it again for a day replaces that day's report, so a
    retried or repeated run is harmless."""

    name = "AnalyticsAgent"
    task_types = ("daily_report",)
    description = "Reads a day of queue metrics and writes the daily report."
    timeout = 600.0

    def handle(self, task: TaskContext) -> dict[str, Any]:
        day = _day(task.payload)
        report = build_daily_report(day)
        DailyReport.objects.update_or_create(
            day=day,
            defaults={"report": report, "partial": report["partial"], "task_id": task.id},
        )
        return {
            "day": day.isoformat(),
            "partial": report["partial"],
            "totals": report["totals"],
            "anomalies": [anomaly["message"] for anomaly in report["anomalies"]],
        }

    def describe(self, task: TaskContext, result: dict[str, Any]) -> str:
        anomalies = "; ".join(result["anomalies"]) or "no anomalies"
        return f"Daily report for {result['day']}: {result['totals']}; {anomalies}."


def _day(payload: dict[str, Any]) -> date:
    if "day" not in payload:
        return yesterday()
    value = payload["day"]
    if isinstance(value, str):
        try:
            return date.fromisoformat(value)
        except ValueError:
            pass
    raise InvalidPayload("day", "must be a date as YYYY-MM-DD")
