"""The dead letter's compact table (``dead_letter_payloads``, kept by the triggers of
migrations ``queue 0023`` and ``0025``) holds exactly the dead and failed tasks' upper-
cased payload text and the columns the dead letter filters and orders by, whatever
path moved them: real workers failing them, revive with and without a new payload,
cancel, retention, an edit in place, deletes, a TRUNCATE; the dead letter read from
it (the page, its count, the API's list and bulk revive) finds, in the same order,
what the straightforward query over the tasks finds; and the triggers stay off the
hot path."""

from __future__ import annotations

import itertools
import random
from datetime import timedelta
from urllib.parse import urlencode

import pytest
from django.conf import settings
from django.core.paginator import Paginator
from django.db import connection
from django.db.models import Count

from automechanica.api.listing import filter_tasks
from automechanica.api.schemas import TaskFilters
from automechanica.dashboard.deadletter import DeadLetterFilter, DeadLetterRows
from task_queue import operations
from task_queue.maintenance import retention
from task_queue.models import (
    REVIVABLE_STATUSES,
    DeadLetterEntry,
    Task,
    Workflow,
    dead_letter_payload_contains,
    dead_letter_tasks,
    payload_contains,
)
from task_queue.operations import TaskSpec
from task_queue.sql import db
from tests.support.api import Api, token
from tests.support.queue import complete_pending, make_failed
from tests.support.users import staff
from tests.support.waiting import wait_for

ACTOR = "dead-letter-payloads-test"

# Case, LIKE's wildcards and escape, and letters whose case mapping is not 1:1.
NOTES = ["Grüße aus KÖLN", "50%_off", "back\\slash", "ΣΊΣΥΦΟΣ σίσυφος", "plain sku-7"]
TERMS = ["grüsse", "GRÜSSE", "köln", "50%", "%", "_", "%_o", "\\", "k\\s", "σίσυφοσ", "ς"]
TERMS += ["SKU-7", "sku", "replaced", "o", "no such text", '"note"', '": "']

# The table's columns, and what each must be for a dead or failed task.
COLUMNS = """task_id, payload_text, status, agent_name, task_type, error_class, priority,
             workflow_id, trace_id, created_at, updated_at, finished_at"""
FROM_TASKS = """id, upper(payload::text), status, agent_name, task_type,
                CASE WHEN jsonb_typeof(error_info -> 'type') = 'string'
                     THEN error_info ->> 'type' END,
                priority, workflow_id, trace_id, created_at, updated_at, finished_at"""


def held() -> dict:
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {COLUMNS} FROM dead_letter_payloads")
        return {row[0]: row for row in cursor.fetchall()}


def expected() -> dict:
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {FROM_TASKS} FROM tasks WHERE status IN ('dead', 'failed')")
        return {row[0]: row for row in cursor.fetchall()}


def assert_exact() -> None:
    """The table equals the dead letter, column for column, and every term finds the
    same tasks in it as the search over every dead or failed task's payload."""
    assert held() == expected()
    dead = Task.objects.filter(status__in=REVIVABLE_STATUSES)
    for term in TERMS:
        brute_force = set(payload_contains(dead, term).values_list("id", flat=True))
        found = dead_letter_payload_contains(DeadLetterEntry.objects.all(), term)
        assert set(found.values_list("id", flat=True)) == brute_force, term


@pytest.mark.django_db
def test_the_search_matches_the_payload_search_in_any_case_and_literally():
    failed = make_failed([{"note": note} for note in NOTES])
    assert len(held()) == len(NOTES)
    assert_exact()

    def found(term: str) -> set:
        entries = dead_letter_payload_contains(DeadLetterEntry.objects.all(), term)
        return set(entries.values_list("id", flat=True))

    assert found("gRÜßE") == {failed[0]}
    assert found("%") == {failed[1]}
    assert found("\\S") == {failed[2]}


@pytest.mark.django_db
def test_the_dead_letter_is_counted_and_chosen_in_its_own_table():
    make_failed([{"note": note} for note in NOTES])
    page = DeadLetterFilter({"q": "köln", "error_class": "Boom"}).entries()
    api = filter_tasks(
        DeadLetterEntry.objects.all(),
        TaskFilters(q="köln", agent_name="EchoAgent"),
        dead_letter_payload_contains,
    )
    for search in (page, api):
        assert search.count() == 1
        assert '"tasks"' not in str(search.query)  # no task's row is read to filter
    # A page's tasks are read by key, in the statement that picks them.
    assert [task.error_info["type"] for task in DeadLetterRows(page, page_size=50)[0:50]] == [
        "Boom"
    ]
    read = str(dead_letter_tasks(page[0:50]).query)
    assert '"dead_letter_payloads"' in read and 'FROM "tasks"' in read


# ---------------------------------------------------------------- every filter


def varied_dead_letter() -> dict:
    """Sixty tasks, two thirds dead or failed, over agents, task types, error classes
    (a JSON string, a number, none), priorities, workflows, traces and times with ties
    and a death without a time; the rest in other statuses with the same values."""
    pick = random.Random(15)
    workflow = Workflow.objects.create(name="dead-letter-filters")
    base = db.database_clock() - timedelta(days=3)
    errors = [{"type": "TimeoutError"}, {"type": "Boom"}, {"type": 5}, {"message": "x"}, None]
    tasks = []
    for n in range(60):
        status = ["dead", "failed", "dead", "failed", "completed", "pending"][n % 6]
        tasks.append(
            Task(
                agent_name=pick.choice(["EchoAgent", "FitmentAgent"]),
                task_type=pick.choice(["echo", "fit"]),
                payload={"sku": f"SKU-{pick.randrange(30)}", "note": pick.choice(NOTES)},
                priority=pick.randrange(4),
                status=status,
                error_info=pick.choice(errors),
                workflow=pick.choice([workflow, None]),
                trace_id=pick.choice(["trace-a", "trace-b", None]),
                created_at=base + timedelta(hours=pick.randrange(12)),  # ties
                updated_at=base + timedelta(hours=pick.randrange(24)),
                finished_at=None if n == 7 else base + timedelta(hours=pick.randrange(10)),
            )
        )
    Task.objects.bulk_create(tasks)
    assert_exact()
    return {"workflow": workflow.id, "base": base}


def dashboard_expected(values: dict) -> list:
    """The dead letter's page for these filter values, straight from the tasks."""
    tasks = Task.objects.filter(status__in=REVIVABLE_STATUSES)
    if "agent" in values:
        tasks = tasks.filter(agent_name=values["agent"])
    if "task_type" in values:
        tasks = tasks.filter(task_type=values["task_type"])
    if "error_class" in values:
        tasks = tasks.filter(error_info__type=values["error_class"])
    if "since" in values:
        tasks = tasks.filter(finished_at__gte=values["since"])
    if "until" in values:
        tasks = tasks.filter(finished_at__lt=values["until"])
    if "q" in values:
        tasks = payload_contains(tasks, values["q"])
    return list(tasks.order_by("-finished_at", "-id").values_list("id", flat=True))


@pytest.mark.django_db
def test_every_dashboard_filter_finds_what_the_tasks_hold_in_the_same_order():
    made = varied_dead_letter()
    since, until = made["base"] + timedelta(hours=2), made["base"] + timedelta(hours=7)
    choices = {
        "agent": [None, "FitmentAgent"],
        "task_type": [None, "fit"],
        "error_class": [None, "TimeoutError", "5"],
        "since": [None, since],
        "until": [None, until],
        "q": [None, "sku-1", "%", "no such text"],
    }
    client = staff()
    combinations = 0
    for chosen in itertools.product(*choices.values()):
        values = {k: v for k, v in zip(choices, chosen, strict=True) if v is not None}
        want = dashboard_expected(values)
        form = DeadLetterFilter(values)
        assert form.is_valid(), form.errors
        paginator = Paginator(DeadLetterRows(form.entries(), page_size=7), 7)
        assert paginator.count == len(want), values
        got = [t.id for n in paginator.page_range for t in paginator.page(n).object_list]
        assert got == want, values
        query = urlencode({k: v.isoformat() if k in ("since", "until") else v
                           for k, v in values.items()})  # fmt: skip
        assert client.get(f"/dead-letter/count/?{query}").content.decode() == str(len(want))
        combinations += 1
    assert combinations == 192

    # The page itself, newest death first, and an invalid filter matching nothing.
    html = client.get("/dead-letter/results/?agent=FitmentAgent").content.decode()
    shown = [line.split('data-task="')[1][:36] for line in html.split("\n") if "data-task=" in line]
    assert shown == [str(i) for i in dashboard_expected({"agent": "FitmentAgent"})]
    assert DeadLetterFilter({"since": "not a time"}).entries().count() == 0


@pytest.mark.django_db
def test_every_api_filter_finds_what_the_tasks_hold_in_the_same_order():
    made = varied_dead_letter()
    base = made["base"]
    values = {
        "status": [["dead"], ["failed", "pending"]],
        "agent_name": ["FitmentAgent"],
        "task_type": ["echo"],
        "workflow_id": [str(made["workflow"])],
        "trace_id": ["trace-a"],
        "priority": [2],
        "created_after": [(base + timedelta(hours=3)).isoformat()],
        "created_before": [(base + timedelta(hours=8)).isoformat()],
        "updated_after": [(base + timedelta(hours=5)).isoformat()],
        "updated_before": [(base + timedelta(hours=20)).isoformat()],
        "q": ["sku-2", "ς"],
    }
    singles = [{name: v} for name, options in values.items() for v in options]
    pairs = [a | b for a, b in itertools.combinations(singles, 2) if a.keys() != b.keys()]
    every = {name: options[0] for name, options in values.items()}
    api = Api(token("read"))
    for filters in [{}, *singles, *pairs, every, every | {"status": None}]:
        filters = {k: v for k, v in filters.items() if v is not None}
        dead = Task.objects.filter(status__in=REVIVABLE_STATUSES)
        want = filter_tasks(dead, TaskFilters(**filters), payload_contains)
        want = [str(i) for i in want.order_by("-created_at", "-id").values_list("id", flat=True)]
        got, cursor = [], None
        while True:
            query = filters | {"limit": 6} | ({"cursor": cursor} if cursor else {})
            answer = api.get(f"/api/v1/dead-letter?{urlencode(query, doseq=True)}")
            assert answer.status_code == 200, (filters, answer.content)
            got += [item["id"] for item in answer.json()["items"]]
            if not (cursor := answer.json()["next_cursor"]):
                break
        assert got == want, filters


@pytest.mark.django_db
def test_bulk_revive_by_filter_takes_what_the_tasks_hold():
    varied_dead_letter()
    dead = Task.objects.filter(status__in=REVIVABLE_STATUSES)
    filters = {"agent_name": "FitmentAgent", "q": "sku-1"}
    want = set(filter_tasks(dead, TaskFilters(**filters), payload_contains).values_list("id"))
    assert want
    answer = Api(token("admin")).post("/api/v1/tasks/revive", {"filters": filters})
    assert answer.json() == {"revived": len(want)}
    assert not set(filter_tasks(dead, TaskFilters(**filters), payload_contains).values_list("id"))
    assert_exact()


# ---------------------------------------------------------------- the hot path


@pytest.mark.django_db
def test_ordinary_claims_and_completions_never_run_the_trigger_function():
    """The row triggers' WHEN clauses are false for a task that is not dead or failed:
    a claim, a start and a completion call no trigger function of this table (the
    calls this transaction made, pg_stat_xact_user_functions); a failure calls it."""

    def calls() -> int:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT coalesce(sum(calls), 0) FROM pg_stat_xact_user_functions"
                " WHERE funcname = 'keep_dead_letter_payload'"
            )
            return cursor.fetchone()[0]

    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL track_functions = 'pl'")
    operations.enqueue_many([TaskSpec("EchoAgent", "echo", {"n": n}) for n in range(5)])
    assert len(complete_pending("EchoAgent")) == 5
    assert calls() == 0
    make_failed([{"note": "fails"}])
    assert calls() == 1


# ---------------------------------------------------------------- every path


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
    assert "REPLACED, FAILING" in held()[dead[0]][1]
    assert dead[1] not in held()
    assert_exact()

    # Cancelled, then pruned by retention; edits in place (the payload, the columns
    # the filters read); a delete.
    operations.cancel(failed[2:4], actor=ACTOR)
    assert_exact()
    far = db.database_clock() + timedelta(days=settings.QUEUE_RETENTION_DAYS + 1)
    pruned = retention.prune(now=far)
    assert pruned is not None and pruned.tasks == 8  # 6 completed, 2 cancelled
    Task.objects.filter(id=dead[2]).update(payload={"note": "Edited In Place"})
    assert held()[dead[2]][1] == '{"NOTE": "EDITED IN PLACE"}'
    Task.objects.filter(id=dead[2]).update(
        agent_name="FitmentAgent", error_info={"type": "Moved"}, priority=7, trace_id="t-2"
    )
    assert held()[dead[2]][3:9] == ("FitmentAgent", "echo", "Moved", 7, None, "t-2")
    Task.objects.filter(id=dead[3]).delete()
    assert len(held()) == 6
    assert_exact()

    with connection.cursor() as cursor:
        cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")  # no checks pending at TRUNCATE
        cursor.execute("TRUNCATE tasks CASCADE")
    assert held() == {}


def _by_status() -> dict[str, int]:
    return dict(Task.objects.order_by().values_list("status").annotate(n=Count("id")))
