"""Agents' limits held across real worker processes, and workers that wait for room
without spinning."""

from __future__ import annotations

import threading
import time
from collections import Counter
from datetime import timedelta

import pytest

from task_queue import limits, operations
from task_queue.models import Task, TaskHistory, TaskStatus
from task_queue.worker import Worker, WorkerConfig
from tests.support.queue import status_of
from tests.support.waiting import wait_for

pytestmark = pytest.mark.django_db(transaction=True)

HELD = (TaskStatus.LEASED, TaskStatus.RUNNING)


def echo_tasks(n: int, **payload: object) -> list:
    specs = [operations.TaskSpec("EchoAgent", "echo", dict(payload))] * n
    return [result.id for result in operations.enqueue_many(specs)]


def all_completed(ids: list) -> bool:
    return Task.objects.filter(id__in=ids, status=TaskStatus.COMPLETED).count() == len(ids)


@pytest.mark.slow
def test_four_workers_of_twenty_never_run_more_than_the_concurrency_limit(worker_processes):
    limits.set_limits("EchoAgent", concurrency_limit=5, actor="user:test")
    workers = [worker_processes("EchoAgent", "--concurrency", "20") for _ in range(4)]
    for worker in workers:
        worker.wait_ready()
    ids = echo_tasks(60, sleep_ms=150)  # the enqueue wakes all four at once
    # Sample the held count as fast as the database answers, until every task is done.
    samples = []
    deadline = time.monotonic() + 120
    while not all_completed(ids):
        samples.append(Task.objects.filter(agent_name="EchoAgent", status__in=HELD).count())
        assert time.monotonic() < deadline, "the tasks did not complete"
    assert len(samples) > 50  # many samples over the drain (a few hundred a second)
    assert max(samples) <= 5, max(samples)
    assert max(samples) == 5  # the limit was reached, not just never approached
    completed_by = TaskHistory.objects.filter(task_id__in=ids, event="completed")
    print("tasks completed per worker:", Counter(completed_by.values_list("actor", flat=True)))


@pytest.mark.slow
def test_a_rate_limit_lets_the_first_starts_go_at_once_then_holds_every_window(
    worker_processes,
):
    period = timedelta(seconds=2)
    limits.set_limits("EchoAgent", rate_limit=limits.RateLimit(5, 2), actor="user:test")
    ids = echo_tasks(14)
    for _ in range(2):
        worker_processes("EchoAgent", "--concurrency", "10", "--poll", "60").wait_ready()
    wait_for(lambda: all_completed(ids), timeout=60, what="the tasks to complete")
    starts = sorted(Task.objects.filter(id__in=ids).values_list("started_at", flat=True))
    for first in starts:
        in_window = [s for s in starts if first <= s < first + period]
        assert len(in_window) <= 5, (first, in_window)
    assert starts[4] - starts[0] < period  # the first five did not wait for each other
    assert starts[5] - starts[0] >= period


@pytest.mark.slow
def test_a_worker_waiting_at_the_limit_wakes_when_another_workers_task_frees_a_slot(
    worker_processes,
):
    limits.set_limits("EchoAgent", concurrency_limit=1, actor="user:test")
    (first,) = echo_tasks(1, sleep_ms=120_000)
    # This worker takes the first task and no other.
    holder = worker_processes("EchoAgent", "--max-tasks", "1").wait_ready()
    wait_for(lambda: status_of(first) == TaskStatus.RUNNING, what="the first task to start")
    (second,) = echo_tasks(1)
    # A long poll: only a notification can wake this one in time.
    waiter = worker_processes("EchoAgent", "--poll", "60", "--lease", "3").wait_ready()
    assert status_of(second) == TaskStatus.PENDING  # at the limit
    operations.cancel([first], actor="user:test")  # the holder stops it at its heartbeat
    wait_for(lambda: status_of(second) == TaskStatus.COMPLETED, timeout=30, what="the wake-up")
    assert Task.objects.get(id=second).lease_owner is None
    assert holder.wait(30) == 0 and waiter.process.poll() is None


class CountingWorker(Worker):
    """A worker that counts its claim statements."""

    claims = 0

    def _claim_and_dispatch(self, limit: int) -> int:
        self.claims += 1
        return super()._claim_and_dispatch(limit)


@pytest.mark.slow
def test_a_worker_at_the_limit_sleeps_instead_of_claiming_again_and_again():
    limits.set_limits("EchoAgent", concurrency_limit=1, actor="user:test")
    ids = echo_tasks(4, sleep_ms=500)
    worker = CountingWorker(WorkerConfig(agents=["EchoAgent"], concurrency=4, poll_seconds=60))
    thread = threading.Thread(target=worker.run)
    thread.start()
    try:
        wait_for(lambda: all_completed(ids), timeout=60, what="the tasks to complete")
    finally:
        worker.request_stop()
        thread.join(30)
    # Two seconds at the limit: a worker retrying every few milliseconds would have
    # claimed hundreds of times; this one claims when woken (an enqueue, a slot freed,
    # an outcome written), a few times per task.
    assert worker.claims <= 6 * len(ids), worker.claims
