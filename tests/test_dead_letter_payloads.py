"""The dead letter's own table of payload text (``dead_letter_payloads``, kept by the
triggers of migration ``queue 0023``) holds exactly the dead and failed tasks' upper-
cased payload text, whatever path moved them: real workers failing them, revive with
and without a new payload, cancel, retention, an edit in place, deletes, a TRUNCATE;
and the dead letter's search over it finds what the search over the tasks finds."""

from __future__ import annotations

from datetime import timedelta
from unittest import mock

import pytest
from django.conf import settings
from django.db import connection
from django.db.models import Count

from automechanica.api.listing import filter_tasks
from automechanica.api.schemas import TaskFilters
from automechanica.dashboard.deadletter import DeadLetterFilter
from task_queue import operations, retention
from task_queue.models import (
    REVIVABLE_STATUSES,
    Task,
    dead_letter_payload_contains,
    payload_contains,
)
from task_queue.models import tasks as tasks_module
from task_queue.operations import TaskSpec
from task_queue.sql import db
from tests.support.queue import make_failed
from tests.support.waiting import wait_for

ACTOR = "dead-letter-payloads-test"

# Case, LIKE's wildcards and escape, and letters whose case mapping is not 1:1.
NOTES = ["Grüße aus KÖLN", "50%_off", "back\\slash", "ΣΊΣΥΦΟΣ σίσυφος", "plain sku-7"]
TERMS = ["grüsse", "GRÜSSE", "köln", "50%", "%", "_", "%_o", "\\", "k\\s", "σίσυφοσ", "ς"]
TERMS += ["SKU-7", "sku", "replaced", "o", "no such text", '"note"', '": "']


def held() -> dict:
    with connection.cursor() as cursor:
        cursor.execute("SELECT task_id, payload_text FROM dead_letter_payloads")
        return dict(cursor.fetchall())


def expected() -> dict:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT id, upper(payload::text) FROM tasks WHERE status IN ('dead', 'failed')"
        )
        return dict(cursor.fetchall())


def assert_exact() -> None:
    """The table equals the dead letter, and every term finds the same tasks in it as
    the search over every dead or failed task's payload, by either way of reading
    the matches (by key, or joined when there are many)."""
    assert held() == expected()
    dead = Task.objects.filter(status__in=REVIVABLE_STATUSES)
    for term in TERMS:
        brute_force = set(payload_contains(dead, term).values_list("id", flat=True))
        for few in (tasks_module.FEW_MATCHES, 0):
            with mock.patch.object(tasks_module, "FEW_MATCHES", few):
                found = dead_letter_payload_contains(dead, term).values_list("id", flat=True)
                assert set(found) == brute_force, (term, few)


@pytest.mark.django_db
def test_the_search_matches_the_payload_search_in_any_case_and_literally():
    failed = make_failed([{"note": note} for note in NOTES])
    assert len(held()) == len(NOTES)
    assert_exact()
    dead = Task.objects.filter(status__in=REVIVABLE_STATUSES)
    assert list(dead_letter_payload_contains(dead, "gRÜßE").values_list("id", flat=True)) == [
        failed[0]
    ]
    assert set(dead_letter_payload_contains(dead, "%").values_list("id", flat=True)) == {failed[1]}
    assert set(dead_letter_payload_contains(dead, "\\S").values_list("id", flat=True)) == {
        failed[2]
    }


@pytest.mark.django_db
def test_the_dead_letters_searches_read_its_own_table():
    make_failed([{"note": note} for note in NOTES])
    page = DeadLetterFilter({"q": "köln"}).tasks()
    api = filter_tasks(
        Task.objects.filter(status__in=REVIVABLE_STATUSES),
        TaskFilters(q="köln"),
        dead_letter_payload_contains,
    )
    for search in (page, api):
        assert search.count() == 1
        assert "UPPER(" not in str(search.query).upper()  # no task's payload is read
    with mock.patch.object(tasks_module, "FEW_MATCHES", 0):
        assert "dead_letter_payloads" in DeadLetterFilter({"q": "köln"}).tasks().explain()


@pytest.mark.django_db(transaction=True)
@pytest.mark.slow
def test_the_table_follows_the_dead_letter_through_workers_and_operators(worker_processes):
    specs = [TaskSpec("EchoAgent", "echo", {"note": note}) for note in NOTES]
    specs += [TaskSpec("EchoAgent", "echo", {"fail": "permanent", "note": n}) for n in NOTES]
    specs += [
        TaskSpec("EchoAgent", "echo", {"fail": "transient", "note": n}, max_attempts=1)
        for n in NOTES
    ]
    ids = [e.id for e in operations.enqueue_many(specs)]
    failed, dead = ids[5:10], ids[10:15]
    worker_processes("EchoAgent", "--concurrency", "4").wait_ready()
    wait_for(lambda: _by_status() == {"completed": 5, "failed": 5, "dead": 5}, what="the drain")
    assert set(held()) == set(failed + dead)
    assert_exact()

    # Revived as they were: they leave, the worker fails them again, they are back.
    operations.revive(failed[:2], actor=ACTOR)
    # Revived with a new payload: one fails again with it, one completes.
    operations.revive(
        [dead[0]], actor=ACTOR, payload={"fail": "permanent", "note": "Replaced, Failing"}
    )
    operations.revive([dead[1]], actor=ACTOR, payload={"note": "replaced, fine"})
    wait_for(
        lambda: _by_status() == {"completed": 6, "failed": 6, "dead": 3},
        what="the revived tasks to end",
    )
    assert "REPLACED, FAILING" in held()[dead[0]]
    assert dead[1] not in held()
    assert_exact()

    # Cancelled, then pruned by retention; an edit in place; a delete.
    operations.cancel(failed[2:4], actor=ACTOR)
    assert_exact()
    far = db.database_clock() + timedelta(days=settings.QUEUE_RETENTION_DAYS + 1)
    pruned = retention.prune(now=far)
    assert pruned is not None and pruned.tasks == 8  # 6 completed, 2 cancelled
    Task.objects.filter(id=dead[2]).update(payload={"note": "Edited In Place"})
    assert held()[dead[2]] == '{"NOTE": "EDITED IN PLACE"}'
    Task.objects.filter(id=dead[3]).delete()
    assert len(held()) == 6
    assert_exact()

    with connection.cursor() as cursor:
        cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")  # no checks pending at TRUNCATE
        cursor.execute("TRUNCATE tasks CASCADE")
    assert held() == {}


def _by_status() -> dict[str, int]:
    return dict(Task.objects.order_by().values_list("status").annotate(n=Count("id")))
