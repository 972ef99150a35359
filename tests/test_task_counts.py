"""The running totals of tasks by agent and status, of the tasks finished in the last
hour by 10-second bucket, and Prometheus's counters and histograms
(``task_queue.sql.counts``, kept by the triggers of migrations ``queue 0014``, ``0028``
and ``0029``) equal a full count of the tables, whatever path changed the tasks:
enqueue, real workers completing, failing and retrying, the reaper after a SIGKILL,
revive, cancel, run now, retention, deletes, a TRUNCATE. (Prometheus's counters
never drop: once retention or a delete has taken rows, they keep what they had.)"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from unittest.mock import ANY

import pytest
from django.conf import settings
from django.contrib.auth.models import User
from django.db import connection, transaction
from django.db.models import Count, F
from django.test import Client

from task_queue import operations, prometheus, stats
from task_queue.listen import listening
from task_queue.maintenance import retention
from task_queue.models import HISTOGRAM_BOUNDS, Task, TaskEvent, TaskHistory, TaskStatus
from task_queue.operations import TaskSpec
from task_queue.sql import counts, db
from task_queue.sql import metrics as metrics_sql
from task_queue.sql import outcomes as outcomes_sql
from task_queue.sql.channels import TASK_CHANGES_CHANNEL
from tests.support.processes import kill
from tests.support.queue import OWNER, claim_and_start, complete_pending, fail_pending
from tests.support.waiting import wait_for

ACTOR = "counts-test"
ALL_TIME = 10_000 * 365 * 86400  # one bucket


def full_count() -> dict[tuple[str, str], int]:
    rows = Task.objects.order_by().values_list("agent_name", "status").annotate(n=Count("id"))
    return {(agent, status): n for agent, status, n in rows}


def running_totals() -> dict[tuple[str, str], int]:
    return {(agent, status): n for agent, status, n in stats.task_counts()}


# The tasks finished in the last hour by (10-second bucket, agent, status): as the
# finish counters sum them, and as a count of the table.
FINISHES_COUNTED = """
SELECT bucket_start, agent_name, status, sum(n)::bigint FROM task_finish_counts
WHERE bucket_start >= now() - interval '1 hour'
GROUP BY 1, 2, 3 HAVING sum(n) <> 0
"""
FINISHES_OF_TASKS = """
SELECT date_bin('10 seconds', finished_at, 'epoch'), agent_name, status, count(*)
FROM tasks
WHERE status IN ('completed', 'failed', 'dead', 'cancelled')
  AND date_bin('10 seconds', finished_at, 'epoch') >= now() - interval '1 hour'
GROUP BY 1, 2, 3
"""


def finishes(statement: str) -> dict[tuple, int]:
    return {tuple(key): n for *key, n in db.fetch(statement, {})}


def in_one_snapshot(*reads: Callable[[], object]) -> list[object]:
    """What each of ``reads`` returns, all read in one REPEATABLE READ snapshot, so
    they must agree even while workers write (a test already in a transaction has no
    other writer, and reads in it)."""
    if connection.in_atomic_block:
        return [read() for read in reads]
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        return [read() for read in reads]


def assert_exact() -> None:
    totals, counted, finish_totals, finishes_counted = in_one_snapshot(
        running_totals,
        full_count,
        lambda: finishes(FINISHES_COUNTED),
        lambda: finishes(FINISHES_OF_TASKS),
    )
    assert totals == counted
    assert finish_totals == finishes_counted


def counters_of_history() -> dict[str, dict]:
    """Per agent, the Prometheus counters and histograms computed afresh from tasks
    and task_history, as one rollup bucket over all time."""
    since, until = datetime(1970, 1, 1, tzinfo=UTC), datetime(9999, 1, 1, tzinfo=UTC)
    rows = metrics_sql.compute_metrics(ALL_TIME, since, until)
    # Leases the reaper expired: its history rows (the rollups do not count them).
    expired = dict(
        TaskHistory.objects.filter(event=TaskEvent.LEASE_EXPIRED)
        .order_by()
        .values_list("task__agent_name")
        .annotate(n=Count("id"))
    )
    return {
        row["agent_name"]: _counters(
            {**row, "tasks_lease_expired": expired.get(row["agent_name"], 0)}
        )
        for row in rows
    }


def _counters(figures: dict) -> dict:
    slots = len(HISTOGRAM_BOUNDS) + 1
    return {
        **{f"tasks_{name}": figures[f"tasks_{name}"] for name in prometheus.COUNTERS},
        **{
            f"{key}_histogram": figures[f"{key}_histogram"] or [0] * slots
            for key in prometheus.HISTOGRAMS
        },
        **{f"{key}_sum": pytest.approx(figures[f"{key}_sum"]) for key in prometheus.HISTOGRAMS},
    }


def assert_counters_match_history() -> dict[str, dict]:
    """Prometheus's counters equal a computation from the tables, both read in one
    snapshot (while nothing was deleted); returns them."""
    counters, computed = in_one_snapshot(prometheus.cumulative_totals, counters_of_history)
    assert {agent: _counters(figures) for agent, figures in counters.items()} == computed
    return counters


def shards() -> set[int]:
    """The shards of the task counters and of Prometheus's."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT shard FROM task_counts UNION SELECT shard FROM task_totals")
        return {row[0] for row in cursor.fetchall()}


@pytest.mark.django_db
def test_the_totals_follow_every_kind_of_statement():
    operations.enqueue_many(
        [TaskSpec("EchoAgent", "echo", {"n": n}) for n in range(12)]
        + [TaskSpec("FitmentAgent", "generate_fitment", delay_seconds=600) for _ in range(3)]
    )
    assert running_totals() == {("EchoAgent", "pending"): 12, ("FitmentAgent", "pending"): 3}
    complete_pending("EchoAgent")
    assert_exact()
    operations.enqueue_many([TaskSpec("EchoAgent", "echo", {"n": n}) for n in range(4)])
    failed = fail_pending("EchoAgent", retryable=False)
    assert len(failed) == 4
    assert_exact()
    operations.revive([task_id for task_id, *_ in failed[:2]], actor=ACTOR)
    operations.cancel([task_id for task_id, *_ in failed[2:]], actor=ACTOR)
    assert_exact()
    counters = assert_counters_match_history()["EchoAgent"]
    assert (counters["tasks_created"], counters["tasks_completed"]) == (16, 12)
    assert (counters["tasks_failed"], counters["tasks_cancelled"]) == (4, 2)
    Task.objects.filter(agent_name="FitmentAgent").update(status=TaskStatus.CANCELLED)
    five = list(Task.objects.filter(status=TaskStatus.COMPLETED).values_list("id", flat=True)[:5])
    Task.objects.filter(id__in=five).delete()
    assert_exact()
    assert running_totals()[("EchoAgent", "completed")] == 7
    # Finish times moved back (as test_metrics does) and out of the last hour.
    completed = Task.objects.filter(status=TaskStatus.COMPLETED)
    completed.filter(id__in=list(completed.values_list("id", flat=True)[:3])).update(
        finished_at=F("finished_at") - timedelta(minutes=7)
    )
    completed.filter(id__in=list(completed.values_list("id", flat=True)[:1])).update(
        finished_at=F("finished_at") - timedelta(minutes=75)
    )
    assert_exact()
    # 6 completed (one moved out of the hour), 2 cancelled by the operator (the
    # FitmentAgent tasks set cancelled by hand have no finish time)
    assert sum(finishes(FINISHES_COUNTED).values()) == 6 + 2
    with connection.cursor() as cursor:
        cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")  # no checks pending at TRUNCATE
        cursor.execute("TRUNCATE tasks CASCADE")
    assert running_totals() == {} == full_count()
    assert finishes(FINISHES_COUNTED) == {}
    assert counts.task_totals() == []  # Prometheus's counters start again


@pytest.mark.django_db
def test_a_claim_and_a_completion_count_once_beside_other_changes_in_their_transaction():
    # In one transaction, with changes after each: every statement counted once.
    operations.enqueue_many([TaskSpec("EchoAgent", "echo", {"n": n}) for n in range(6)])
    with transaction.atomic():
        held = claim_and_start("EchoAgent")
        Task.objects.filter(id=held[0][0]).update(status=TaskStatus.CANCELLED)
        assert_exact()
        done = [(i, token, "{}", None, "done") for i, token in held[1:4]]
        assert len(outcomes_sql.complete_tasks(owner=OWNER, done=done, now=None)) == 3
        operations.cancel([held[4][0]], actor=ACTOR)  # running: asked to stop only
        Task.objects.filter(id=held[5][0]).update(status=TaskStatus.PENDING)
        assert_exact()
    assert running_totals() == {
        ("EchoAgent", "cancelled"): 1,
        ("EchoAgent", "completed"): 3,
        ("EchoAgent", "running"): 1,
        ("EchoAgent", "pending"): 1,
    }


@pytest.mark.django_db(transaction=True)
def test_a_claim_and_a_completion_each_tell_the_dashboard_of_their_tasks():
    task_ids = {e.id for e in operations.enqueue_many([TaskSpec("EchoAgent", "echo")] * 3)}
    with listening(TASK_CHANGES_CHANNEL) as listener:
        complete_pending("EchoAgent")  # a claim, then a completion, each committed
        # Notifications arrive in commit order: everything before this one was sent by
        # the claim and the completion.
        db.execute("SELECT pg_notify(%(channel)s, 'end')", {"channel": TASK_CHANGES_CHANNEL})
        payloads = []
        for notification in listener.notifies(timeout=10):
            if notification.payload == "end":
                break
            payloads.append(json.loads(notification.payload))
    assert payloads == [
        {"tasks": ANY, "more": 0, "left": 0, "arrived": 0},
        {"tasks": ANY, "more": 0, "left": 0, "arrived": 0},
    ]
    claimed, completed = ([tuple(t) for t in payload["tasks"]] for payload in payloads)
    assert sorted(claimed) == sorted((str(i), "pending", "running") for i in task_ids)
    assert sorted(completed) == sorted((str(i), "running", "completed") for i in task_ids)


@pytest.mark.django_db
def test_folding_ended_backends_keeps_the_sums_and_the_live_rows():
    operations.enqueue_many([TaskSpec("EchoAgent", "echo") for _ in range(5)])
    ended = 2**31 - 1  # no backend has this pid
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO task_counts VALUES ('EchoAgent', 'pending', %s, 3),"
            " ('EchoAgent', 'pending', 0, -3)",
            [ended],
        )
        cursor.execute(
            "INSERT INTO task_totals VALUES ('EchoAgent', 'run_time', 3, %s, 2, 0.5),"
            " ('EchoAgent', 'run_time', 3, 0, 1, 0.25)",
            [ended],
        )
        cursor.execute("SELECT pg_backend_pid()")
        (own,) = cursor.fetchone()
    before, counters = running_totals(), counts.task_totals()
    assert counts.fold_ended_backends() == 1
    assert running_totals() == before == {("EchoAgent", "pending"): 5}
    assert (
        sorted(counts.task_totals())
        == sorted(counters)
        == [
            ("EchoAgent", "created", 0, 5, 0.0),
            ("EchoAgent", "run_time", 3, 3, 0.75),
        ]
    )
    assert shards() == {0, own}  # this backend is alive: its rows stay its own


@pytest.mark.django_db
def test_the_admins_unfiltered_task_list_is_counted_from_the_totals():
    operations.enqueue_many([TaskSpec("EchoAgent", "echo") for _ in range(3)])
    admin = Client()
    admin.force_login(User.objects.create_superuser("root", "", "pw"))
    assert b"3 tasks" in admin.get("/admin/queue/task/").content
    with connection.cursor() as cursor:  # totals that disagree with the table
        cursor.execute("UPDATE task_counts SET n = n + 1000")
    assert b"1003 tasks" in admin.get("/admin/queue/task/").content
    filtered = admin.get("/admin/queue/task/", {"status__exact": "pending"}).content
    assert b"3 tasks" in filtered  # a filtered list is counted in the table


@pytest.mark.django_db(transaction=True)
@pytest.mark.slow
def test_the_totals_stay_exact_through_a_mixed_workload_with_crashes(worker_processes, runs_table):
    specs = (
        [TaskSpec("EchoAgent", "echo", {"n": n}) for n in range(150)]
        + [TaskSpec("EchoAgent", "echo", {"fail": "permanent"}) for _ in range(20)]
        + [TaskSpec("EchoAgent", "echo", {"fail": "transient"}, max_attempts=1)] * 20
        + [TaskSpec("EchoAgent", "echo", {"fail": "transient", "fail_times": 1})] * 10
        + [TaskSpec("EchoAgent", "echo", {"sleep_ms": 120_000}) for _ in range(4)]
        + [TaskSpec("EchoAgent", "echo", {"later": n}, delay_seconds=3600) for n in range(10)]
    )
    enqueued = [e.id for e in operations.enqueue_many(specs)]
    sleepers, later = enqueued[200:204], enqueued[204:]
    workers = [worker_processes("EchoAgent", "--concurrency", "8") for _ in range(2)]
    for worker in workers:
        worker.wait_ready()
    # Mid-drain, the totals agree with a count in the same snapshot.
    for _ in range(5):
        assert_exact()
        assert_counters_match_history()
    wait_for(_drained, what="the drain up to the retries' backoff and the sleepers")
    assert_exact()
    assert_counters_match_history()

    # Operator actions: run the retries now (unless their backoff ended meanwhile),
    # revive the dead letter, cancel the running sleepers (their workers end them)
    # and half the delayed tasks.
    for task in Task.objects.filter(status=TaskStatus.PENDING, payload__fail="transient"):
        with contextlib.suppress(operations.TaskNotPending):
            operations.run_now(task.id, actor=ACTOR)
    dead_letter = list(
        Task.objects.filter(status__in=["dead", "failed"]).values_list("id", flat=True)
    )
    assert len(dead_letter) == 40
    operations.revive(dead_letter, actor=ACTOR)
    operations.cancel(sleepers + later[:5], actor=ACTOR)
    assert_exact()
    wait_for(
        lambda: (
            Task.objects.filter(status=TaskStatus.CANCELLED).count() == 9
            and Task.objects.filter(status__in=["dead", "failed"]).count() == 40
            and Task.objects.filter(status=TaskStatus.COMPLETED).count() == 160
        ),
        what="the revived, cancelled and retried tasks to end",
        timeout=60,
    )
    assert_exact()
    assert_counters_match_history()

    # A worker SIGKILLed while it runs a task: the reaper gives the task back and
    # another worker completes it.
    lease = ["--lease", "1.5", "--reaper-interval", "0.2", "--concurrency", "1"]
    doomed = worker_processes("CrashTest", *lease).wait_ready()
    crash_id = operations.enqueue("CrashTest", "crash", {"hang_seconds": 300}).id
    wait_for(
        lambda: Task.objects.filter(id=crash_id, status=TaskStatus.RUNNING).exists(),
        what="the crash task to run",
    )
    kill(doomed)
    worker_processes("CrashTest", *lease).wait_ready()
    wait_for(
        lambda: Task.objects.filter(id=crash_id, status=TaskStatus.COMPLETED).exists(),
        what="the crash task's recovery",
    )
    assert_exact()
    before_pruning = assert_counters_match_history()
    assert before_pruning["CrashTest"]["tasks_retried"] == 1  # the reaper gave it back

    # Retention prunes every finished task; a delete takes the rest of the delayed.
    # Prometheus's counters keep what they had.
    far = db.database_clock() + timedelta(days=settings.QUEUE_RETENTION_DAYS + 1)
    pruned = retention.prune(now=far)
    assert pruned is not None and pruned.tasks == 170  # completed and cancelled
    assert_exact()
    Task.objects.filter(id__in=later[5:] + dead_letter).delete()
    assert_exact()
    assert running_totals() == {}
    assert prometheus.cumulative_totals() == before_pruning

    # The killed and stopped workers' counter rows fold into shard 0.
    for worker in workers:
        worker.stop()
    live = {row[0] for row in _pids()}  # a backend may end after this, not begin
    counts.fold_ended_backends()
    assert shards() <= {0} | live
    assert_exact()
    assert prometheus.cumulative_totals() == before_pruning


def _drained() -> bool:
    """Every task ended but the 4 sleepers (running), the 10 delayed and the 10
    retries not due yet (pending); the retries may have run once due."""
    rows = Task.objects.order_by().values_list("status").annotate(n=Count("id"))
    by_status = dict(rows)
    done = by_status.pop("completed", 0) + by_status.pop("pending", 0)
    return done == 170 and by_status == {"failed": 20, "dead": 20, "running": 4}


def _pids() -> list[tuple[int]]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pid FROM pg_stat_activity")
        return cursor.fetchall()
