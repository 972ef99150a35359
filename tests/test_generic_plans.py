"""The plans a worker's prepared statements keep. After its first runs PostgreSQL may
run a prepared statement with one generic plan, made without the parameters' values
(task_queue.sql.db.fetch_bound): the claim, the completion and the worker protocol's
lease lookup must still find their tasks the cheap way, whatever the values and the
statistics."""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from django.db import connection, transaction

from task_queue.execution import Outcome, OutcomeKind
from task_queue.operations import TaskSpec, enqueue_many
from task_queue.outcomes import OutcomeWriter
from task_queue.sql import db, heartbeats, leasing, outcomes
from task_queue.sql.db import execute, fetch
from tests.support.database import plan_nodes

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def new_connection() -> Iterator[None]:
    """A connection of this test's own: nothing known of its plans before, and none of
    its settings or plans left to later tests."""
    connection.close()
    yield
    connection.close()


@pytest.fixture
def claim_session(new_connection) -> None:
    """This test's connection with the settings of a worker's fetch loop (generic plans
    among them)."""
    leasing.prepare_claim_session()


@pytest.fixture
def outcome_session(new_connection) -> None:
    """As ``claim_session``, with the settings of a worker's outcome writer."""
    outcomes.prepare_outcome_session()


@contextmanager
def _autovacuum_off(*tables: str) -> Iterator[None]:
    """No autovacuum on ``tables`` meanwhile: its ANALYZE would give the statistics a
    test chose away, and make every plan over those tables again by itself."""
    for table in tables:
        execute(f"ALTER TABLE {table} SET (autovacuum_enabled = off)", {})
    try:
        yield
    finally:
        for table in tables:
            execute(f"ALTER TABLE {table} RESET (autovacuum_enabled)", {})


def _analysed_empty() -> None:
    """Statistics that say tasks is empty, as it is."""
    assert fetch(db.TABLE_BYTES, {"table": "tasks"}) == [(0,)]
    execute("ANALYZE tasks", {})


def _plan_json(explained: Any) -> dict[str, Any]:
    """The top node of an ``EXPLAIN (FORMAT JSON)`` answer (decoded or not)."""
    explained = explained if isinstance(explained, list) else json.loads(explained)
    return explained[0]["Plan"]


# The claim's parameters: their types, and values as SQL literals.
CLAIM_TYPES = {
    "agents": "text[]", "limit": "int", "owner": "text", "lease_seconds": "float8",
    "now": "timestamptz", "start_priorities": "int[]", "start_times": "timestamptz[]",
}  # fmt: skip
CLAIM_VALUES = {
    "agents": "'{EchoAgent}'", "limit": "50", "owner": "'w'", "lease_seconds": "30",
    "now": "NULL", "start_priorities": "'{-2147483648}'",
    "start_times": "'{0001-01-01 00:00:00+00}'",
}  # fmt: skip


def _generic_plan(
    sql: str,
    types: dict[str, str],
    values: dict[str, str],
    meanwhile: Callable[[], None] | None = None,
) -> dict[str, Any]:
    """EXPLAIN (ANALYZE) of ``sql`` run as a prepared statement with a generic plan, in
    a transaction rolled back afterwards; ``types`` and ``values`` (SQL literals) by
    parameter name. With ``meanwhile``: run once first (which makes the plan), then
    ``meanwhile``, then explained with the plan made before it."""
    names = list(types)
    text = re.sub(r"%\((\w+)\)s", lambda m: f"${names.index(m.group(1)) + 1}", sql)
    args = ", ".join(values[name] for name in names)
    # Deallocated before the rollback: psycopg deallocates every prepared statement of
    # the connection when it sees one.
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(f"PREPARE generic_plan_test ({', '.join(types.values())}) AS {text}")
        if meanwhile is not None:
            cursor.execute(f"EXECUTE generic_plan_test ({args})")
            meanwhile()
        cursor.execute(f"EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE generic_plan_test ({args})")
        ((plan,),) = cursor.fetchall()
        cursor.execute("DEALLOCATE generic_plan_test")
        transaction.set_rollback(True)
    return _plan_json(plan)


def test_the_generic_claim_takes_due_tasks_from_the_ordered_scan_after_a_burst(claim_session):
    # As in test_claim_plan: statistics taken while nothing was pending, then a burst.
    with _autovacuum_off("tasks"):
        enqueue_many([TaskSpec("EchoAgent", "echo")])
        execute("UPDATE tasks SET status = 'completed', finished_at = now()", {})
        execute("ANALYZE tasks", {})
        enqueue_many([TaskSpec("EchoAgent", "echo") for _ in range(20_000)])

        plan = _generic_plan(leasing.CLAIM_TASKS, CLAIM_TYPES, CLAIM_VALUES)

    (lock_rows,) = [n for n in plan_nodes(plan) if n["Node Type"] == "LockRows"]
    assert [(n["Node Type"], n.get("Index Name")) for n in lock_rows["Plans"]] == [
        ("Index Scan", "tasks_pending_lease_idx")
    ]
    # The scan starts where the claim's position says (task_queue.claim_position).
    assert "ROW(priority, created_at) >=" in lock_rows["Plans"][0]["Index Cond"]
    assert lock_rows["Actual Rows"] == 50


# 20,000 due tasks, inserted by a plain statement: no catalog change (a temporary
# table, say) that would make PostgreSQL remake every session's plans by itself.
BURST = """
INSERT INTO tasks (agent_name, task_type, payload, available_at, created_at)
SELECT 'EchoAgent', 'echo', '{}', now(), now() FROM generate_series(1, 20000)
"""


@pytest.mark.parametrize("remade", [True, False], ids=["remade", "as-planned-when-empty"])
def test_a_claim_planned_on_an_empty_queue_is_planned_again_when_tasks_arrive(
    claim_session, monkeypatch, remade
):
    # A worker that starts on an empty queue (queue_bench vacuums one, then starts its
    # workers) makes the claim's one generic plan while tasks holds nothing. The fetch
    # loop's session set-up, before each claim, makes it again once tasks has grown.
    # Without that, the plan made for an empty table reads every task at each claim:
    # the second case shows PostgreSQL still does so, which is what the first guards
    # against.
    monkeypatch.setattr(db, "PLANS_CHECKED_EVERY_SECONDS", 0)

    def burst() -> None:
        execute(BURST, {})
        if remade:
            leasing.prepare_claim_session()

    # Every table the claim reads: an ANALYZE of any would remake its plan too.
    with _autovacuum_off("tasks", "agent_limits", "paused_agents", "event_outbox", "agent_starts"):
        _analysed_empty()
        plan = _generic_plan(leasing.CLAIM_TASKS, CLAIM_TYPES, CLAIM_VALUES, meanwhile=burst)

    tasks_read = max(
        n["Actual Rows"] * n["Actual Loops"]
        for n in plan_nodes(plan)
        if n.get("Relation Name") == "tasks" and "Scan" in n["Node Type"]
    )
    (update,) = [
        n
        for n in plan_nodes(plan)
        if n["Node Type"] == "ModifyTable" and n["Relation Name"] == "tasks"
    ]
    assert update["Actual Rows"] == 50
    assert tasks_read == 50 if remade else tasks_read >= 20_000


def _rows_planned(statement: str) -> int:
    """The rows the plan of the prepared ``statement`` that would run now expects."""
    ((plan,),) = fetch(f"EXPLAIN (FORMAT JSON) EXECUTE {statement}", {})
    return _plan_json(plan)["Plan Rows"]


@pytest.mark.parametrize(
    "set_up",
    [
        leasing.prepare_claim_session,
        outcomes.prepare_outcome_session,
        leasing.prepare_claim_transaction,
        outcomes.prepare_outcome_transaction,
    ],
    ids=["fetch loop", "outcome writer", "remote claim", "remote outcomes"],
)
def test_a_workers_sessions_plan_again_once_tasks_has_doubled(set_up, new_connection, monkeypatch):
    # Both of a worker's sessions keep generic plans, and so do the web server's pooled
    # connections for the worker protocol over HTTP (their settings per transaction);
    # a statement here stands for theirs, its plan made while tasks is empty. Small
    # growth keeps it; a table grown to twice its size (and 1 MB at least) has it made
    # again, once; after the table shrank, twice its smaller size does.
    monkeypatch.setattr(db, "PLANS_CHECKED_EVERY_SECONDS", 0)
    with _autovacuum_off("tasks"):
        _analysed_empty()
        with transaction.atomic():  # (the transactions' set-ups need one)
            set_up()
        execute("PREPARE every_task AS SELECT id FROM tasks", {})
        planned_for_none = _rows_planned("every_task")
        assert planned_for_none < 100

        execute(BURST.replace("20000", "100"), {})  # about 16 kB
        with transaction.atomic():  # (the transactions' set-ups need one)
            set_up()
        assert _rows_planned("every_task") == planned_for_none

        execute(BURST, {})  # about 3 MB
        with transaction.atomic():  # (the transactions' set-ups need one)
            set_up()
        planned_for_the_burst = _rows_planned("every_task")
        assert planned_for_the_burst > 1_000  # from its pages, not its rows

        execute(BURST.replace("20000", "5000"), {})  # a quarter more
        with transaction.atomic():  # (the transactions' set-ups need one)
            set_up()
        assert _rows_planned("every_task") == planned_for_the_burst

        # Emptied (PostgreSQL plans again itself, for an empty table), then a burst
        # smaller than twice the largest size seen before.
        execute("TRUNCATE tasks", {})
        _analysed_empty()
        with transaction.atomic():  # (the transactions' set-ups need one)
            set_up()
        assert _rows_planned("every_task") == planned_for_none
        execute(BURST, {})
        with transaction.atomic():  # (the transactions' set-ups need one)
            set_up()
        assert _rows_planned("every_task") > 1_000


def test_the_size_is_read_at_most_once_an_interval(new_connection, monkeypatch):
    # Between two reads a connection's plans stay as they are, however much tasks grew.
    with _autovacuum_off("tasks"):
        _analysed_empty()
        monkeypatch.setattr(db, "PLANS_CHECKED_EVERY_SECONDS", 3600)
        leasing.prepare_claim_session()  # the first read
        execute("PREPARE every_task AS SELECT id FROM tasks", {})
        planned_for_none = _rows_planned("every_task")

        execute(BURST, {})
        leasing.prepare_claim_session()
        assert _rows_planned("every_task") == planned_for_none  # not read again yet

        monkeypatch.setattr(db, "PLANS_CHECKED_EVERY_SECONDS", 0)
        leasing.prepare_claim_session()
        assert _rows_planned("every_task") > 1_000


def test_the_generic_completion_looks_each_task_up_by_its_id(outcome_session):
    with _autovacuum_off("tasks"):
        ids, tokens = _held_after_stale_statistics()
        plan = _generic_plan(
            outcomes.complete_statement(),
            {
                "owner": "text",
                "ids": "uuid[]",
                "tokens": "uuid[]",
                "results": "jsonb[]",
                "result_refs": "text[]",
                "summaries": "text[]",
                "now": "timestamptz",
            },
            {
                "owner": "'w'",
                "ids": ids,
                "tokens": tokens,
                "results": "array_fill('{}'::jsonb, ARRAY[100])",
                "result_refs": "array_fill(NULL::text, ARRAY[100])",
                "summaries": "array_fill('done'::text, ARRAY[100])",
                "now": "NULL",
            },
        )

    _assert_each_task_looked_up_by_its_id(plan)
    (update,) = [
        n
        for n in plan_nodes(plan)
        if n["Node Type"] == "ModifyTable" and n["Relation Name"] == "tasks"
    ]
    assert update["Actual Rows"] == 100


PLANS_OF_PREPARED = """
SELECT generic_plans, custom_plans FROM pg_prepared_statements
WHERE statement LIKE %(start)s
"""


def test_a_worker_runs_the_generic_plans_from_the_first_claim_and_completion():
    # With the statistics of an emptied table, a plan made for the first runs' values
    # read every task for each completion; the worker's sessions skip those plans. The
    # fetch loop and the outcome writer have threads, and connections, of their own.
    enqueue_many([TaskSpec("EchoAgent", "echo") for _ in range(3)])
    writer = OutcomeWriter("w", lambda: None, written=threading.Event())
    seen: dict[str, Any] = {}

    def in_thread(name: str, work: Callable[[], Any]) -> Any:
        def run() -> None:
            try:
                seen[name] = work()
            finally:
                connection.close()

        thread = threading.Thread(target=run)
        thread.start()
        thread.join(30)
        return seen[name]

    def claim() -> tuple[list, list]:
        leasing.prepare_claim_session()
        claimed = leasing.claim_tasks(
            owner="w", agents=["EchoAgent"], limit=10, lease_seconds=30, now=None
        )
        return claimed, fetch(PLANS_OF_PREPARED, {"start": "%WITH limited AS MATERIALIZED%"})

    def complete(claimed: list) -> list:
        writer._write([Outcome(OutcomeKind.COMPLETED, task, result_json="{}") for task in claimed])
        return fetch(PLANS_OF_PREPARED, {"start": "%WITH held AS%"})

    claimed, claim_plans = in_thread("claim", claim)
    completion_plans = in_thread("complete", lambda: complete(claimed))

    assert (claim_plans, completion_plans) == ([(1, 0)], [(1, 0)])
    assert fetch("SELECT count(*) FROM tasks WHERE status = 'completed'", {}) == [(3,)]


def test_the_generic_lease_holders_look_each_task_up_by_its_id(outcome_session):
    # The worker protocol's first read of an outcome batch (heartbeats.lease_holders),
    # a prepared statement: once PostgreSQL runs it with a generic plan (forced here),
    # statistics taken while nothing was held must not make it read the index of held
    # leases, full of dead entries in a busy drain, as for the completion.
    with _autovacuum_off("tasks"):
        ids, tokens = _held_after_stale_statistics()
        plan = _generic_plan(
            heartbeats.LEASE_HOLDERS,
            {"ids": "uuid[]", "tokens": "uuid[]"},
            {"ids": ids, "tokens": tokens},
        )
    _assert_each_task_looked_up_by_its_id(plan)


def _held_after_stale_statistics() -> tuple[str, str]:
    """Statistics taken while nothing was held, then 2,000 tasks held: the index of
    held leases looks nearly empty, and in a busy drain it is full of dead entries.
    The ids and lease tokens of 100 of them, as SQL array literals."""
    enqueue_many([TaskSpec("EchoAgent", "echo") for _ in range(2_000)])
    execute("ANALYZE tasks", {})
    claimed = leasing.claim_tasks(
        owner="w", agents=["EchoAgent"], limit=2_000, lease_seconds=30, now=None
    )
    batch = claimed[:100]
    ids = "'{" + ",".join(str(t.id) for t in batch) + "}'"
    tokens = "'{" + ",".join(str(t.lease_token) for t in batch) + "}'"
    return ids, tokens


def _assert_each_task_looked_up_by_its_id(plan: dict[str, Any]) -> None:
    """One primary-key lookup per task of the batch of 100, nothing else read from tasks."""
    (scan,) = [
        n
        for n in plan_nodes(plan)
        if n.get("Relation Name") == "tasks" and "Scan" in n["Node Type"]
    ]
    assert (scan["Node Type"], scan["Index Name"]) == ("Index Scan", "tasks_pkey")
    assert scan["Actual Loops"] == 100 and scan["Actual Rows"] == 1
