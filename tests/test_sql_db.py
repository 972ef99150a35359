"""task_queue.sql.db: statements with server-side parameters behave as Django's own."""

from __future__ import annotations

from uuid import uuid4

import pytest
from django.db import DatabaseError, DataError, IntegrityError, connection, transaction
from django.db.transaction import TransactionManagementError

from task_queue import operations, remote
from task_queue.sql import leasing
from task_queue.sql import outcomes as outcomes_sql
from task_queue.sql.connections import sessions_shared
from task_queue.sql.db import execute, fetch, fetch_bound, fetch_bound_each, set_up_session
from tests.support.api import ECHO

pytestmark = pytest.mark.django_db(transaction=True)


def test_parameters_arrive_with_their_types():
    ids = [uuid4(), uuid4()]
    rows = fetch_bound(
        "SELECT %(ids)s::uuid[], %(texts)s::jsonb[], %(n)s + 1, %(none)s::timestamptz",
        {"ids": ids, "texts": ['{"a": "x\\ty"}', None], "n": 41, "none": None},
    )
    assert rows == fetch(
        "SELECT %(ids)s::uuid[], %(texts)s::jsonb[], %(n)s + 1, %(none)s::timestamptz",
        {"ids": ids, "texts": ['{"a": "x\\ty"}', None], "n": 41, "none": None},
    )
    assert rows[0][0] == ids and rows[0][2] == 42


def test_errors_are_djangos_so_the_worker_handles_them():
    with pytest.raises(DataError):
        fetch_bound("SELECT 1 / %(zero)s", {"zero": 0})


def test_it_joins_the_callers_transaction_and_refuses_a_broken_one():
    with transaction.atomic():
        execute("CREATE TEMP TABLE t (id int PRIMARY KEY) ON COMMIT DROP", {})
        assert fetch_bound("INSERT INTO t VALUES (%(id)s) RETURNING id", {"id": 1}) == [(1,)]
        assert fetch("SELECT count(*) FROM t", {}) == [(1,)]
        with pytest.raises(IntegrityError), transaction.atomic():
            fetch_bound("INSERT INTO t VALUES (%(id)s) RETURNING id", {"id": 1})
        assert fetch_bound("SELECT count(*) FROM t", {}) == [(1,)]  # savepoint rolled back
        transaction.set_rollback(True)

    # An error inside a block without a savepoint breaks the outer one: Django then
    # refuses every statement until it rolls back, and so does fetch_bound.
    with pytest.raises(TransactionManagementError), transaction.atomic():
        with pytest.raises(DatabaseError), transaction.atomic(savepoint=False):
            fetch_bound("SELECT 1 / %(zero)s", {"zero": 0})
        fetch_bound("SELECT 1", {})


PREPARED = "SELECT count(*) FROM pg_prepared_statements WHERE statement = %(sql)s"


def _prepared(sql: str) -> int:
    return fetch(PREPARED, {"sql": sql})[0][0]


def test_a_statement_asked_to_be_prepared_is_and_no_other():
    hot, cold = "SELECT %(n)s::int + 1", "SELECT %(n)s::int + 2"
    for _ in range(10):
        assert fetch_bound(hot, {"n": 1}, prepared=True) == [(2,)]
        assert fetch_bound(cold, {"n": 1}) == [(3,)]
        assert fetch(cold, {"n": 1}) == [(3,)]
    assert _prepared("SELECT $1::int + 1") == 1
    assert _prepared("SELECT $1::int + 2") == 0


def test_a_prepared_statement_is_prepared_again_after_a_rollback():
    # psycopg deallocates its prepared statements at every rollback.
    sql = "SELECT %(n)s::int * 2"
    with transaction.atomic():
        assert fetch_bound(sql, {"n": 2}, prepared=True) == [(4,)]
        transaction.set_rollback(True)
    with pytest.raises(DataError), transaction.atomic():
        fetch_bound("SELECT 1 / %(zero)s::int", {"zero": 0}, prepared=True)
    assert fetch_bound(sql, {"n": 3}, prepared=True) == [(6,)]


def test_prepared_statements_can_be_turned_off_for_a_pooler(settings):
    settings.QUEUE_PREPARED_STATEMENTS = False
    sql = "SELECT %(n)s::int - 1"
    for _ in range(3):
        assert fetch_bound(sql, {"n": 1}, prepared=True) == [(0,)]
    assert _prepared("SELECT $1::int - 1") == 0


def test_runs_sent_one_after_another_are_prepared_once_when_asked():
    sql = "SELECT %(n)s::int * 10"
    for prepared, expected in ((False, 0), (True, 1)):
        with transaction.atomic():
            answers = fetch_bound_each(sql, ({"n": n} for n in range(5)), prepared=prepared)
        assert answers == [[(n * 10,)] for n in range(5)]
        assert _prepared("SELECT $1::int * 10") == expected


def test_runs_sent_one_after_another_are_prepared_again_after_one_failed():
    # The failed run's transaction rolls back, and psycopg forgets what it prepared.
    sql = "SELECT 10 / %(n)s::int"
    with pytest.raises(DataError), transaction.atomic():
        fetch_bound_each(sql, ({"n": n} for n in (5, 0, 2)), prepared=True)
    with transaction.atomic():
        assert fetch_bound_each(sql, ({"n": n} for n in (5, 2)), prepared=True) == [[(2,)], [(5,)]]
    # Inside a savepoint that rolls back, the outer transaction goes on.
    with transaction.atomic():
        with pytest.raises(DataError), transaction.atomic():
            fetch_bound_each(sql, ({"n": n} for n in (0,)), prepared=True)
        assert fetch_bound_each(sql, ({"n": n} for n in (1,)), prepared=True) == [[(10,)]]
    assert _prepared("SELECT 10 / $1::int") == 1


def test_runs_sent_one_after_another_are_not_prepared_for_a_pooler(settings):
    settings.QUEUE_PREPARED_STATEMENTS = False
    with transaction.atomic():
        fetch_bound_each("SELECT %(n)s::int * 20", ({"n": n} for n in range(3)), prepared=True)
    assert _prepared("SELECT $1::int * 20") == 0


COUNT_SET_UPS = """
SELECT set_config('automechanica.set_ups',
    (COALESCE(NULLIF(current_setting('automechanica.set_ups', true), ''), '0')::int + 1)::text,
    false)
"""
SET_UPS = "SELECT current_setting('automechanica.set_ups', true)"


def test_a_session_is_set_up_once_per_connection_and_again_on_a_new_one():
    set_up_session(COUNT_SET_UPS)
    set_up_session(COUNT_SET_UPS)
    assert fetch(SET_UPS, {}) == [("1",)]
    connection.close()  # as the worker does after a connection error
    set_up_session(COUNT_SET_UPS)
    assert fetch(SET_UPS, {}) == [("1",)]


def test_a_direct_connection_is_not_taken_for_a_pooled_one():
    # Two connections of their own keep their backends (behind PgBouncer in transaction
    # mode they do not: tests/test_pgbouncer.py).
    assert not sessions_shared()


def test_a_workers_claims_run_in_autocommit_with_session_settings_on_its_own_connection():
    with leasing.claiming():
        assert not connection.in_atomic_block
    assert fetch(SYNCHRONOUS_COMMIT, {}) == [("off",)]  # the session's, until it closes
    connection.close()


def test_behind_a_pooler_a_claim_and_its_settings_end_with_its_transaction(settings):
    settings.DATABASE_SESSIONS = "shared"  # as the check finds behind PgBouncer
    with leasing.claiming():
        assert connection.in_atomic_block
        assert fetch(SYNCHRONOUS_COMMIT, {}) == [("off",)]
    with outcomes_sql.writing_outcomes():
        assert connection.in_atomic_block
    assert fetch(SYNCHRONOUS_COMMIT, {}) == [("on",)]


def test_a_claim_that_records_outcomes_commits_as_durably_as_outcomes():
    # A remote worker's claim carrying what it finished runs in one transaction, which
    # must then wait for the WAL flush if it wrote any; a claim alone need not. Each is read inside
    # this test's transaction, where the claim's settings last.
    operations.enqueue(**ECHO, payload={})
    operations.enqueue(**ECHO, payload={})
    with transaction.atomic():
        _, (claimed,) = remote.claim("w:1", "EchoAgent", limit=1, lease_seconds=60)
        assert fetch(CLAIM_SETTINGS, {}) == [("off", "off")]
    report = remote.Reported(claimed.task.id, claimed.task.lease_token, result={})
    with transaction.atomic():
        recorded, taken = remote.claim(
            "w:1", "EchoAgent", limit=1, lease_seconds=60, reports=[report]
        )
        assert fetch(CLAIM_SETTINGS, {}) == [("on", "off")]
    assert recorded[claimed.task.id].status == "completed" and len(taken) == 1
    # The same report again writes nothing (its lease is gone): no flush to wait for.
    with transaction.atomic():
        recorded, _ = remote.claim("w:1", "EchoAgent", limit=1, lease_seconds=60, reports=[report])
        assert fetch(CLAIM_SETTINGS, {}) == [("off", "off")]
    assert recorded[claimed.task.id].status is None


SYNCHRONOUS_COMMIT = "SELECT current_setting('synchronous_commit')"
CLAIM_SETTINGS = "SELECT current_setting('synchronous_commit'), current_setting('enable_hashjoin')"
