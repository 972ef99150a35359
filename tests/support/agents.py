"""Agents used only by the tests, loaded through AUTOMECHANICA_AGENT_MODULES."""

from typing import Any

from django.db import connection

from task_queue import operations
from task_queue.agent import Agent, TaskContext
from task_queue.registry import register

RUNS_TABLE = "test_task_runs"
CREATE_RUNS_TABLE = f"""
CREATE TABLE IF NOT EXISTS {RUNS_TABLE} (
    task_id uuid NOT NULL,
    attempt int NOT NULL,
    worker_pid int NOT NULL,
    ran_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (task_id, attempt)
)
"""


def record_run(task: TaskContext) -> None:
    """Insert a row for this run of this attempt: a second run of the same attempt
    violates the primary key, so a task run twice cannot go unnoticed."""
    import os

    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {RUNS_TABLE} (task_id, attempt, worker_pid) VALUES (%s, %s, %s)",
            [task.id, task.attempt, os.getpid()],
        )


@register
class RunRecorderAgent(Agent):
    name = "RunRecorder"
    task_types = ("record",)

    def handle(self, task: TaskContext) -> dict[str, Any]:
        record_run(task)
        return {"recorded": str(task.id)}


@register
class CrashTestAgent(Agent):
    """Hangs on the first attempt (the test kills its worker then); succeeds after."""

    name = "CrashTest"
    task_types = ("crash",)

    def handle(self, task: TaskContext) -> dict[str, Any]:
        record_run(task)
        if task.attempt == 0:
            task.sleep(task.payload.get("hang_seconds", 120))
        return {"survived_attempt": task.attempt}


@register
class NulResultAgent(Agent):
    """Returns a result PostgreSQL's jsonb cannot store."""

    name = "NulResult"
    task_types = ("nul",)

    def handle(self, task: TaskContext) -> dict[str, Any]:
        return {"text": "nul\x00here"}


@register
class LoudFailureAgent(Agent):
    """Fails for good with an error of ``payload["chars"]`` characters, an unpaired
    surrogate among them (what a handler that raises a whole response body does)."""

    name = "LoudFailure"
    task_types = ("loud",)

    def handle(self, task: TaskContext) -> dict[str, Any]:
        from task_queue.agent import PermanentError

        raise PermanentError("start \ud800 " + "x" * task.payload["chars"] + " end")


@register
class SlowAgent(Agent):
    """Sleeps (cooperatively) longer than its one-second timeout allows."""

    name = "Slow"
    task_types = ("slow",)
    timeout = 1.0

    def handle(self, task: TaskContext) -> dict[str, Any]:
        task.sleep(task.payload.get("seconds", 60))
        return {"slept": True}


@register
class PayloadDigestAgent(Agent):
    """Returns what payload it was given, as a digest (large payloads: tests/test_blobs.py)."""

    name = "PayloadDigest"
    task_types = ("digest",)

    def handle(self, task: TaskContext) -> dict[str, Any]:
        import hashlib
        import json

        text = json.dumps(task.payload, sort_keys=True)
        return {"sha256": hashlib.sha256(text.encode()).hexdigest(), "chars": len(text)}


@register
class OnCueAgent(Agent):
    """Runs until the file its payload names exists, then fails retryably (or, with
    ``"block": true``, keeps running): what a handler does between a cancel request
    and its worker's next heartbeat is up to the test (tests/test_cancel_races.py)."""

    name = "OnCue"
    task_types = ("cue",)
    max_attempts = 5

    def handle(self, task: TaskContext) -> dict[str, Any]:
        import os
        import time

        deadline = time.monotonic() + 60
        while not os.path.exists(task.payload["cue"]) and time.monotonic() < deadline:
            time.sleep(0.01)  # not task.sleep: the cancel must not reach the handler first
        if task.payload.get("block"):
            time.sleep(60)
        raise RuntimeError("failed after its cancel was requested")


@register
class AnnouncerAgent(Agent):
    """Sends a message to EchoAgent, publishes ``announced`` and enqueues an EchoAgent
    task: what it sends while it runs a task carries the task's trace."""

    name = "Announcer"
    task_types = ("announce",)

    def handle(self, task: TaskContext) -> dict[str, Any]:
        from agents_app import messaging, pubsub

        messaging.send(self.name, "EchoAgent", "notification", {"task": str(task.id)})
        pubsub.publish(self.name, "announced", {"task": str(task.id)})
        operations.enqueue("EchoAgent", "echo", {"announced_by": str(task.id)})
        return {}


@register
class ProgressAgent(Agent):
    """Reports progress the test can watch while the task runs.

    With ``steps`` ([[fraction, message], ...]) it reports each step, says so in the
    file ``<cue>.reported.<n>`` (n: the step's index), then waits for the file
    ``<cue>.<n>`` before the next; the task ends once the last step's file exists.
    With ``"spin": true`` it reports a new fraction over and over until the file
    ``<cue>`` exists, and returns how many reports it made."""

    name = "Progress"
    task_types = ("progress",)

    def handle(self, task: TaskContext) -> dict[str, Any]:
        import os
        import time

        cue = task.payload["cue"]
        deadline = time.monotonic() + 60
        if task.payload.get("spin"):
            reports = 0
            while not os.path.exists(cue) and time.monotonic() < deadline:
                reports += 1
                task.progress(reports % 1000 / 1000, f"report {reports}")
                time.sleep(0.0005)
            return {"reports": reports}
        for n, (fraction, message) in enumerate(task.payload["steps"]):
            task.progress(fraction, message)
            open(f"{cue}.reported.{n}", "w").close()
            while not os.path.exists(f"{cue}.{n}") and time.monotonic() < deadline:
                task.sleep(0.01)
        return {"steps": len(task.payload["steps"])}
