"""The daily report the AnalyticsAgent writes: one UTC day of the queue, per agent,
read from the metric rollups (``task_queue_metrics``).

A day that has not been rolled up yet (today, or a day the rollups never reached)
is computed from the source tables by the same SQL, and marked partial when the day
is not over. Comparisons use the day rollups of the seven days before.
"""

from __future__ import annotations

from datetime import UTC, date, datetime, time, timedelta
from typing import Any

from task_queue import metrics
from task_queue.models import TaskHistory, TaskQueueMetric
from task_queue.sql import db
from task_queue.sql import metrics as metrics_sql

DAY, HOUR = metrics.DAY, metrics.HOUR
TOP_ERRORS = 5
EXAMPLES_PER_ERROR = 3
# An anomaly needs this many finished tasks that day, so one failure of two is not one.
MIN_FINISHED_FOR_RATES = 5
MIN_BACKLOG_GROWTH = 10
COUNTS = ("created", "completed", "failed", "dead", "retried", "cancelled")


def day_bounds(day: date) -> tuple[datetime, datetime]:
    start = datetime.combine(day, time(), tzinfo=UTC)
    return start, start + timedelta(days=1)


def build_daily_report(day: date, *, now: datetime | None = None) -> dict[str, Any]:
    """The report of ``day`` as JSON-ready data (see ``_agent_report`` for its parts)."""
    clock = now or db.database_clock()
    start, end = day_bounds(day)
    partial = clock < end
    today = _day_rows(start, min(end, clock))
    history = {
        (row.agent_name, row.bucket_start.date()): row
        for row in TaskQueueMetric.objects.filter(
            bucket_seconds=DAY, bucket_start__gte=start - timedelta(days=7), bucket_start__lt=start
        )
    }
    agents = sorted(set(today) | {agent for agent, _ in history})
    per_agent = [
        _agent_report(agent, day, today.get(agent), history, start, end, partial)
        for agent in agents
    ]
    return {
        "day": day.isoformat(),
        "partial": partial,
        "generated_at": clock.isoformat(),
        "totals": {name: sum(a["volume"][name] for a in per_agent) for name in COUNTS},
        "agents": per_agent,
        "hours": _hours(start, min(end, clock)),
        "anomalies": [anomaly for a in per_agent for anomaly in a["anomalies"]],
    }


def _day_rows(start: datetime, until: datetime) -> dict[str, dict[str, Any]]:
    """The day's rollup per agent: stored if the day is rolled up, else computed."""
    stored = TaskQueueMetric.objects.filter(bucket_seconds=DAY, bucket_start=start)
    rolled = (metrics_sql.rollup_progress(DAY) or start) >= start + timedelta(days=1)
    if rolled:
        return {row.agent_name: _as_dict(row) for row in stored}
    rows = metrics_sql.compute_metrics(DAY, start, until)
    return {row["agent_name"]: row for row in rows}


def _hours(start: datetime, until: datetime) -> list[dict[str, Any]]:
    """Completed and failed (or dead) tasks per hour of the day, all agents."""
    if (metrics_sql.rollup_progress(HOUR) or start) >= until:  # all in the hour rollups
        rows = [
            _as_dict(row)
            for row in TaskQueueMetric.objects.filter(
                bucket_seconds=HOUR, bucket_start__gte=start, bucket_start__lt=until
            )
        ]
    else:
        rows = metrics_sql.compute_metrics(HOUR, start, until)
    by_hour = {h: [0, 0] for h in range(24)}
    for row in rows:
        figures = by_hour[row["bucket_start"].astimezone(UTC).hour]
        figures[0] += row["tasks_completed"]
        figures[1] += row["tasks_failed"] + row["tasks_dead"]
    return [{"hour": h, "completed": c, "failed": f} for h, (c, f) in by_hour.items()]


def _agent_report(
    agent: str,
    day: date,
    row: dict[str, Any] | None,
    history: dict[tuple[str, date], TaskQueueMetric],
    start: datetime,
    end: datetime,
    partial: bool,
) -> dict[str, Any]:
    volume = {name: (row or {}).get(f"tasks_{name}", 0) for name in COUNTS}
    rates = _rates(volume)
    previous = history.get((agent, day - timedelta(days=1)))
    week = [history.get((agent, day - timedelta(days=n))) for n in range(1, 8)]
    week_volume = {name: sum(getattr(r, f"tasks_{name}") for r in week if r) / 7 for name in COUNTS}
    week_rates = _rates(week_volume)
    report = {
        "agent": agent,
        "volume": volume,
        "rates": rates,
        "latency": {
            "queue_wait_p50": (row or {}).get("queue_wait_p50"),
            "queue_wait_p95": (row or {}).get("queue_wait_p95"),
            "run_time_p50": (row or {}).get("run_time_p50"),
            "run_time_p95": (row or {}).get("run_time_p95"),
        },
        "errors": _top_errors(agent, (row or {}).get("error_rates_per_agent") or {}, start, end),
        "previous_day": {
            "completed": previous.tasks_completed if previous else 0,
            "failure_rate": _rates(_volume_of(previous))["failure"] if previous else None,
        },
        "seven_day_average": {"completed": week_volume["completed"], **_prefixed(week_rates)},
    }
    report["change"] = {
        "completed_vs_previous_day": volume["completed"] - report["previous_day"]["completed"],
        "completed_vs_seven_day_average": volume["completed"] - week_volume["completed"],
    }
    report["anomalies"] = _anomalies(agent, volume, rates, week_rates, week_volume, partial)
    return report


def _volume_of(row: TaskQueueMetric) -> dict[str, int]:
    return {name: getattr(row, f"tasks_{name}") for name in COUNTS}


def _rates(volume: dict[str, float]) -> dict[str, float | None]:
    """Shares of the tasks that ended: completed, failed for good, dead."""
    ended = volume["completed"] + volume["failed"] + volume["dead"]
    if not ended:
        return {"success": None, "failure": None, "dead": None}
    return {
        "success": volume["completed"] / ended,
        "failure": (volume["failed"] + volume["dead"]) / ended,
        "dead": volume["dead"] / ended,
    }


def _prefixed(rates: dict[str, float | None]) -> dict[str, float | None]:
    return {f"{name}_rate": value for name, value in rates.items()}


def _top_errors(
    agent: str, by_class: dict[str, dict[str, Any]], start: datetime, end: datetime
) -> list[dict[str, Any]]:
    top = sorted(by_class.items(), key=lambda item: (-item[1]["count"], item[0]))[:TOP_ERRORS]
    return [
        {
            "error_class": error_class,
            "count": figures["count"],
            "share_of_attempts": figures["rate"],
            "example_tasks": [
                str(task_id)
                for task_id in TaskHistory.objects.filter(
                    task__agent_name=agent,
                    error__type=error_class,
                    occurred_at__gte=start,
                    occurred_at__lt=end,
                )
                .order_by("occurred_at")
                .values_list("task_id", flat=True)
                .distinct()[:EXAMPLES_PER_ERROR]
            ],
        }
        for error_class, figures in top
    ]


def _anomalies(
    agent: str,
    volume: dict[str, int],
    rates: dict[str, float | None],
    week_rates: dict[str, float | None],
    week_volume: dict[str, float],
    partial: bool,
) -> list[dict[str, Any]]:
    found = []
    ended = volume["completed"] + volume["failed"] + volume["dead"]
    failure, usual = rates["failure"], week_rates["failure"] or 0.0
    if ended >= MIN_FINISHED_FOR_RATES and failure and failure > 2 * usual:
        found.append({
            "agent": agent,
            "kind": "failure_rate",
            "message": f"{agent}: failure rate {failure:.0%}, over twice its 7-day average "
            f"({usual:.0%})",
        })  # fmt: skip
    growth = volume["created"] - ended - volume["cancelled"]
    if growth >= MIN_BACKLOG_GROWTH and growth > 0.1 * volume["created"]:
        found.append({
            "agent": agent,
            "kind": "backlog",
            "message": f"{agent}: backlog grew by {growth} (created {volume['created']}, "
            f"finished {ended + volume['cancelled']})",
        })  # fmt: skip
    if (
        not partial
        and week_volume["completed"] >= MIN_FINISHED_FOR_RATES
        and (volume["completed"] < 0.5 * week_volume["completed"])
    ):
        found.append({
            "agent": agent,
            "kind": "volume_drop",
            "message": f"{agent}: {volume['completed']} completed, under half its 7-day "
            f"average ({week_volume['completed']:.1f})",
        })  # fmt: skip
    return found


def _as_dict(row: TaskQueueMetric) -> dict[str, Any]:
    return {field.name: getattr(row, field.name) for field in TaskQueueMetric._meta.fields}


def yesterday(now: datetime | None = None) -> date:
    """The UTC day before ``now`` (the database's clock by default)."""
    clock = now or db.database_clock()
    return clock.astimezone(UTC).date() - timedelta(days=1)


def ready_to_report(payload: dict[str, Any], now: datetime) -> bool:
    """The schedule guard (``task_queue.schedules.firing``) of the daily report: a
    report of yesterday (no ``day`` in the payload) waits until yesterday's day
    rollup exists, so it reads the stored rollup rather than the source tables."""
    if "day" in payload:
        return True
    today_start, _ = day_bounds(now.astimezone(UTC).date())
    return (metrics_sql.rollup_progress(DAY) or today_start - timedelta(days=1)) >= today_start
