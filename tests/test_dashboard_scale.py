"""The commands that measure the dashboard at scale."""

from __future__ import annotations

import io
import json

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from automechanica.dashboard import overview
from task_queue.models import Task, TaskStatus

pytestmark = pytest.mark.django_db


def test_seed_tasks_makes_the_asked_shares():
    call_command("seed_tasks", count=20_000, pending=0.1, dead=0.05, failed=0.05,
                 cancelled=0, stdout=io.StringIO())  # fmt: skip
    seeded = Task.objects.filter(task_type__startswith="seed:")
    assert seeded.count() == 20_000
    for status, share in [("pending", 0.1), ("dead", 0.05), ("failed", 0.05)]:
        assert abs(seeded.filter(status=status).count() - share * 20_000) < 600, status
    assert not seeded.filter(status="cancelled").exists()
    assert seeded.filter(status="dead", error_info__type__isnull=False).exists()
    with pytest.raises(CommandError, match="each share"):
        call_command("seed_tasks", count=10, dead=0.9, failed=0.9, stdout=io.StringIO())


def test_seed_tasks_says_how_many_rows_it_writes_and_where():
    from django.db import connection

    out = io.StringIO()
    call_command("seed_tasks", count=300, stdout=out)
    first = out.getvalue().splitlines()[0]
    name = connection.settings_dict["NAME"]
    assert first.startswith(f"inserting 300 synthetic tasks into database {name!r} at ")
    assert "event_outbox" in first
    assert Task.objects.count() == 300


def test_seed_tasks_refuses_a_database_without_its_tables():
    from django.db import connection

    with connection.cursor() as cursor:  # rolled back with the test's transaction
        cursor.execute("ALTER TABLE tasks RENAME TO tasks_elsewhere")
    with pytest.raises(CommandError, match=r"has no tasks table: run `manage.py migrate` first"):
        call_command("seed_tasks", count=10, stdout=io.StringIO())


def test_the_overview_counts_a_seeded_table_exactly():
    call_command("seed_tasks", count=20_000, stdout=io.StringIO())
    snapshot = overview.take_snapshot()
    for status in TaskStatus.values:
        assert snapshot.totals[status] == Task.objects.filter(status=status).count(), status


def test_dashboard_bench_reports_each_page():
    call_command("seed_tasks", count=2_000, stdout=io.StringIO())
    out = io.StringIO()
    call_command("dashboard_bench", repeat=2, json=True, stdout=out)
    report = json.loads(out.getvalue())
    assert set(report["milliseconds"]) >= {
        "overview /",
        "dead letter /dead-letter/",
        "live snapshot (once a second)",
        "GET /api/v1/tasks",
        "GET /api/v1/agents",
        "GET /api/v1/metrics",
        "Prometheus /metrics",
    }
    assert report["tasks"] == 2_000
    assert all(figures["p50"] > 0 for figures in report["milliseconds"].values())


def test_dashboard_bench_times_only_the_reads_asked_for():
    call_command("seed_tasks", count=500, stdout=io.StringIO())
    out = io.StringIO()
    call_command("dashboard_bench", repeat=1, json=True, only="payload", stdout=out)
    names = set(json.loads(out.getvalue())["milliseconds"])
    assert "dead letter, payload filter, all match" in names
    assert "GET /api/v1/dead-letter, payload text + agent + status" in names
    assert all("payload" in name for name in names)
