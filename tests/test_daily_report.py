"""The AnalyticsAgent's daily report: its numbers against a seeded history, the
anomalies it flags, the agent in a real worker process, the daily schedule that
asks for it and the report pages."""

from __future__ import annotations

import csv
import io
import json
from datetime import date, timedelta

import pytest
from django.test import Client

from agents_app.analytics import build_daily_report
from agents_app.models import AgentEvent, DailyReport
from task_queue import metrics, operations
from task_queue.models import RollupProgress, Schedule, Task, TaskQueueMetric, TaskStatus
from task_queue.schedules import firing as schedule_firing
from task_queue.sql import db
from tests.support.history import T0, at, seed_day_and_week, seed_history, seed_week
from tests.support.processes import run_manage
from tests.support.users import staff

pytestmark = pytest.mark.django_db(transaction=True)

DAY = T0.date()  # 2026-11-20
DAY_START = metrics.bucket_floor(T0, metrics.DAY)


def echo(report: dict) -> dict:
    (agent,) = [a for a in report["agents"] if a["agent"] == "EchoAgent"]
    return agent


def test_the_report_matches_the_seeded_history_and_flags_anomalies():
    seed_day_and_week()
    report = build_daily_report(DAY, now=at(26 * 3600))
    agent = echo(report)
    assert report["partial"] is False
    assert agent["volume"] == {"created": 5, "completed": 3, "failed": 1, "dead": 1,
                               "retried": 1, "cancelled": 0}  # fmt: skip
    assert agent["rates"] == pytest.approx({"success": 0.6, "failure": 0.4, "dead": 0.2})
    day_row = TaskQueueMetric.objects.get(
        bucket_seconds=metrics.DAY, agent_name="EchoAgent", bucket_start=DAY_START
    )
    assert agent["latency"]["run_time_p95"] == pytest.approx(day_row.run_time_p95)
    assert agent["latency"]["queue_wait_p50"] == pytest.approx(day_row.queue_wait_p50)
    errors = {e["error_class"]: e for e in agent["errors"]}
    assert set(errors) == {"Boom", "Timeout", "ValueError"}
    failed = Task.objects.get(status=TaskStatus.FAILED)
    assert errors["ValueError"]["example_tasks"] == [str(failed.id)]
    assert errors["ValueError"]["count"] == 1
    assert agent["previous_day"]["completed"] == 20
    assert agent["change"]["completed_vs_previous_day"] == 3 - 20
    assert agent["seven_day_average"]["completed"] == pytest.approx(20)
    assert agent["seven_day_average"]["failure_rate"] == 0
    assert {a["kind"] for a in report["anomalies"]} == {"failure_rate", "volume_drop"}
    assert report["totals"]["completed"] == 3
    hours = {h["hour"]: (h["completed"], h["failed"]) for h in report["hours"]}
    assert hours[10] == (3, 2) and sum(c + f for c, f in hours.values()) == 5


def test_an_ordinary_day_flags_nothing():
    seed_day_and_week()
    TaskQueueMetric.objects.filter(bucket_seconds=metrics.DAY, bucket_start__lt=T0).update(
        tasks_completed=3, tasks_failed=1, tasks_dead=1
    )
    assert build_daily_report(DAY, now=at(26 * 3600))["anomalies"] == []


def test_today_is_computed_on_demand_and_partial():
    seed_history()  # nothing rolled up
    seed_week()  # 20 a day: 2 completed so far would be a drop, were the day over
    report = build_daily_report(DAY, now=at(120))
    assert report["partial"] is True
    assert echo(report)["volume"]["completed"] == 2
    assert not [a for a in report["anomalies"] if a["kind"] == "volume_drop"]


def test_the_agent_writes_the_report_in_a_worker_process():
    seed_day_and_week()
    task = operations.enqueue("AnalyticsAgent", "daily_report", {"day": DAY.isoformat()})
    worker = run_manage("runworker", "AnalyticsAgent", "--burst")
    assert worker.returncode == 0, worker.stderr
    assert Task.objects.get(id=task.id).status == TaskStatus.COMPLETED
    row = DailyReport.objects.get(day=DAY)
    assert row.task_id == task.id and row.partial is False
    assert echo(row.report)["volume"]["completed"] == 3
    event = AgentEvent.objects.get(task_id=task.id)
    assert "failure rate 40%" in event.content


def test_a_bad_day_fails_the_task_for_good():
    task = operations.enqueue("AnalyticsAgent", "daily_report", {"day": "yesterday"})
    run_manage("runworker", "AnalyticsAgent", "--burst", check=True)
    failed = Task.objects.get(id=task.id)
    assert failed.status == TaskStatus.FAILED and failed.error_info["type"] == "InvalidPayload"


@pytest.mark.slow
def test_the_daily_schedule_asks_for_yesterday_once_it_is_rolled_up():
    """The report is a schedule declared in settings; its guard holds the midnight
    slot until yesterday is rolled up (exactly once per slot: tests/test_schedules.py)."""
    schedule_firing.sync_declared()
    schedule = Schedule.objects.get(name=REPORT_SCHEDULE)
    assert (schedule.source, schedule.cron, schedule.payload) == ("code", "0 0 * * *", {})
    now = db.database_clock()
    midnight = metrics.bucket_floor(now, metrics.DAY)
    Schedule.objects.filter(id=schedule.id).update(next_run_at=midnight)  # the slot came
    assert schedule_firing.fire_due(now=now) == 0  # yesterday not rolled up yet
    assert Schedule.objects.get(id=schedule.id).next_run_at == midnight  # still due
    RollupProgress.objects.create(bucket_seconds=metrics.DAY, computed_until=midnight)
    assert schedule_firing.fire_due(now=now) == 1
    assert schedule_firing.fire_due(now=now) == 0
    (task,) = Task.objects.filter(agent_name="AnalyticsAgent")
    assert task.payload == {}
    assert task.idempotency_key == f"schedule:{REPORT_SCHEDULE}:{midnight.isoformat()}"
    assert Schedule.objects.get(id=schedule.id).next_run_at == midnight + timedelta(days=1)
    run_manage("runworker", "AnalyticsAgent", "--burst", check=True)
    yesterday = (midnight - timedelta(days=1)).date()
    assert DailyReport.objects.get(day=yesterday).task_id == task.id


REPORT_SCHEDULE = "analytics daily report"


def test_the_report_pages_and_downloads():
    seed_day_and_week()
    report = build_daily_report(DAY, now=at(26 * 3600))
    DailyReport.objects.create(day=DAY, report=report, partial=False)
    viewer = staff()
    listing = viewer.get("/reports/daily/").content.decode()
    assert 'data-day="2026-11-20"' in listing and "data-run-report" not in listing
    page = viewer.get("/reports/daily/2026-11-20/").content.decode()
    assert 'data-anomaly="failure_rate"' in page and 'data-anomaly="volume_drop"' in page
    assert page.count("data-example-task") == 3
    assert viewer.get("/reports/daily/2026-11-20/report.json").json() == json.loads(
        json.dumps(report)
    )
    rows = list(csv.DictReader(io.StringIO(
        viewer.get("/reports/daily/2026-11-20/report.csv").content.decode()
    )))  # fmt: skip
    (echo_row,) = [r for r in rows if r["agent"] == "EchoAgent"]
    assert echo_row["completed"] == "3" and echo_row["failure_rate"] == "0.4"
    assert viewer.get("/reports/daily/2026-11-21/").status_code == 200  # none yet
    assert viewer.get("/reports/daily/not-a-day/").status_code == 404
    assert viewer.get("/reports/daily/2026-11-21/report.json").status_code == 404
    assert Client().get("/reports/daily/").status_code == 302  # to the login


def test_running_the_report_on_demand_needs_its_permission():
    viewer, runner = staff(), staff("agents_app.run_daily_report")
    today = date.today().isoformat()
    assert viewer.post("/reports/daily/run/", {"day": today}).status_code == 403
    assert not Task.objects.exists()
    assert runner.post("/reports/daily/run/", {"day": "soon"}).status_code == 400
    response = runner.post("/reports/daily/run/", {"day": today})
    assert response.status_code == 302 and response["Location"] == f"/reports/daily/{today}/"
    (task,) = Task.objects.all()
    assert (task.agent_name, task.payload) == ("AnalyticsAgent", {"day": today})
    assert "data-run-report disabled" in runner.get(f"/reports/daily/{today}/").content.decode()
