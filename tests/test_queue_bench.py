"""queue_bench's end of the drain (task_queue.bench._wait_drained), with real workers."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from task_queue import bench
from task_queue.sql.db import execute, fetch
from tests.support.database import database_url

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

DEADLINE_SECONDS = 30.0

# Another producer's EchoAgent task, due in an hour, enqueued with each statement that
# enqueues a workflow's tasks: in the benchmark's own transaction, after it has read
# the agent's unfinished tasks, so the agent's running totals stay one or more above
# that after the benchmark's workflow has drained.
ANOTHER_PRODUCER = """
CREATE FUNCTION test_another_producer() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF pg_trigger_depth() = 1 THEN
        INSERT INTO tasks (agent_name, task_type, payload, priority, status, attempts,
                           max_attempts, available_at, created_at, updated_at)
        SELECT agent_name, task_type, payload, priority, 'pending', 0, max_attempts,
               now() + interval '1 hour', now(), now()
        FROM new_rows WHERE workflow_id IS NOT NULL LIMIT 1;
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER test_another_producer AFTER INSERT ON tasks
REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION test_another_producer();
"""


@pytest.fixture
def another_producer() -> Iterator[None]:
    execute(ANOTHER_PRODUCER, {})
    yield
    execute("DROP TRIGGER test_another_producer ON tasks", {})
    execute("DROP FUNCTION test_another_producer()", {})


def test_the_drain_ends_while_another_producers_task_waits(another_producer, monkeypatch) -> None:
    # The agent's running totals do not come back down to where they were: the
    # benchmark must see its end by counting its workflow once the totals stop
    # falling, not wait for its deadline (where it would count it anyway).
    monkeypatch.setenv("DATABASE_URL", database_url())  # for the workers it starts
    config = bench.BenchConfig(
        tasks=300, workers=1, concurrency=10, latency_samples=3, timeout=DEADLINE_SECONDS
    )

    started = time.monotonic()
    report = bench.run(config)

    assert time.monotonic() - started < DEADLINE_SECONDS
    assert report["tasks"] == 300 and report["drain_tasks_per_s"] > 0
    waiting = fetch("SELECT status FROM tasks WHERE workflow_id IS NULL AND task_type = 'echo'", {})
    assert waiting and {status for (status,) in waiting} == {"pending"}
