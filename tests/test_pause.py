"""Pausing an agent's queue, with a real worker process."""

from __future__ import annotations

import pytest

from task_queue import operations
from task_queue.models import TaskStatus, Worker
from task_queue.sql import leasing
from tests.support.queue import status_of
from tests.support.waiting import wait_for

pytestmark = pytest.mark.django_db(transaction=True)


def test_claims_skip_a_paused_agent_and_its_due_time():
    paused = operations.enqueue("EchoAgent", "echo", {}).id
    operations.pause_agent("EchoAgent", actor="user:test")
    assert (
        leasing.claim_tasks(owner="t:1", agents=["EchoAgent"], limit=10, lease_seconds=30, now=None)
        == []
    )
    assert leasing.next_due_at(["EchoAgent"]) is None  # the worker sleeps instead of spinning
    operations.resume_agent("EchoAgent", actor="user:test")
    claimed = leasing.claim_tasks(
        owner="t:1", agents=["EchoAgent"], limit=10, lease_seconds=30, now=None
    )
    assert [task.id for task in claimed] == [paused]


@pytest.mark.slow
def test_a_worker_stops_leasing_a_paused_agent_and_resumes_when_woken(worker_processes):
    # A long poll: after the resume only the notification can wake the worker in time.
    worker = worker_processes("EchoAgent", "--lease", "1.5", "--poll", "60")
    worker.wait_ready()
    before = operations.enqueue("EchoAgent", "echo", {}).id
    wait_for(lambda: status_of(before) == TaskStatus.COMPLETED, what="a task before the pause")

    operations.pause_agent("EchoAgent", actor="user:test")
    held_back = operations.enqueue("EchoAgent", "echo", {}).id
    # The enqueue woke the worker; let it heartbeat twice more (a heartbeat every 0.5 s)
    # with the task due all along.
    for _ in range(2):
        seen = Worker.objects.get(pid=worker.pid).last_heartbeat_at
        wait_for(
            lambda seen=seen: Worker.objects.get(pid=worker.pid).last_heartbeat_at > seen,
            what="a heartbeat",
        )
    assert status_of(held_back) == TaskStatus.PENDING

    operations.resume_agent("EchoAgent", actor="user:test")
    wait_for(lambda: status_of(held_back) == TaskStatus.COMPLETED, timeout=20, what="the resume")
