"""Two real maintenance processes evaluate the alert rules: while one is in the middle
of an evaluation the other does not start one, and the first is SIGKILLed there; the
webhook still gets exactly one firing notification, and exactly one resolve once the
tasks are revived."""

from __future__ import annotations

import json

import pytest
from django.db import connection, transaction
from django.utils import timezone

from task_queue import operations
from task_queue.models import (
    AlertDelivery,
    AlertKind,
    AlertNotification,
    AlertRule,
    AlertState,
)
from task_queue.sql import locks
from tests.support.processes import ManageProcess, kill_group
from tests.support.queue import make_failed
from tests.support.receiver import webhook_receiver
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

# A backend of this database waiting for a lock while it holds the alerts' evaluation
# lock: an evaluation in the middle.
EVALUATOR_WAITING = f"""
SELECT a.pid FROM pg_stat_activity a
WHERE a.datname = current_database() AND a.wait_event_type = 'Lock'
  AND EXISTS (SELECT FROM pg_locks l WHERE l.pid = a.pid AND l.locktype = 'advisory'
              AND l.objid = {locks.ALERTS} AND l.granted)
"""
FAST = {"QUEUE_ALERTS_EVALUATE_SECONDS": "0", "LOG_LEVEL": "DEBUG"}
# Backends of this database waiting for a lock.
WAITING = """
SELECT pid FROM pg_stat_activity
WHERE datname = current_database() AND wait_event_type = 'Lock'
"""


def backends(statement: str) -> set[int]:
    with connection.cursor() as cursor:
        # The test reads inside its transaction, which keeps one picture of the
        # activity unless told to take a new one.
        cursor.execute("SELECT pg_stat_clear_snapshot()")
        cursor.execute(statement)
        return {pid for (pid,) in cursor.fetchall()}


def test_each_change_is_sent_once_with_two_processes_and_one_killed_mid_evaluation(tmp_path):
    with webhook_receiver() as receiver:
        rule = AlertRule.objects.create(
            name="dead letter",
            kind=AlertKind.DEAD_LETTER,
            agent="EchoAgent",
            threshold=2,
            channels=[{"type": "webhook", "url": receiver.url}],
        )
        failed = make_failed([{"n": 1}, {"n": 2}])
        processes = []
        try:
            # The rule's state for the agent, not firing: the first evaluation to move
            # it waits for the test's lock on it, in the middle of its transaction.
            state = AlertState.objects.create(
                rule=rule, agent="EchoAgent", evaluated_at=timezone.now()
            )
            with transaction.atomic():
                AlertState.objects.select_for_update().get(pk=state.pk)
                first = ManageProcess(
                    "runmaintenance", ["--every", "0.2"], tmp_path / "first.log", env=FAST
                )
                processes.append(first)
                [evaluator] = wait_for(
                    lambda: backends(EVALUATOR_WAITING), timeout=60, what="an evaluation mid-way"
                )
                second = ManageProcess(
                    "runmaintenance", ["--every", "0.2"], tmp_path / "second.log", env=FAST
                )
                processes.append(second)
                # It finds the evaluation lock taken and goes on (had it evaluated, it
                # would wait on the state's row as the first does).
                wait_for(
                    lambda: "another process is evaluating" in second.log(),
                    timeout=60,
                    what="the second process to find an evaluation running",
                )
                assert backends(WAITING) == {evaluator}
                kill_group(first)  # mid-evaluation: its transaction never commits
            wait_for(lambda: len(receiver.requests) >= 1, timeout=60, what="the firing")

            operations.revive(failed, actor="test")
            wait_for(lambda: len(receiver.requests) >= 2, timeout=60, what="the resolve")
            wait_for(
                lambda: AlertDelivery.objects.filter(status="sent").count() == 2,
                timeout=30,
                what="both deliveries to be recorded sent",
            )
        finally:
            for process in processes:
                process.stop()
    assert [json.loads(r.body)["state"] for r in receiver.requests] == ["firing", "resolved"]
    assert [n.state for n in AlertNotification.objects.order_by("created_at")] == [
        "firing",
        "resolved",
    ]
    # The second process made both; the first, killed mid-evaluation, left nothing.
    assert second.log().count("alerts: dead letter (EchoAgent)") == 2
    assert "alerts:" not in first.log()
