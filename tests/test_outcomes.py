"""The outcome writer (task_queue/outcomes.py) against the real database: a batch the
database refuses is split, so one outcome that cannot be stored does not hold up the
others, and that one task still ends with the reason."""

from __future__ import annotations

import threading

import pytest

from task_queue import operations
from task_queue.execution import Outcome, OutcomeKind, failure
from task_queue.models import Task, TaskStatus
from task_queue.operations import TaskSpec
from task_queue.outcomes import OutcomeWriter
from tests.support.queue import OWNER, claimed_and_started
from tests.support.waiting import wait_for

pytestmark = pytest.mark.django_db(transaction=True)

# Valid JSON text that jsonb refuses (it cannot hold NUL): the handler's own checks
# keep such a result out (tests/test_execution.py), so this is the writer's last line.
UNSTORABLE = '{"text": "nul\\u0000here"}'


def test_a_refused_batch_is_split_so_the_other_outcomes_land(caplog):
    operations.enqueue_many([TaskSpec("EchoAgent", "echo", {"n": n}) for n in range(4)])
    claimed = sorted(claimed_and_started("EchoAgent"), key=lambda task: task.payload["n"])
    first, bad, last, retried = claimed
    batch = [
        Outcome(OutcomeKind.COMPLETED, first, result_json='{"n": 0}', summary="zero"),
        Outcome(OutcomeKind.COMPLETED, bad, result_json=UNSTORABLE, summary="one"),
        Outcome(OutcomeKind.COMPLETED, last, result_json='{"n": 2}', summary="two"),
        failure(retried, ValueError("boom"), retryable=True, base_delay=0.0),
    ]
    written = threading.Event()
    writer = OutcomeWriter(OWNER, now=lambda: None, written=written)
    for outcome in batch:  # all queued before the writer starts: one batch
        writer.put(outcome)
    writer.start()
    try:
        wait_for(writer.idle, timeout=30, what="every outcome to be written")
    finally:
        writer.close(timeout=10)

    tasks = {t.id: t for t in Task.objects.all()}
    # The outcomes beside the bad one were written as they were...
    assert (tasks[first.id].status, tasks[first.id].result) == (TaskStatus.COMPLETED, {"n": 0})
    assert (tasks[last.id].status, tasks[last.id].result) == (TaskStatus.COMPLETED, {"n": 2})
    assert tasks[retried.id].status == TaskStatus.PENDING  # retried, due at once
    assert tasks[retried.id].error_info["message"] == "boom"
    # ...and the bad one failed for good, saying why, instead of staying leased.
    refused = tasks[bad.id]
    assert (refused.status, refused.result) == (TaskStatus.FAILED, None)
    assert refused.error_info["type"] == "PermanentError"
    assert refused.error_info["message"].startswith("the database refused this task's outcome: ")
    assert refused.error_info["retryable"] is False
    assert (writer.written, writer.refused) == (4, 0) and written.is_set()
    (logged,) = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert logged.startswith(f"could not record the outcome of task {bad.id}: ")
