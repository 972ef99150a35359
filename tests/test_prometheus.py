"""GET /metrics: who may scrape it, and that what it says parses and adds up."""

from __future__ import annotations

import psycopg
import pytest
from django.contrib.auth.models import User
from django.test import Client
from prometheus_client.parser import text_string_to_metric_families

from task_queue import metrics, operations
from task_queue.listen import connection_params
from task_queue.models import Task, TaskStatus
from tests.support.api import token
from tests.support.history import at, seed_history

pytestmark = pytest.mark.django_db(transaction=True)


def scrape(client: Client, **headers: str) -> dict[tuple[str, tuple], float]:
    response = client.get("/metrics", **headers)
    assert response.status_code == 200, response.content
    assert response["Content-Type"].startswith("text/plain; version=")
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(response.content.decode())
        for sample in family.samples
    }


def echo(name: str, **labels: str) -> tuple[str, tuple]:
    return name, tuple(sorted({"agent": "EchoAgent", **labels}.items()))


def test_metrics_need_a_token_a_staff_session_or_an_allowed_network(settings):
    anonymous = Client()
    assert anonymous.get("/metrics").status_code == 401
    assert anonymous.post("/metrics").status_code == 405
    assert scrape(anonymous, HTTP_AUTHORIZATION=f"Bearer {token('read')}")
    staff = Client()
    staff.force_login(User.objects.create_user("ops", password="pw", is_staff=True))
    assert scrape(staff)
    settings.METRICS_ALLOWED_NETWORKS = ["127.0.0.0/8"]  # the test client's address
    assert scrape(anonymous)
    settings.METRICS_ALLOWED_NETWORKS = ["10.0.0.0/8", "not a network"]
    assert anonymous.get("/metrics").status_code == 401
    from django.core.management import call_command
    from django.core.management.base import SystemCheckError

    with pytest.raises(SystemCheckError, match="'not a network' is not a network"):
        call_command("check")


def test_counters_and_histograms_add_rollups_and_what_came_after():
    """seed_history: EchoAgent created 4 tasks; 2 completed, 1 failed, 1 died, 1 was
    retried; 5 attempts ran 1, 2, 3, 4 and 4 s and waited 1, 1, 3, 5 and 10 s.

    The figures stay the same before any rollup, after each rollup pass (minutes,
    hours and days catching up at different speeds) and after a revive."""
    seed_history()
    client = Client()
    auth = {"HTTP_AUTHORIZATION": f"Bearer {token('read')}"}
    scrapes = [scrape(client, **auth)]  # nothing rolled up: all from the source
    while metrics.roll_up(now=at(26 * 3600)):  # each pass: at most MAX_SPAN per width
        scrapes.append(scrape(client, **auth))
    assert len(scrapes) > 3
    failed = Task.objects.get(status=TaskStatus.FAILED)
    operations.revive([failed.id], actor="user:ops")
    scrapes.append(scrape(client, **auth))

    for found in scrapes:
        assert found[echo("automechanica_tasks_created_total")] == 4
        assert found[echo("automechanica_tasks_completed_total")] == 2
        assert found[echo("automechanica_tasks_failed_total")] == 1
        assert found[echo("automechanica_tasks_dead_total")] == 1
        assert found[echo("automechanica_tasks_retried_total")] == 1
        assert found[echo("automechanica_task_run_seconds_count")] == 5
        assert found[echo("automechanica_task_run_seconds_sum")] == pytest.approx(14)
        assert found[echo("automechanica_task_run_seconds_bucket", le="2.5")] == 2
        assert found[echo("automechanica_task_run_seconds_bucket", le="5.0")] == 5
        assert found[echo("automechanica_task_queue_wait_seconds_count")] == 5
        assert found[echo("automechanica_task_queue_wait_seconds_sum")] == pytest.approx(20)
        assert found[echo("automechanica_task_queue_wait_seconds_bucket", le="5.0")] == 4
        assert found[echo("automechanica_task_queue_wait_seconds_bucket", le="10.0")] == 5
        assert found[echo("automechanica_tasks", status="completed")] == 2
        assert found[echo("automechanica_workers_alive")] == 0  # heartbeats of 2026-11-20
    assert scrapes[0][echo("automechanica_tasks", status="dead")] == 1
    assert scrapes[-1][echo("automechanica_tasks", status="pending")] == 1  # the revived


def test_an_open_transaction_that_holds_back_cleanup_shows_its_age():
    """A REPEATABLE READ transaction keeps its snapshot: the gauge counts from its start.
    (An autoanalyze of a test table may show up for a few milliseconds: the bounds
    leave room for it.)"""
    client, auth = Client(), {"HTTP_AUTHORIZATION": f"Bearer {token('read')}"}
    name = ("automechanica_oldest_horizon_transaction_age_seconds", ())
    with psycopg.connect(**connection_params()) as holder:
        holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        holder.execute("SELECT pg_sleep(0.3), count(*) FROM tasks").fetchone()
        age = scrape(client, **auth)[name]
        elapsed = "SELECT EXTRACT(EPOCH FROM clock_timestamp() - now())::float8"
        (open_for,) = holder.execute(elapsed).fetchone()
        assert 0.3 <= age <= open_for
        holder.rollback()
    assert scrape(client, **auth)[name] < 0.3
