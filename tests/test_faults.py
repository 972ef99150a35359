"""Crash tests: worker and embedder processes SIGKILLed by whole process groups
while they hold leases, message readers killed holding messages, and the PostgreSQL
server crash-restarted (``pg_ctl stop -m immediate``) under the survivors.

What each proves: every piece of work is done exactly once; every orphaned lease is
taken up again within the lease plus 5 s of the kill; and the surviving processes
carry on through the restart without being restarted themselves (same PIDs)."""

from __future__ import annotations

import socket
from datetime import datetime, timedelta

import pytest
from django.db import connection

from agents_app import messaging
from agents_app.models import AgentEvent, AgentMessage, EmbeddingJob
from task_queue import operations
from task_queue.models import Task, TaskHistory, TaskStatus
from task_queue.operations import TaskSpec
from tests.support.database import count_rows
from tests.support.embedded import crash_restart, skip_unless_embedded
from tests.support.processes import ManageProcess, WorkerProcess, kill_group
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

LEASE = 2.0
RESCUE_BOUND = timedelta(seconds=LEASE + 5)


def database_now() -> datetime:
    with connection.cursor() as cursor:
        cursor.execute("SELECT clock_timestamp()")
        return cursor.fetchone()[0]


def kill_now(process: ManageProcess) -> datetime:
    """SIGKILL the process's group; the database's time right after."""
    kill_group(process)
    return database_now()


# ------------------------------------------------------------------ workers

WORKER_OPTIONS = ("--lease", str(LEASE), "--reaper-interval", "0.2", "--concurrency", "4")


def enqueue_echoes(count: int) -> None:
    operations.enqueue_many(
        [TaskSpec("EchoAgent", "echo", {"sleep_ms": 300}) for _ in range(count)]
    )


def orphan_tasks(worker: WorkerProcess) -> tuple[list, datetime]:
    """Wait until ``worker`` runs tasks, kill its group: the tasks it held, and when."""
    owner = worker.worker_id
    wait_for(
        lambda: Task.objects.filter(lease_owner=owner, status=TaskStatus.RUNNING).exists(),
        what=f"worker {owner} to run tasks",
    )
    killed_at = kill_now(worker)
    held = list(Task.objects.filter(lease_owner=owner).values_list("id", flat=True))
    assert held
    return held, killed_at


def wait_rescued(held: list, dead_owner: str) -> None:
    wait_for(
        lambda: (
            not Task.objects.filter(id__in=held, lease_owner=dead_owner).exists()
            and not Task.objects.filter(id__in=held, status=TaskStatus.PENDING).exists()
        ),
        timeout=LEASE + 10,
        what="the orphaned tasks to be claimed again",
    )


def rescue_delays(held: list, killed_at: datetime) -> list[timedelta]:
    """Per orphaned task: from the kill to the start of the attempt that took it up."""
    delays = []
    for task_id in held:
        restarts = TaskHistory.objects.filter(task_id=task_id, started_at__gt=killed_at)
        first = min(restarts.values_list("started_at", flat=True))
        delays.append(first - killed_at)
    return delays


def test_workers_survive_group_kills_and_a_database_crash(worker_processes):
    skip_unless_embedded()
    survivors = [worker_processes("EchoAgent", *WORKER_OPTIONS).wait_ready() for _ in range(2)]
    survivor_ids = {worker.worker_id for worker in survivors}
    delays: list[timedelta] = []

    def kill_round() -> None:
        doomed = worker_processes("EchoAgent", *WORKER_OPTIONS).wait_ready()
        owner = doomed.worker_id
        enqueue_echoes(60)
        held, killed_at = orphan_tasks(doomed)
        wait_rescued(held, owner)
        wait_for(
            lambda: (
                TaskHistory.objects.filter(task_id__in=held, started_at__gt=killed_at).count()
                >= len(held)
            ),
            timeout=30,
            what="the rescuing attempts to end",
        )
        delays.extend(rescue_delays(held, killed_at))

    kill_round()
    kill_round()
    enqueue_echoes(60)
    wait_for(
        lambda: Task.objects.filter(status=TaskStatus.RUNNING).count() >= 4,
        what="the survivors to be busy",
    )
    crash_restart()
    restarted_at = database_now()
    kill_round()
    total = Task.objects.count()
    wait_for(
        lambda: Task.objects.filter(status=TaskStatus.COMPLETED).count() == total,
        timeout=60,
        what="every task to complete",
    )

    # Exactly once: one completion in the history, one AgentEvent, per task.
    assert (
        count_rows(
            "SELECT count(*) FROM (SELECT task_id FROM task_history WHERE event = 'completed' "
            "GROUP BY task_id HAVING count(*) = 1) once"
        )
        == total
    )
    assert TaskHistory.objects.filter(event="completed").count() == total
    assert count_rows("SELECT count(DISTINCT task_id) FROM agent_events") == total
    assert AgentEvent.objects.count() == total
    # Every orphan was taken up again within the lease plus 5 s.
    assert delays and max(delays) <= RESCUE_BOUND, sorted(delays)[-3:]
    # The survivors rode out the crash in the same processes and went on working.
    for worker in survivors:
        assert worker.process.poll() is None, worker.log()
        assert "listener connection failed" in worker.log()
    after = TaskHistory.objects.filter(event="completed", occurred_at__gt=restarted_at)
    assert set(after.values_list("actor", flat=True)) >= survivor_ids
    print(f"rescue delays: max {max(delays).total_seconds():.2f} s over {len(delays)} tasks")


# ------------------------------------------------------------------ embedders

EMBEDDER_OPTIONS = ("--batch", "1", "--poll", "0.2", "--lease", "4")


def slow_texts(count: int) -> None:
    """Agent events whose text takes the hashing embedder a good part of a second,
    so an embedder is caught holding a lease. Their jobs may be tried 10 times, not 3:
    one job can lose an attempt to each kill round and to the crash (more on a machine
    busy with other tests), and this test is about rescue, not about giving up."""
    for n in range(count):
        text = " ".join(f"w{n}x{i}" for i in range(150_000))
        event = AgentEvent.objects.create(agent_name="EchoAgent", event_type="x", content=text)
        EmbeddingJob.objects.create(agent_event=event, max_attempts=10)


def test_embedders_survive_group_kills_and_a_database_crash(manage_processes):
    skip_unless_embedded()
    survivors = [manage_processes("runembedder", *EMBEDDER_OPTIONS) for _ in range(2)]
    orphans: set[int] = set()
    rescued: set[int] = set()

    def kill_round() -> None:
        doomed = manage_processes("runembedder", *EMBEDDER_OPTIONS)
        owner = f"{socket.gethostname()}:{doomed.pid}"
        wait_for(lambda: "embedding agent events" in doomed.log(), what="the embedder to start")
        slow_texts(6)
        held = wait_for(
            lambda: list(
                EmbeddingJob.objects.filter(lease_owner=owner).values_list("id", flat=True)
            ),
            timeout=60,
            what=f"embedder {owner} to hold a job",
        )
        kill_now(doomed)
        held = list(
            EmbeddingJob.objects.filter(id__in=held, lease_owner=owner).values_list("id", flat=True)
        )
        assert held, "the doomed embedder finished its job before the kill"
        orphans.update(held)

        def taken_up() -> bool:
            for job in EmbeddingJob.objects.filter(id__in=held):
                if job.status == "completed" or job.lease_owner not in (None, owner):
                    rescued.add(job.id)
            return rescued >= set(held)

        # Within 30 s: the lease (4 s), then a survivor's next pass, which waits for the
        # slow text it is embedding (a few seconds each on a slow machine; a bound of
        # the lease plus 5 s failed on a machine half as fast as the others).
        wait_for(taken_up, timeout=30, what="the orphaned jobs to be taken up again")

    kill_round()
    kill_round()
    wait_for(
        lambda: EmbeddingJob.objects.filter(status="leased").exists(),
        what="the survivors to be embedding",
    )
    crash_restart()
    # The survivors reconnect with backoff; the last round measures rescue by lease
    # expiry, so it starts once one of them embeds again (a claim since the restart).
    restarted_at = database_now()
    slow_texts(2)
    wait_for(
        lambda: (
            EmbeddingJob.objects.filter(updated_at__gt=restarted_at)
            .exclude(status="pending")
            .exists()
        ),
        timeout=60,
        what="a survivor to embed again after the crash",
    )
    kill_round()
    unfinished = EmbeddingJob.objects.exclude(status="completed")
    wait_for(
        lambda: not unfinished.exists(),
        timeout=60,
        what="every job to complete",
        describe=lambda: {
            "now": database_now(),
            "embedders alive": [embedder.process.poll() is None for embedder in survivors],
            "unfinished": list(
                unfinished.values(
                    "id", "status", "attempts", "lease_owner", "lease_expires_at", "available_at"
                )[:5]
            ),
        },
    )

    assert not AgentEvent.objects.filter(embedding=None).exists()
    for job in EmbeddingJob.objects.filter(id__in=orphans):
        assert job.attempts >= 2, job.id  # the killed embedder's claim counted
    for embedder in survivors:
        assert embedder.process.poll() is None, embedder.log()
        assert "embedding failed" in embedder.log()


# ------------------------------------------------------------------ message readers

# A reader as an agent would write one: receive, work, acknowledge; a lost connection
# (the database restarting) is waited out. It reports each message it holds and each
# acknowledgement the database accepted.
READER = f"""
import time
LEASE = {LEASE}
from django.db import connection
from agents_app.messaging import ack, receive
from task_queue.retry import CONNECTION_ERRORS
print("ready", flush=True)
while True:
    try:
        for message in receive("FitmentAgent", limit=1, visibility_timeout=LEASE, wait=1):
            print("holding", message.id, flush=True)
            time.sleep(0.3)  # the work
            if ack(message):
                print("acked", message.id, flush=True)
    except CONNECTION_ERRORS as error:
        print("connection lost:", error, flush=True)
        connection.close()
        time.sleep(0.2)
"""


def reader_lines(reader: ManageProcess, word: str) -> list[str]:
    return [line.split()[1] for line in reader.log().splitlines() if line.startswith(word + " ")]


def test_message_readers_killed_holding_messages_each_message_acked_once(manage_processes):
    skip_unless_embedded()
    survivors = [manage_processes("shell", "-c", READER) for _ in range(2)]
    readers = list(survivors)
    orphans: dict[str, datetime] = {}

    def kill_round() -> None:
        doomed = manage_processes("shell", "-c", READER)
        readers.append(doomed)
        wait_for(lambda: "ready" in doomed.log(), timeout=60, what="the reader to start")
        for n in range(20):
            messaging.send("PricingAgent", "FitmentAgent", "task_request", {"n": n})
        held = wait_for(lambda: reader_lines(doomed, "holding"), what="the reader to hold one")
        killed_at = kill_now(doomed)
        for message_id in set(held) - set(reader_lines(doomed, "acked")):
            orphans[message_id] = killed_at
        wait_for(
            lambda: (
                not AgentMessage.objects.filter(id__in=orphans)
                .exclude(status="acknowledged")
                .exists()
            ),
            timeout=LEASE + 10,
            what="the orphaned messages to be acknowledged by another reader",
        )

    kill_round()
    kill_round()
    crash_restart()
    kill_round()
    wait_for(
        lambda: not AgentMessage.objects.exclude(status="acknowledged").exists(),
        timeout=60,
        what="every message to be acknowledged",
    )

    acked = [message_id for reader in readers for message_id in reader_lines(reader, "acked")]
    assert len(acked) == len(set(acked)), "a message was acknowledged twice"
    assert orphans and set(orphans) <= set(acked)
    # Delivered again (delivered_at: the last delivery) within the lease plus 5 s.
    for message in AgentMessage.objects.filter(id__in=orphans):
        assert message.delivery_count >= 2
        assert message.delivered_at - orphans[str(message.id)] <= RESCUE_BOUND
    for reader in survivors:
        assert reader.process.poll() is None, reader.log()
        assert "connection lost" in reader.log()
