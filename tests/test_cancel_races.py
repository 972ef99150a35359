"""A cancel request is never lost (issue 14, finding 2).

A running task is asked to cancel; before its worker's next heartbeat (here: a lease
of 60 s, so a heartbeat every 20 s) its attempt fails retryably, or the worker shuts
down and gives it back. Either way the task must end cancelled, not go back to
pending with the flag still set, where nothing could cancel it and its retry would run.
"""

from __future__ import annotations

import signal

import pytest

from task_queue import operations
from task_queue.models import Task, TaskHistory, TaskStatus
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

SLOW_HEARTBEAT = ["--lease", "60", "--concurrency", "1", "--poll", "0.2"]


def running(task_id) -> bool:
    return Task.objects.get(id=task_id).status == TaskStatus.RUNNING


def test_an_attempt_that_fails_after_the_cancel_request_ends_cancelled(worker_processes, tmp_path):
    cue = tmp_path / "fail now"
    task_id = operations.enqueue("OnCue", "cue", {"cue": str(cue)}).id
    worker_processes("OnCue", *SLOW_HEARTBEAT).wait_ready()
    wait_for(lambda: running(task_id), what="the task to run")
    assert operations.cancel([task_id], actor="user:ops") == {task_id: "cancel_requested"}
    cue.touch()  # the handler fails, before any heartbeat tells the worker
    wait_for(lambda: Task.objects.get(id=task_id).status != TaskStatus.RUNNING, what="the end")
    task = Task.objects.get(id=task_id)
    assert (task.status, task.attempts) == (TaskStatus.CANCELLED, 1)
    assert task.error_info["message"] == "failed after its cancel was requested"
    events = list(TaskHistory.objects.filter(task_id=task_id).values_list("event", flat=True))
    assert events == ["cancel_requested", "cancelled"]


def test_a_task_given_back_at_shutdown_after_the_cancel_request_ends_cancelled(
    worker_processes, tmp_path
):
    task_id = operations.enqueue("OnCue", "cue", {"cue": str(tmp_path / "never")}).id
    worker = worker_processes("OnCue", *SLOW_HEARTBEAT, "--grace", "0").wait_ready()
    wait_for(lambda: running(task_id), what="the task to run")
    operations.cancel([task_id], actor="user:ops")
    worker.signal(signal.SIGTERM)  # no grace: the running task is given back at once
    assert worker.wait(30) == 0
    task = Task.objects.get(id=task_id)
    assert task.status == TaskStatus.CANCELLED and task.finished_at is not None
    events = list(TaskHistory.objects.filter(task_id=task_id).values_list("event", flat=True))
    assert events == ["cancel_requested", "cancelled"]


def test_a_pending_task_that_carries_the_flag_can_be_cancelled():
    """Tasks a lost request left pending with the flag (before this fix) are not stuck."""
    task_id = operations.enqueue("EchoAgent", "echo", {}).id
    Task.objects.filter(id=task_id).update(cancel_requested_at="2026-11-01T00:00:00Z")
    assert operations.cancel([task_id], actor="user:ops") == {task_id: "cancelled"}
    assert Task.objects.get(id=task_id).status == TaskStatus.CANCELLED
