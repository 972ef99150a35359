"""Claims about leases, exactly-once completion and crash recovery, proven with
real ``manage.py runworker`` processes on the real database."""

import signal
import uuid

import pytest

from task_queue import operations
from task_queue.models import Task, TaskHistory, TaskStatus, Worker
from task_queue.operations import TaskSpec
from task_queue.sql import outcomes as outcomes_sql
from tests.support.database import count_rows
from tests.support.processes import kill
from tests.support.queue import status_of
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def test_four_workers_complete_2000_tasks_exactly_once(worker_processes, runs_table):
    workers = [worker_processes("RunRecorder", "--concurrency", "8") for _ in range(4)]
    for worker in workers:
        worker.wait_ready()
    total = 2000
    operations.enqueue_many([TaskSpec("RunRecorder", "record") for _ in range(total)])

    wait_for(
        lambda: Task.objects.filter(status=TaskStatus.COMPLETED).count() == total,
        timeout=120,
        what="all tasks to complete",
    )

    assert count_rows(f"SELECT count(*) FROM {runs_table}") == total
    assert count_rows(f"SELECT count(DISTINCT task_id) FROM {runs_table}") == total
    assert not Task.objects.exclude(attempts=0).exists()
    assert TaskHistory.objects.filter(event="completed").count() == total
    assert not TaskHistory.objects.exclude(event="completed").exists()
    assert count_rows("SELECT count(*) FROM agent_events") == total
    assert count_rows("SELECT count(*) FROM embedding_jobs") == total
    # The work was shared: every worker process ran some of it.
    per_worker = count_rows(f"SELECT count(DISTINCT worker_pid) FROM {runs_table}")
    assert per_worker == 4, f"only {per_worker} of 4 workers took tasks"


def test_sigkilled_worker_task_is_recovered_and_its_late_write_refused(
    worker_processes, runs_table
):
    lease = ["--lease", "1.5", "--reaper-interval", "0.2", "--concurrency", "1"]
    doomed = worker_processes("CrashTest", *lease).wait_ready()
    task_id = operations.enqueue("CrashTest", "crash", {"hang_seconds": 300}).id
    wait_for(
        lambda: count_rows(f"SELECT count(*) FROM {runs_table} WHERE task_id = %s", [task_id]),
        what="the first attempt to start",
    )
    held = Task.objects.get(id=task_id)
    assert held.status == TaskStatus.RUNNING and held.lease_owner == doomed.worker_id
    old_owner, old_token = held.lease_owner, held.lease_token

    kill(doomed)
    rescuer = worker_processes("CrashTest", *lease).wait_ready()
    wait_for(lambda: status_of(task_id) == TaskStatus.COMPLETED, what="recovery")

    task = Task.objects.get(id=task_id)
    assert task.attempts == 1  # the crashed attempt counted
    assert task.result == {"survived_attempt": 1}
    history = list(TaskHistory.objects.filter(task_id=task_id))
    assert [h.event for h in history] == ["lease_expired", "completed"]
    expired, completed = history
    assert expired.detail == {"worker": old_owner}
    assert expired.error["type"] == "LeaseExpired"
    assert completed.actor == rescuer.worker_id
    # The killed worker's lease is gone: a late write with it changes nothing.
    assert (
        outcomes_sql.complete_tasks(
            owner=old_owner, done=[(task_id, old_token, "{}", None, "late")], now=None
        )
        == set()
    )
    assert (
        outcomes_sql.fail_tasks(
            owner=old_owner, failures=[(task_id, old_token, True, 5.0, "{}")], now=None
        )
        == []
    )
    assert Task.objects.get(id=task_id).result == {"survived_attempt": 1}


def test_graceful_shutdown_finishes_short_tasks_and_releases_the_rest(worker_processes):
    worker = worker_processes("EchoAgent", "--grace", "1.5", "--concurrency", "2").wait_ready()
    short = operations.enqueue("EchoAgent", "echo", {"sleep_ms": 500}).id
    long = operations.enqueue("EchoAgent", "echo", {"sleep_ms": 300_000}).id
    wait_for(
        lambda: Task.objects.filter(id__in=[short, long], status=TaskStatus.RUNNING).count() == 2,
        what="both tasks to run",
    )

    worker.signal(signal.SIGTERM)
    assert worker.wait(30) == 0, worker.log()

    assert status_of(short) == TaskStatus.COMPLETED
    released = Task.objects.get(id=long)
    assert (released.status, released.attempts, released.lease_owner) == ("pending", 0, None)
    assert list(TaskHistory.objects.filter(task_id=long).values_list("event", flat=True)) == [
        "released"
    ]
    assert not Worker.objects.filter(pid=worker.pid).exists()
    # Due at once: another worker takes it without waiting for a lease to expire.
    successor = worker_processes("EchoAgent").wait_ready()
    wait_for(
        lambda: Task.objects.filter(id=long, lease_owner=successor.worker_id).exists(),
        timeout=10,
        what="another worker to take the released task",
    )


def test_second_signal_exits_at_once(worker_processes):
    worker = worker_processes("EchoAgent", "--grace", "300").wait_ready()
    task_id = operations.enqueue("EchoAgent", "echo", {"sleep_ms": 300_000}).id
    wait_for(lambda: status_of(task_id) == TaskStatus.RUNNING, what="the task to run")

    worker.signal(signal.SIGTERM)
    wait_for(lambda: "stopping after in-flight tasks" in worker.log(), what="the first signal")
    worker.signal(signal.SIGTERM)

    assert worker.wait(10) == 128 + signal.SIGTERM
    # Its handler died with it, and its task was given back first: another worker
    # need not wait for the lease (30 s) to expire.
    task = Task.objects.get(id=task_id)
    assert (task.status, task.attempts, task.lease_owner) == ("pending", 0, None)
    assert not Worker.objects.filter(pid=worker.pid).exists()


def test_cancel_running_task_stops_its_handler(worker_processes):
    worker = worker_processes("EchoAgent", "--lease", "1.5").wait_ready()
    task_id = operations.enqueue("EchoAgent", "echo", {"sleep_ms": 300_000}).id
    wait_for(lambda: status_of(task_id) == TaskStatus.RUNNING, what="the task to run")

    assert operations.cancel([task_id], actor="user:test") == {task_id: "cancel_requested"}
    wait_for(lambda: status_of(task_id) == TaskStatus.CANCELLED, timeout=10, what="cancellation")

    events = TaskHistory.objects.filter(task_id=task_id).values_list("event", "actor")
    assert list(events) == [("cancel_requested", "user:test"), ("cancelled", worker.worker_id)]
    # The worker goes on taking tasks.
    next_id = operations.enqueue("EchoAgent", "echo").id
    wait_for(lambda: status_of(next_id) == TaskStatus.COMPLETED, what="the next task")


def test_worker_wakes_on_notify_and_at_the_next_due_time_not_the_poll(worker_processes):
    """With a 300 s poll, only a notification or the due-time timer can explain a
    pickup within seconds."""
    worker_processes("EchoAgent", "--poll", "300").wait_ready()
    now_id = operations.enqueue("EchoAgent", "echo").id
    wait_for(lambda: status_of(now_id) == TaskStatus.COMPLETED, timeout=10, what="notify wake-up")

    later_id = operations.enqueue("EchoAgent", "echo", delay_seconds=1.5).id
    due = Task.objects.get(id=later_id).available_at
    wait_for(lambda: status_of(later_id) == TaskStatus.COMPLETED, timeout=10, what="due wake-up")
    assert Task.objects.get(id=later_id).started_at >= due


def test_a_worker_that_lost_its_lease_stops_the_task_and_writes_nothing(worker_processes):
    worker = worker_processes("EchoAgent", "--lease", "1.5", "--concurrency", "1").wait_ready()
    task_id = operations.enqueue("EchoAgent", "echo", {"sleep_ms": 300_000}).id
    wait_for(lambda: status_of(task_id) == TaskStatus.RUNNING, what="the task to run")
    # As if the lease had been reaped and the task claimed by another worker.
    Task.objects.filter(id=task_id).update(lease_owner="elsewhere:1", lease_token=uuid.uuid4())
    taken = Task.objects.get(id=task_id)

    wait_for(lambda: f"lost the lease on task {task_id}" in worker.log(), what="the heartbeat")
    # Its one slot is free again: the handler was stopped.
    next_id = operations.enqueue("EchoAgent", "echo").id
    wait_for(lambda: status_of(next_id) == TaskStatus.COMPLETED, what="the next task")
    after = Task.objects.get(id=task_id)
    assert (after.status, after.lease_owner, after.lease_token) == (
        TaskStatus.RUNNING,
        "elsewhere:1",
        taken.lease_token,
    )
    assert not TaskHistory.objects.filter(task_id=task_id).exists()


def test_priority_order_holds_across_worker_processes(worker_processes):
    """Two workers, one task at a time each. Low-priority tasks are older, so an
    age-only order would run them first; by priority, at most one low task (taken by
    one worker while the other still held the last high one) starts before the last
    high-priority task."""
    for _ in range(2):
        worker_processes("EchoAgent", "--concurrency", "1").wait_ready()
    low = [TaskSpec("EchoAgent", "echo", {"sleep_ms": 5}, priority=5) for _ in range(30)]
    high = [TaskSpec("EchoAgent", "echo", {"sleep_ms": 5}, priority=0) for _ in range(30)]
    operations.enqueue_many(low + high)
    wait_for(
        lambda: Task.objects.filter(status=TaskStatus.COMPLETED).count() == 60,
        what="all tasks to complete",
    )
    last_high_start = max(Task.objects.filter(priority=0).values_list("started_at", flat=True))
    early_low = Task.objects.filter(priority=5, started_at__lt=last_high_start).count()
    assert early_low <= 1
