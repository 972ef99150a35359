"""GET /metrics: who may scrape it, and that what it says parses and adds up."""

from __future__ import annotations

import math

import psycopg
import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.test import Client
from prometheus_client.parser import text_string_to_metric_families

from task_queue import metrics, operations, registry
from task_queue.models import HISTOGRAM_BOUNDS, Task, TaskStatus
from task_queue.sql import counts, db
from task_queue.sql.connections import connection_params
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


def test_counters_and_histograms_equal_the_hand_worked_history():
    """seed_history: EchoAgent created 4 tasks; 2 completed, 1 failed, 1 died, 1 was
    retried; 5 attempts ran 1, 2, 3, 4 and 4 s and waited 1, 1, 3, 5 and 10 s.

    The figures stay the same after a revive (a history row that counts as nothing)."""
    seed_history()
    client = Client()
    auth = {"HTTP_AUTHORIZATION": f"Bearer {token('read')}"}
    scrapes = [scrape(client, **auth)]
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
    quiet = sorted(set(registry.names()) - {"EchoAgent"})
    assert quiet  # every registered agent has its series, at zero until it counts
    for agent in quiet:
        assert scrapes[0][("automechanica_tasks_created_total", (("agent", agent),))] == 0
        count = ("automechanica_task_run_seconds_count", (("agent", agent),))
        assert scrapes[0][count] == 0
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


def test_the_databases_histogram_slots_have_the_bounds_the_exposition_labels():
    """task_histogram_slot (migration queue 0029) sorts values into the slots that
    HISTOGRAM_BOUNDS labels: a value equal to a bound is in that bound's slot."""
    slot_of = "SELECT task_histogram_slot(%s::float8)"
    for slot, bound in enumerate(HISTOGRAM_BOUNDS):
        assert db.fetch(slot_of, [float(bound)]) == [(slot,)]
        assert db.fetch(slot_of, [math.nextafter(float(bound), math.inf)]) == [(slot + 1,)]
    last = len(HISTOGRAM_BOUNDS)
    for value, slot in [(0.0, 0), (-1.0, 0), (-math.inf, 0), (1e9, last), (math.inf, last)]:
        assert db.fetch(slot_of, [value]) == [(slot,)], value
    assert db.fetch(slot_of, [None]) == [(None,)]


# (event, from, to, started at, due at, occurred at; seconds) → what the row adds:
# (outcome or None, run time or None, queue wait or None). The rules of the metric
# rollups, which Prometheus's counters share (migration queue 0029).
HISTORY_RULES = [
    (("completed", "running", "completed", 10, 4, 12), ("completed", 2, 6)),
    (("failed", "running", "failed", 10, 10, 13), ("failed", 3, 0)),
    (("dead", "running", "dead", 10, 9, 11.5), ("dead", 1.5, 1)),
    (("retry_scheduled", "running", "pending", 10, 12, 20), ("retried", 10, None)),
    (("lease_expired", "running", "pending", 10, 8, 70), ("retried", 60, 2)),
    (("lease_expired", "leased", "pending", None, None, 70), ("retried", None, None)),
    (("lease_expired", "running", "dead", 10, 10, 40), ("dead", 30, 0)),
    (("lease_expired", "running", "cancelled", 10, 10, 40), ("cancelled", 30, 0)),
    (("cancelled", "pending", "cancelled", None, None, 5), ("cancelled", None, None)),
    (("cancelled", "running", "cancelled", 10, 10, 15), ("cancelled", 5, 0)),
    (("released", "running", "pending", 10, 10, 15), (None, None, 0)),
    (("revived", "dead", "pending", None, None, 5), (None, None, None)),
    (("cancel_requested", "running", "running", None, None, 5), (None, None, None)),
    (("updated", "pending", "pending", None, None, 5), (None, None, None)),
]


@pytest.mark.parametrize(("row", "adds"), HISTORY_RULES, ids=lambda r: "-".join(map(str, r)))
def test_each_kind_of_history_row_adds_what_the_rules_say(row, adds):
    event, from_status, to_status, started, due, occurred = row
    task_id = operations.enqueue("EchoAgent", "echo", {}).id
    clock = {"started": started, "due": due, "occurred": occurred}
    db.execute(
        "INSERT INTO task_history (task_id, event, from_status, to_status, attempt,"
        " started_at, due_at, occurred_at) VALUES (%(task)s, %(event)s, %(from)s, %(to)s, 1,"
        + ", ".join(f"%({name})s::timestamptz" for name in clock)
        + ")",
        {"task": task_id, "event": event, "from": from_status, "to": to_status}
        | {name: None if s is None else at(s) for name, s in clock.items()},
    )
    outcome, run, wait = adds
    expected = {("created", 0): (1, 0.0)}
    if outcome:
        expected[(outcome, 0)] = (1, 0.0)
    for measure, value in (("run_time", run), ("queue_wait", wait)):
        if value is not None:
            slot = sum(1 for bound in HISTOGRAM_BOUNDS if bound < value)
            expected[(measure, slot)] = (1, pytest.approx(value))
    found = {(measure, slot): (n, total) for _, measure, slot, n, total in counts.task_totals()}
    assert found == expected


@pytest.mark.slow  # each pass migrates back past queue 0029 and forward again
def test_the_counters_start_where_the_rollups_and_their_tail_stood():
    """Migration queue 0029 fills the counters from the stored rollups plus what came
    after them: whatever the rollups had reached, a scrape after the migration shows
    what one before it showed (none drops, none doubles)."""
    seed_history()
    client, auth = Client(), {"HTTP_AUTHORIZATION": f"Bearer {token('read')}"}
    expected = scrape(client, **auth)
    counters = {key: value for key, value in expected.items() if "_total" in key[0]}
    assert counters[echo("automechanica_tasks_created_total")] == 4
    passes = 0
    try:
        while True:
            call_command("migrate", "queue", "0028", verbosity=0)
            call_command("migrate", "queue", "0029", verbosity=0)
            found = scrape(client, **auth)
            assert {key: found[key] for key in counters} == counters, passes
            for key, value in expected.items():
                if key[0].startswith(("automechanica_task_run", "automechanica_task_queue")):
                    assert found[key] == value, (passes, key)
            if passes == 0:
                metrics.ensure_started(at(0))  # rollups started, none computed yet
            elif not metrics.roll_up(now=at(26 * 3600)):
                break
            passes += 1
    finally:
        call_command("migrate", verbosity=0)
    assert passes > 3
