"""The maintenance loop runs what the apps registered, in order, each on its own
schedule (no database: the jobs here are stand-ins)."""

from __future__ import annotations

import pytest
from django.core.management import CommandError, call_command
from django.db import DatabaseError

from task_queue import maintenance


def test_the_registered_jobs_run_leases_first_then_retention_then_blob_collection():
    names = [job.name for job in maintenance.registered()]
    assert names == [
        "reaper",
        "message leases",
        "delivery leases",
        "workflow escalation",  # after the reaper, whose dead tasks count
        "metric rollups",
        "schedules",  # after the rollups, which the daily report's guard reads
        "alert rules",
        "alert deliveries",
        "task counters",
        "retention",
        "blob collection",  # after retention, which drops references
    ]


def test_a_schedule_runs_a_periodic_job_once_per_period(monkeypatch):
    ran = []
    monkeypatch.setattr(maintenance, "_jobs", {})
    maintenance.register("every pass", lambda: ran.append("every") or "said", order=2)
    maintenance.register(
        "hourly", lambda: ran.append("hourly") or None, every_seconds=3600, order=1
    )
    schedule = maintenance.Schedule()
    assert schedule.run_due_jobs() == ["said"]
    assert schedule.run_due_jobs() == ["said"]
    assert ran == ["hourly", "every", "every"]
    # A new loop (a second `runmaintenance --once`) has a schedule of its own.
    maintenance.Schedule().run_due_jobs()
    assert ran == ["hourly", "every", "every", "hourly", "every"]


def test_a_job_that_fails_is_due_again_at_the_next_pass(monkeypatch):
    calls = []

    def flaky() -> None:
        calls.append("flaky")
        if len(calls) == 1:
            raise DatabaseError("database went away")

    monkeypatch.setattr(maintenance, "_jobs", {})
    maintenance.register("flaky", flaky, every_seconds=3600)
    schedule = maintenance.Schedule()
    with pytest.raises(DatabaseError):  # the loop reconnects
        schedule.run_due_jobs()
    schedule.run_due_jobs()
    assert calls == ["flaky", "flaky"]


def test_a_job_with_a_bug_does_not_stop_the_others(monkeypatch, caplog):
    calls = []

    def broken() -> None:
        calls.append("broken")
        raise ZeroDivisionError("division by zero")

    monkeypatch.setattr(maintenance, "_jobs", {})
    maintenance.register("broken", broken, order=1)
    maintenance.register("after", lambda: calls.append("after") or "said", order=2)
    schedule = maintenance.Schedule()
    assert schedule.run_due_jobs() == ["said"]
    assert schedule.run_due_jobs() == ["said"]
    assert calls == ["broken", "after", "broken", "after"]
    assert "maintenance job 'broken' failed" in caplog.text


def test_a_worker_whose_heartbeats_the_reaper_would_outwait_is_refused(settings):
    settings.QUEUE_STALE_WORKER_SECONDS = 90
    with pytest.raises(CommandError, match="QUEUE_STALE_WORKER_SECONDS"):
        call_command("runworker", "EchoAgent", "--lease", "300")
