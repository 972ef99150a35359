"""The database schema matches the code, and migrate explains a missing pgvector."""

import re
import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
import pytest
from django.core.management.base import CommandError
from django.db import connection

from task_queue import signals
from task_queue.models import PRIORITY_MAX, PRIORITY_MIN, Task, TaskStatus, Workflow
from tests.support.processes import REPO, manage_env, run_manage

pytestmark = pytest.mark.django_db

SPEC_TASK_COLUMNS = {
    "id",
    "workflow_id",
    "agent_name",
    "task_type",
    "payload",
    "priority",
    "status",
    "attempts",
    "max_attempts",
    "available_at",
    "lease_owner",
    "lease_expires_at",
    "error_info",
    "created_at",
    "updated_at",
}


def constraint_definition(name):
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_get_constraintdef(oid) FROM pg_constraint WHERE conname = %s", [name]
        )
        return cursor.fetchone()[0]


def test_status_values_in_python_and_database_agree():
    allowed = set(re.findall(r"'(\w+)'::text", constraint_definition("tasks_status_valid")))
    assert allowed == set(TaskStatus.values)
    assert allowed == {"pending", "leased", "running", "completed", "failed", "dead", "cancelled"}


def test_priority_range_in_python_and_database_agree():
    definition = constraint_definition("tasks_priority_range")
    assert f">= {PRIORITY_MIN}" in definition and f"<= {PRIORITY_MAX}" in definition


def test_tables_and_task_columns_are_named_as_the_spec_says():
    with connection.cursor() as cursor:
        tables = {t.name for t in connection.introspection.get_table_list(cursor)}
        columns = {c.name for c in connection.introspection.get_table_description(cursor, "tasks")}
    assert {"workflows", "tasks", "agent_events", "embedding_jobs", "task_queue_metrics"} <= tables
    assert columns >= SPEC_TASK_COLUMNS
    assert {"result", "lease_token", "idempotency_key", "trace_id"} <= columns


def test_tasks_are_vacuumed_after_a_fixed_number_of_dead_row_versions():
    """Not after a fifth of the table: claimed tasks' entries at the head of the lease
    index are cleaned soon after a burst (migration queue 0024)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT reloptions FROM pg_class WHERE oid = 'tasks'::regclass")
        options = set(cursor.fetchone()[0])
    assert options >= {
        "autovacuum_vacuum_scale_factor=0",
        "autovacuum_vacuum_threshold=50000",
        "autovacuum_vacuum_cost_delay=0",
    }


def test_tables_that_grow_with_every_task_are_vacuumed_and_analysed_without_pauses():
    """An autoanalyse of them holds back the cleanup of claimed tasks' index entries
    while it runs; without cost-based pauses it runs several times shorter (migrations
    queue 0027 and agents_app 0009)."""
    tables = ["task_history", "event_outbox", "agent_events", "embedding_jobs", "tasks"]
    with connection.cursor() as cursor:
        cursor.execute("SELECT relname, reloptions FROM pg_class WHERE relname = ANY(%s)", [tables])
        options = dict(cursor.fetchall())
    for table in tables:
        assert "autovacuum_vacuum_cost_delay=0" in options[table], table


def test_a_workflows_tasks_are_found_by_an_index_that_leaves_out_tasks_of_no_workflow():
    workflow = Workflow.objects.create(name="indexed")
    inside = Task.objects.create(workflow=workflow, agent_name="EchoAgent", task_type="echo")
    Task.objects.create(agent_name="EchoAgent", task_type="echo")
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT indexname, indexdef FROM pg_indexes "
            "WHERE tablename = 'tasks' AND indexdef LIKE '%%(workflow_id)%%'"
        )
        [(name, definition)] = cursor.fetchall()  # the foreign key's full index is gone
        assert name == "tasks_workflow_idx"
        assert definition.endswith("WHERE (workflow_id IS NOT NULL)")
        cursor.execute("SET LOCAL enable_seqscan = off")
        query = Task.objects.filter(workflow=workflow)
        assert "tasks_workflow_idx" in query.explain()
        assert list(query) == [inside]


def test_pgvector_is_enabled():
    with connection.cursor() as cursor:
        cursor.execute("SELECT extversion FROM pg_extension WHERE extname = 'vector'")
        assert cursor.fetchone() is not None


def test_no_model_changes_without_migrations():
    result = subprocess.run(
        [sys.executable, "manage.py", "makemigrations", "--check", "--dry-run"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr


SYSTEM_POSTGRES = "postgresql://postgres@%2Fvar%2Frun%2Fpostgresql/postgres"


def _system_server_has_pgvector() -> bool | None:
    """Whether the system PostgreSQL (Debian's 15 here) offers pgvector; None without
    such a server."""
    try:
        with psycopg.connect(SYSTEM_POSTGRES, connect_timeout=3) as conn:
            row = conn.execute("SELECT 1 FROM pg_available_extensions WHERE name = 'vector'")
            return row.fetchone() is not None
    except psycopg.Error:
        return None


SYSTEM_HAS_PGVECTOR = _system_server_has_pgvector()


@contextmanager
def scratch_database(name: str) -> Iterator[str]:
    """A new database on the system server, dropped afterwards; its URL."""
    with psycopg.connect(SYSTEM_POSTGRES, autocommit=True) as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {name}")
        admin.execute(f"CREATE DATABASE {name}")
    try:
        yield SYSTEM_POSTGRES.rsplit("/", 1)[0] + f"/{name}"
    finally:
        with psycopg.connect(SYSTEM_POSTGRES, autocommit=True) as admin:
            admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def manage_on(url: str, *args: str) -> subprocess.CompletedProcess:
    """``manage.py ARGS`` to its end on the database at ``url``."""
    return run_manage(*args, env=manage_env() | {"DATABASE_URL": url}, timeout=300)


DEFAULT_MESSAGE_IDS = """
SELECT message_id FROM event_outbox
WHERE kind IN ('evt.task.claimed.v1', 'evt.task.completed.v1')
"""


@pytest.mark.slow
@pytest.mark.skipif(
    not SYSTEM_HAS_PGVECTOR,
    reason="needs the system PostgreSQL at /var/run/postgresql with pgvector (Debian 12 "
    "packages none for PostgreSQL 15: build it, or install apt.postgresql.org's)",
)
def test_the_schema_migrates_and_a_worker_drains_on_the_system_server():
    # PostgreSQL 15 here (Debian 12's), with pgvector built for it.
    with scratch_database("automechanica_system_server_test") as url:
        migrated = manage_on(url, "migrate")
        assert migrated.returncode == 0, migrated.stderr[-3000:]
        enqueued = manage_on(url, "enqueue", "EchoAgent", "echo", "--count", "500")
        assert enqueued.returncode == 0, enqueued.stderr[-3000:]
        drained = manage_on(url, "runworker", "EchoAgent", "--burst")
        assert drained.returncode == 0, drained.stderr[-3000:]
        with psycopg.connect(url) as conn:
            statuses = conn.execute("SELECT status, count(*) FROM tasks GROUP BY 1").fetchall()
            ids = [row[0] for row in conn.execute(DEFAULT_MESSAGE_IDS)]
        assert statuses == [("completed", 500)]
        # Each task's claimed and completed envelopes, their ids from the column's
        # default (queue 0030 and 0041, from random()): all apart, version 4.
        assert len(set(ids)) == len(ids) == 1000
        assert {(i.version, i.variant) for i in ids} == {(4, uuid.RFC_4122)}


@pytest.mark.skipif(
    SYSTEM_HAS_PGVECTOR is not False,
    reason="needs a PostgreSQL without pgvector at /var/run/postgresql (the system server here)",
)
def test_migrate_on_a_server_it_cannot_use_stops_with_one_line_and_applies_nothing():
    with scratch_database("automechanica_no_pgvector_test") as url:
        result = manage_on(url, "migrate")
        assert result.returncode == 1
        (line,) = result.stderr.strip().splitlines()
        assert line.startswith("CommandError: the PostgreSQL server (")
        with psycopg.connect(url) as conn:
            version = conn.info.server_version
        if version < 150000:
            assert "is older than PostgreSQL 15" in line
        assert "lacks the pgvector extension" in line and "apt.postgresql.org" in line
        assert f"postgresql-{max(version // 10000, 15)}-pgvector" in line
        with psycopg.connect(url) as conn:
            tables = conn.execute(
                "SELECT count(*) FROM pg_tables WHERE schemaname = 'public'"
            ).fetchone()[0]
        assert tables == 0


def test_a_server_older_than_the_oldest_supported_is_refused_before_any_migration(monkeypatch):
    # The servers here are 15 (the oldest supported) and 18: as if the oldest were 19.
    monkeypatch.setattr(signals, "MIN_SERVER_VERSION_NUM", 190000)
    monkeypatch.setattr(signals, "MIN_SERVER_VERSION", "19")
    with pytest.raises(CommandError) as refused:
        signals.require_a_capable_server()
    message = str(refused.value)
    assert "is older than PostgreSQL 19" in message and "use PostgreSQL 19 or newer" in message
    assert f"({connection.cursor().connection.info.parameter_status('server_version')}" in message
