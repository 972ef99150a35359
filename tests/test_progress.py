"""Progress and liveness (issue 17, point 5): a handler's progress reports, written
with its worker's heartbeat, and the worker's state (idle, busy, draining) in the
registry. Real worker processes; the test agent Progress (tests/support/agents.py)
waits on files the test creates."""

from __future__ import annotations

import math
import os
import signal
from datetime import timedelta
from uuid import uuid4

import pytest
from django.db import connection
from django.utils import timezone

from task_queue import operations
from task_queue.agent import PROGRESS_MESSAGE_MAX_CHARS, TaskContext
from task_queue.maintenance import reaper
from task_queue.models import Task, TaskStatus, Worker
from task_queue.sql import heartbeats, leasing
from tests.support.database import count_rows
from tests.support.waiting import wait_for

# Heartbeats every half second: progress shows within one.
WORKER_ARGS = ("Progress", "--lease", "1.5", "--poll", "0.2")


def context() -> TaskContext:
    return TaskContext(id=uuid4(), agent_name="A", task_type="t", payload={}, attempt=0,
                       max_attempts=1)  # fmt: skip


@pytest.mark.parametrize("fraction", [-0.01, 1.01, math.nan, math.inf, True, "0.5", None])
def test_a_fraction_outside_0_to_1_is_a_value_error(fraction):
    task = context()
    with pytest.raises(ValueError, match="progress must be a finite number from 0 to 1"):
        task.progress(fraction, "x")
    assert task.reported_progress is None


def test_a_message_is_cut_and_made_storable():
    task = context()
    task.progress(1, "nul\x00" + "\ud800" + "x" * 500)
    fraction, message = task.reported_progress
    assert fraction == 1.0 and isinstance(fraction, float)
    assert len(message) == PROGRESS_MESSAGE_MAX_CHARS
    assert message.startswith("nul\ufffd?x")
    with pytest.raises(TypeError):
        task.progress(0.5, 3)


def progress_of(task_id) -> tuple:
    task = Task.objects.get(id=task_id)
    return task.status, task.progress, task.progress_message


@pytest.mark.slow
def test_progress_shows_while_the_task_runs_and_stays_after(worker_processes, api, tmp_path):
    worker_processes(*WORKER_ARGS).wait_ready()
    cue = str(tmp_path / "cue")
    steps = [[0.25, "reading"], [0.75, "writing"]]
    task = operations.enqueue("Progress", "progress", {"steps": steps, "cue": cue})
    wait_for(lambda: progress_of(task.id) == ("running", 0.25, "reading"), what="25 %")
    shown = api.get(f"/api/v1/tasks/{task.id}").json()
    assert (shown["progress"], shown["progress_message"]) == (0.25, "reading")
    listed = api.get("/api/v1/tasks?agent_name=Progress").json()["items"]
    assert [(t["progress"], t["progress_message"]) for t in listed] == [(0.25, "reading")]

    (tmp_path / "cue.0").touch()
    wait_for(lambda: progress_of(task.id) == ("running", 0.75, "writing"), what="75 %")
    (tmp_path / "cue.1").touch()
    # The last report is kept once the task has ended.
    wait_for(lambda: progress_of(task.id) == ("completed", 0.75, "writing"), what="completion")
    assert api.get(f"/api/v1/tasks/{task.id}").json()["progress"] == 0.75
    # A task that reports nothing has none.
    echo = operations.enqueue("EchoAgent", "echo", {})
    assert api.get(f"/api/v1/tasks/{echo.id}").json()["progress"] is None


@pytest.fixture
def task_writes(transactional_db):
    """A row in test_task_writes for every row version an UPDATE of tasks writes."""
    with connection.cursor() as cursor:
        cursor.execute("""
            CREATE TABLE test_task_writes (task_id uuid, progress_message text);
            CREATE FUNCTION test_task_written() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                INSERT INTO test_task_writes VALUES (NEW.id, NEW.progress_message);
                RETURN NULL;
            END $$;
            CREATE TRIGGER test_task_written AFTER UPDATE ON tasks
                FOR EACH ROW EXECUTE FUNCTION test_task_written();
        """)
    yield "test_task_writes"
    with connection.cursor() as cursor:
        cursor.execute("""
            DROP TRIGGER test_task_written ON tasks;
            DROP FUNCTION test_task_written();
            DROP TABLE test_task_writes;
        """)


@pytest.mark.slow
def test_many_reports_cost_at_most_one_write_per_heartbeat(worker_processes, task_writes, tmp_path):
    worker = worker_processes(*WORKER_ARGS).wait_ready()
    cue = tmp_path / "cue"
    task = operations.enqueue("Progress", "progress", {"spin": True, "cue": str(cue)})
    messages = f"SELECT count(DISTINCT progress_message) FROM {task_writes} WHERE task_id = %s"
    wait_for(lambda: count_rows(messages, [task.id]) >= 3, what="three progress writes")
    cue.touch()
    wait_for(lambda: progress_of(task.id)[0] == TaskStatus.COMPLETED, what="completion")

    reports = Task.objects.get(id=task.id).result["reports"]
    writes = count_rows(f"SELECT count(*) FROM {task_writes} WHERE task_id = %s", [task.id])
    beats = count_rows(
        "SELECT sum(beats) FROM worker_heartbeats WHERE worker_id = %s", [worker.worker_id]
    )
    # Every row version of the task: its claim, one per heartbeat at most, its completion.
    assert writes <= beats + 2, (writes, beats, reports)
    assert reports > 10 * writes, (writes, beats, reports)


@pytest.mark.django_db
def test_a_worker_that_lost_its_lease_writes_no_progress():
    task = operations.enqueue("EchoAgent", "echo", {})
    worker = {"lease_seconds": 30, "hostname": "h", "pid": 1, "agents": ["EchoAgent"],
              "concurrency": 1}  # fmt: skip
    [old] = leasing.claim_tasks(owner="old:1", agents=["EchoAgent"], limit=1,
                                lease_seconds=30, now=None)  # fmt: skip
    # Its lease runs out and is recovered; another worker takes the task.
    later = timezone.now() + timedelta(hours=1)
    reaper.reap_expired_leases(now=later)
    [new] = leasing.claim_tasks(owner="new:2", agents=["EchoAgent"], limit=1,
                                lease_seconds=30, now=later + timedelta(days=1))  # fmt: skip
    assert new.id == old.id and new.lease_token != old.lease_token
    held = heartbeats.heartbeat(owner="new:2", held=[(new.id, new.lease_token)],
                             progress=[(0.5, "new")], now=None, **worker)  # fmt: skip
    assert {i: lease.cancel_requested for i, lease in held.items()} == {task.id: False}

    stale = heartbeats.heartbeat(owner="old:1", held=[(old.id, old.lease_token)],
                              progress=[(0.9, "stale")], now=None, **worker)  # fmt: skip
    assert stale == {}  # the lease was lost, and nothing was written
    assert progress_of(task.id) == ("running", 0.5, "new")


@pytest.mark.django_db
def test_a_claim_clears_the_last_attempts_progress():
    task = operations.enqueue("EchoAgent", "echo", {})
    Task.objects.filter(id=task.id).update(progress=0.4, progress_message="last attempt")
    leasing.claim_tasks(owner="w:1", agents=["EchoAgent"], limit=1, lease_seconds=30, now=None)
    assert progress_of(task.id) == ("running", None, None)


def worker_state(pid: int) -> tuple | None:
    row = Worker.objects.filter(pid=pid).values_list("state", "task_ids").first()
    return row and (row[0], sorted(row[1]))


@pytest.mark.slow
def test_a_worker_is_idle_busy_then_draining_then_gone(worker_processes, api, tmp_path):
    # A long lease: the heartbeat comes every 20 s, so only the stop signal's own
    # write can show draining in time.
    worker = worker_processes("Progress", "--lease", "60", "--poll", "0.2").wait_ready()
    assert worker_state(worker.pid) == ("idle", [])
    cue = str(tmp_path / "cue")
    task = operations.enqueue("Progress", "progress", {"steps": [[0.5, "half"]], "cue": cue})
    # Reported (in the worker's memory): the stop signal's heartbeat must write it.
    wait_for(lambda: os.path.exists(f"{cue}.reported.0"), what="the handler to report")

    worker.signal(signal.SIGTERM)
    wait_for(
        lambda: worker_state(worker.pid) == ("draining", [task.id]), what="draining", timeout=10
    )
    [shown] = api.get("/api/v1/workers").json()
    assert (shown["state"], shown["task_ids"]) == ("draining", [str(task.id)])
    assert progress_of(task.id) == ("running", 0.5, "half")  # written with it

    (tmp_path / "cue.0").touch()
    assert worker.wait(30) == 0
    assert progress_of(task.id)[0] == TaskStatus.COMPLETED
    assert not Worker.objects.filter(pid=worker.pid).exists()


@pytest.mark.slow
def test_a_busy_worker_shows_its_tasks(worker_processes, api, tmp_path):
    worker = worker_processes(*WORKER_ARGS).wait_ready()
    cue = str(tmp_path / "cue")
    tasks = [
        operations.enqueue("Progress", "progress", {"steps": [[0.1, "x"]], "cue": cue})
        for _ in range(2)
    ]
    busy = ("busy", sorted(t.id for t in tasks))
    wait_for(lambda: worker_state(worker.pid) == busy, what="busy with both tasks")
    [shown] = api.get("/api/v1/workers").json()
    assert shown["state"] == "busy"
    assert sorted(shown["task_ids"]) == sorted(str(t.id) for t in tasks)
    (tmp_path / "cue.0").touch()
    wait_for(lambda: worker_state(worker.pid) == ("idle", []), what="idle again")
