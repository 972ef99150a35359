"""Task outcomes through a real worker (in this process) on the real database.

The worker runs in burst mode with a controlled clock: ``now`` is handed to every
queue statement, so backoff is stepped through without sleeping.
"""

from datetime import UTC, datetime, timedelta

import pytest
from django.db import transaction

from task_queue import operations
from task_queue.execution import ERROR_MESSAGE_MAX_CHARS, TRACEBACK_MAX_CHARS
from task_queue.models import Task, TaskHistory, TaskStatus
from task_queue.models import Worker as WorkerRow
from task_queue.worker import MonitorFailed, Worker, WorkerConfig

pytestmark = pytest.mark.django_db(transaction=True)


def run_burst(agents=("EchoAgent",), now=None, concurrency=4, **config):
    worker = Worker(
        WorkerConfig(agents=list(agents), concurrency=concurrency, burst=True, **config),
        now=(lambda: now),
    )
    return worker.run()


def events(task_id):
    return list(TaskHistory.objects.filter(task_id=task_id).values_list("event", flat=True))


def test_success_completes_and_writes_event_embedding_job_and_history():
    task_id = operations.enqueue("EchoAgent", "echo", {"hello": "world"}).id

    report = run_burst()

    task = Task.objects.get(id=task_id)
    assert report.claimed == 1
    assert task.status == TaskStatus.COMPLETED
    assert task.result == {"hello": "world"}
    assert task.lease_owner is None and task.lease_token is None
    assert task.started_at <= task.finished_at
    event = task.agent_events.get()
    assert event.event_type == "task.completed"
    assert event.content == "EchoAgent echoed 1 keys"
    assert event.embedding_jobs.get().status == "pending"
    history = TaskHistory.objects.get(task_id=task_id)
    assert (history.event, history.from_status, history.to_status) == (
        "completed",
        "running",
        "completed",
    )
    assert history.attempt == 1 and history.actor.endswith(f":{__import__('os').getpid()}")


def test_priority_then_age_order():
    ids = [
        operations.enqueue("EchoAgent", "echo", {"n": n}, priority=p).id
        for n, p in enumerate([3, 0, 2, 0, 1])
    ]
    run_burst(concurrency=1)
    order = list(Task.objects.order_by("started_at").values_list("id", flat=True))
    assert order == [ids[1], ids[3], ids[4], ids[2], ids[0]]


def test_available_at_is_respected():
    task_id = operations.enqueue("EchoAgent", "echo", delay_seconds=60).id
    due = Task.objects.get(id=task_id).available_at

    assert run_burst().claimed == 0
    assert run_burst(now=due - timedelta(milliseconds=1)).claimed == 0
    assert run_burst(now=due).claimed == 1
    assert Task.objects.get(id=task_id).status == TaskStatus.COMPLETED


def test_backoff_is_5_20_45_seconds_then_dead():
    task_id = operations.enqueue("EchoAgent", "echo", {"fail": "transient"}, max_attempts=4).id
    now = datetime.now(UTC) + timedelta(seconds=1)
    for attempt, delay in [(1, 5), (2, 20), (3, 45)]:
        assert run_burst(now=now).claimed == 1
        task = Task.objects.get(id=task_id)
        assert (task.status, task.attempts) == (TaskStatus.PENDING, attempt)
        assert task.available_at - now == timedelta(seconds=delay)
        assert task.error_info["type"] == "TransientEchoError"
        assert task.error_info["attempt"] == attempt
        assert "Traceback" in task.error_info["traceback"]
        assert task.error_info["worker"]
        # One microsecond early, nothing is due; at the time, the retry is.
        assert run_burst(now=task.available_at - timedelta(microseconds=1)).claimed == 0
        now = task.available_at

    assert run_burst(now=now).claimed == 1
    task = Task.objects.get(id=task_id)
    assert (task.status, task.attempts) == (TaskStatus.DEAD, 4)
    assert events(task_id) == ["retry_scheduled"] * 3 + ["dead"]


def test_dead_after_default_max_attempts_and_fail_times_recovers():
    dead_id = operations.enqueue("EchoAgent", "echo", {"fail": "transient"}).id
    flaky_id = operations.enqueue("EchoAgent", "echo", {"fail": "transient", "fail_times": 2}).id
    now = datetime.now(UTC) + timedelta(seconds=1)
    for step in (0, 5, 25):
        run_burst(now=now + timedelta(seconds=step))
    assert Task.objects.get(id=dead_id).status == TaskStatus.DEAD
    assert Task.objects.get(id=dead_id).attempts == 3
    flaky = Task.objects.get(id=flaky_id)
    assert (flaky.status, flaky.attempts) == (TaskStatus.COMPLETED, 2)


def test_non_retryable_error_fails_at_once():
    task_id = operations.enqueue("EchoAgent", "echo", {"fail": "permanent"}).id
    run_burst()
    task = Task.objects.get(id=task_id)
    assert (task.status, task.attempts) == (TaskStatus.FAILED, 1)
    assert task.error_info["type"] == "PermanentError"
    assert task.error_info["retryable"] is False


def test_invalid_payload_fails_naming_the_field():
    task_id = operations.enqueue("EchoAgent", "echo", {"sleep_ms": "soon"}).id
    run_burst()
    task = Task.objects.get(id=task_id)
    assert task.status == TaskStatus.FAILED
    assert task.error_info["type"] == "InvalidPayload"
    assert task.error_info["message"].startswith("payload.sleep_ms:")


def test_revive_gives_a_fresh_budget_keeps_history_and_can_edit_payload():
    task_id = operations.enqueue("EchoAgent", "echo", {"fail": "permanent"}).id
    run_burst()
    assert operations.revive([task_id], actor="user:test") == [task_id]
    task = Task.objects.get(id=task_id)
    assert (task.status, task.attempts) == (TaskStatus.PENDING, 0)
    assert task.available_at <= datetime.now(UTC)

    run_burst()  # same payload: fails again
    assert operations.revive([task_id], actor="user:test", payload={"fixed": True}) == [task_id]
    run_burst()

    task = Task.objects.get(id=task_id)
    assert (task.status, task.result) == (TaskStatus.COMPLETED, {"fixed": True})
    assert events(task_id) == ["failed", "revived", "failed", "revived", "completed"]
    errors = TaskHistory.objects.filter(task_id=task_id, event="failed")
    assert all(h.error["type"] == "PermanentError" for h in errors)
    # Only dead and failed tasks can be revived.
    assert operations.revive([task_id], actor="user:test") == []


def test_cancel_pending_task():
    task_id = operations.enqueue("EchoAgent", "echo").id
    assert operations.cancel([task_id], actor="user:test") == {task_id: "cancelled"}
    assert run_burst().claimed == 0
    assert Task.objects.get(id=task_id).status == TaskStatus.CANCELLED
    assert events(task_id) == ["cancelled"]
    assert operations.cancel([task_id], actor="user:test") == {}


def test_rolled_back_enqueue_leaves_no_task_and_no_wakeup():
    import psycopg
    from django.db import connection

    from task_queue.sql.channels import NOTIFY_CHANNEL

    with psycopg.connect(**connection.get_connection_params(), autocommit=True) as listener:
        listener.execute(f"LISTEN {NOTIFY_CHANNEL}")
        with pytest.raises(RuntimeError), transaction.atomic():
            operations.enqueue("RunRecorder", "record")
            raise RuntimeError("caller rolls back")
        operations.enqueue("EchoAgent", "echo")  # committed: its notification must come
        payloads = []
        for note in listener.notifies(timeout=10):
            payloads.append(note.payload)
            if note.payload == "EchoAgent":
                break
    assert payloads == ["EchoAgent"]
    assert list(Task.objects.values_list("agent_name", flat=True)) == ["EchoAgent"]


def test_idempotency_key_returns_the_existing_task():
    first = operations.enqueue("EchoAgent", "echo", {"a": 1}, idempotency_key="order-42")
    again = operations.enqueue("EchoAgent", "echo", {"a": 1}, idempotency_key="order-42")
    assert first.created and not again.created
    assert first.id == again.id
    assert Task.objects.count() == 1


def test_deleting_a_task_deletes_its_history_events_and_embedding_jobs():
    """These foreign keys have no database constraint (agents_app/models.py says why);
    Django's cascade must still remove the children."""
    from agents_app.models import AgentEvent, EmbeddingJob

    keep = operations.enqueue("EchoAgent", "echo", {"keep": True}).id
    doomed = operations.enqueue("EchoAgent", "echo", {"fail": "transient", "fail_times": 1}).id
    now = datetime.now(UTC) + timedelta(seconds=1)
    run_burst(now=now)
    run_burst(now=now + timedelta(seconds=5))
    assert TaskHistory.objects.filter(task_id=doomed).count() == 2

    Task.objects.get(id=doomed).delete()

    assert not TaskHistory.objects.filter(task_id=doomed).exists()
    assert not AgentEvent.objects.filter(task_id=doomed).exists()
    assert EmbeddingJob.objects.count() == AgentEvent.objects.count() == 1
    assert AgentEvent.objects.get().task_id == keep


def test_a_result_postgres_cannot_store_fails_that_task_only():
    """jsonb refuses NUL characters: the task fails with the reason, the others complete."""
    bad = operations.enqueue("NulResult", "nul").id
    good = operations.enqueue("EchoAgent", "echo").id
    run_burst(agents=("NulResult", "EchoAgent"))
    failed = Task.objects.get(id=bad)
    assert (failed.status, failed.error_info["type"]) == (TaskStatus.FAILED, "PermanentError")
    assert "NUL character" in failed.error_info["message"]
    assert Task.objects.get(id=good).status == TaskStatus.COMPLETED


def test_an_error_of_megabytes_is_stored_cut_in_the_task_and_its_history():
    task_id = operations.enqueue("LoudFailure", "loud", {"chars": 3_000_000}).id
    run_burst(agents=("LoudFailure",))
    task = Task.objects.get(id=task_id)
    (history,) = TaskHistory.objects.filter(task_id=task_id, event="failed")
    for error in (task.error_info, history.error):
        assert error["type"] == "PermanentError"
        assert error["message"].startswith("start ? x") and error["message"].endswith("x end")
        assert len(error["message"]) <= ERROR_MESSAGE_MAX_CHARS
        assert len(error["traceback"]) <= TRACEBACK_MAX_CHARS
        assert "characters cut" in error["traceback"]
    assert task.status == TaskStatus.FAILED


def test_enqueue_refuses_a_payload_postgres_cannot_store():
    with pytest.raises(operations.InvalidTask, match="payload: contains a NUL character"):
        operations.enqueue("EchoAgent", "echo", {"text": "nul\x00here"})
    assert not Task.objects.exists()


def test_the_automechanica_agents_run_through_a_worker():
    part = {
        "sku": "RTR-305F",
        "category": "brake_rotor",
        "attributes": {"diameter_mm": 305, "position": "front"},
    }
    fitment = operations.enqueue("FitmentAgent", "generate_fitment", {"part": part}).id
    pricing = operations.enqueue(
        "PricingAgent", "price_parts", {"items": [{"sku": "RTR-305F", "cost_cents": 3000}]}
    ).id
    broken = operations.enqueue("FitmentAgent", "generate_fitment", {"part": {"sku": "X"}}).id
    agents = ("FitmentAgent", "PricingAgent", "SEOAgent", "SupplierNormalizationAgent")
    run_burst(agents=agents)

    done = Task.objects.get(id=fitment)
    assert done.status == TaskStatus.COMPLETED and done.result["count"] == 2
    assert done.agent_events.get().content.startswith("FitmentAgent matched brake rotor RTR-305F")
    assert Task.objects.get(id=pricing).result["items"][0]["price_cents"] == 4699
    failed = Task.objects.get(id=broken)
    assert (failed.status, failed.attempts) == (TaskStatus.FAILED, 1)
    assert failed.error_info["message"] == "payload.part.attributes: must be an object"


def test_a_handler_past_its_timeout_fails_the_attempt_and_is_stopped():
    task_id = operations.enqueue("Slow", "slow", {"seconds": 60}).id
    report = run_burst(agents=("Slow",))  # returns once the stopped handler has let go
    task = Task.objects.get(id=task_id)
    assert (task.status, task.attempts) == (TaskStatus.PENDING, 1)
    assert task.error_info["type"] == "TaskTimeout"
    assert task.error_info["message"] == "handler ran longer than 1 s"
    assert report.written == 1 and report.refused == 0
    assert task.finished_at - task.started_at >= timedelta(seconds=1)


def test_a_monitor_that_fails_stops_the_worker_and_gives_its_tasks_back(monkeypatch):
    """Issue 14, finding 7: a dead monitor must not leave the fetch loop claiming tasks
    whose leases then expire, burning their attempts."""
    task_id = operations.enqueue("Slow", "slow", {"seconds": 60}).id
    reap = Worker._reap

    def failing_reap(self) -> None:
        if self.inflight:  # a task is held: now fail, as a bug would
            raise RuntimeError("injected monitor failure")
        reap(self)

    monkeypatch.setattr(Worker, "_reap", failing_reap)
    worker = Worker(WorkerConfig(agents=["Slow"], grace_seconds=0, reaper_seconds=0.05))
    with pytest.raises(MonitorFailed, match="injected monitor failure"):
        worker.run()
    task = Task.objects.get(id=task_id)
    assert (task.status, task.attempts, task.lease_owner) == (TaskStatus.PENDING, 0, None)
    assert events(task_id) == ["released"]
    assert not WorkerRow.objects.filter(worker_id=worker.id).exists()


def test_a_heartbeat_after_the_row_is_removed_does_not_bring_it_back():
    """A second stop signal (``abandon``) removes the worker's row while its monitor
    still runs: the monitor's next heartbeat must not write the row again (it would
    show a stale worker until the reaper removed it)."""
    worker = Worker(WorkerConfig(agents=["EchoAgent"], burst=True))
    worker._heartbeat()  # as the monitor does
    assert WorkerRow.objects.filter(worker_id=worker.id).exists()

    worker.abandon()
    assert not WorkerRow.objects.filter(worker_id=worker.id).exists()
    worker._heartbeat()
    assert not WorkerRow.objects.filter(worker_id=worker.id).exists()
