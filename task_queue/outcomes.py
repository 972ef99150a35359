"""Writes task outcomes in batches, off the handlers' threads.

Handlers finish one by one; their outcomes queue up here while the previous batch
is being written, so under load each statement records many tasks and at low load
a lone outcome is written at once. Each kind of outcome is one fenced statement
(see ``task_queue.sql.outcomes``): a task whose lease this worker lost is refused and logged.
"""

from __future__ import annotations

import json
import logging
import queue
import threading
import time
from collections.abc import Callable
from datetime import datetime
from uuid import UUID

from django.db import DatabaseError, connection, transaction

from task_queue.sql import enqueue as enqueue_sql
from task_queue.sql import outcomes as outcomes_sql

from . import blobs
from .execution import Outcome, OutcomeKind, unrecordable
from .retry import CONNECTION_ERRORS, Backoff
from .task_logging import about_task

logger = logging.getLogger(__name__)

MAX_BATCH = 500
_STOP = object()


class OutcomeWriter:
    def __init__(
        self,
        owner: str,
        now: Callable[[], datetime | None],
        written: threading.Event,
        on_written: Callable[[list[tuple[UUID, UUID]]], None] | None = None,
    ) -> None:
        """``written`` is set after every batch: a retried task may be due at once.
        ``on_written`` gets the (task, lease token) of each batch's outcomes once the
        batch is committed (or refused)."""
        self.owner = owner
        self.now = now
        self._written_event = written
        self._on_written = on_written
        self.written = 0  # outcomes recorded (including refused ones)
        self.refused = 0
        self._unwritten = 0
        self._count_lock = threading.Lock()
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="outcome-writer", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def put(self, outcome: Outcome) -> None:
        with self._count_lock:
            self._unwritten += 1
        self._queue.put(outcome)

    def idle(self) -> bool:
        """Whether every outcome put so far has been written."""
        with self._count_lock:
            return self._unwritten == 0

    def close(self, timeout: float) -> None:
        """Write what is queued, then stop."""
        self._queue.put(_STOP)
        self._thread.join(timeout)

    def _run(self) -> None:
        stopping = False
        while not stopping:
            batch = [self._queue.get()]
            while len(batch) < MAX_BATCH:
                try:
                    batch.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            if _STOP in batch:
                stopping = True
                batch = [o for o in batch if o is not _STOP]
            if batch:
                self._write_with_retry(batch)
        connection.close()

    def _write_with_retry(self, batch: list[Outcome]) -> None:
        """Write ``batch``, waiting out a lost connection; never drop it silently.

        Connection trouble (the database restarting) is retried with backoff, keeping
        the outcomes: leases may expire meanwhile, and fencing then refuses the late
        write. A batch the database refuses for its content is written one outcome
        at a time, so one bad outcome cannot hold up the others.
        """
        backoff = Backoff()
        while True:
            try:
                self._write(batch)
                return
            except CONNECTION_ERRORS as error:
                delay = backoff.next()
                logger.warning(
                    "writing %d outcomes failed (%s); retrying in %.1f s", len(batch), error, delay
                )
                connection.close()
                time.sleep(delay)
            except DatabaseError as error:
                if len(batch) > 1:
                    for outcome in batch:
                        self._write_with_retry([outcome])
                    return
                self._write_refused(batch[0], error)
                return

    def _write_refused(self, outcome: Outcome, error: DatabaseError) -> None:
        """The database refused this outcome itself: record the task as failed with the
        reason instead; if even that is refused, leave the task to the reaper."""
        with about_task(outcome.task, self.owner):
            logger.error("could not record the outcome of task %s: %s", outcome.task.id, error)
        replacement = unrecordable(outcome, error)
        if replacement is not outcome:
            self._write_with_retry([replacement])
            return
        with self._count_lock:
            self._unwritten -= 1
        self.refused += 1
        self.written += 1
        self._written_event.set()
        if self._on_written is not None:
            self._on_written([(outcome.task.id, outcome.task.lease_token)])

    def _write(self, batch: list[Outcome]) -> None:
        with outcomes_sql.writing_outcomes():
            recorded = write_outcomes(self.owner, batch, self.now())
        refused = [o for o in batch if o.task.id not in recorded]
        for outcome in refused:
            with about_task(outcome.task, self.owner):
                logger.warning(
                    "lease lost before the outcome of task %s was written; refused",
                    outcome.task.id,
                )
        self.refused += len(refused)
        self.written += len(batch)
        with self._count_lock:
            self._unwritten -= len(batch)
        self._written_event.set()
        if self._on_written is not None:  # (only with --dispatch: not on the hot path)
            self._on_written([(o.task.id, o.task.lease_token) for o in batch])


def write_outcomes(
    owner: str, batch: list[Outcome], now: datetime | None
) -> dict[UUID, tuple[str, datetime | None]]:
    """Record ``batch``, outcomes of tasks leased to ``owner``: one fenced statement per
    kind of outcome (the outcome writer's, and the worker protocol's over HTTP).
    Returns {task id: (its new status, when it is due again if retried)} for the tasks
    whose lease still held; the others were refused and nothing was written for them."""
    by_kind: dict[OutcomeKind, list[Outcome]] = {}
    for outcome in batch:
        by_kind.setdefault(outcome.kind, []).append(outcome)
    recorded: dict[UUID, tuple[str, datetime | None]] = {}
    if done := by_kind.get(OutcomeKind.COMPLETED):
        # Results in blobs are checked (or written again) under their blobs' locks
        # in the transaction that references them: see task_queue.blobs.
        with transaction.atomic(savepoint=False):  # (the writer's own transaction, if any)
            for o in done:
                if o.result_ref:
                    blobs.keep(o.result_blob)
            completed = outcomes_sql.complete_tasks(
                owner=owner,
                done=[
                    (o.task.id, o.task.lease_token, o.result_json, o.result_ref, o.summary)
                    for o in done
                ],
                now=now,
            )
        recorded |= dict.fromkeys(completed, ("completed", None))
    if failed := by_kind.get(OutcomeKind.FAILED):
        rows = outcomes_sql.fail_tasks(
            owner=owner,
            failures=[
                (o.task.id, o.task.lease_token, o.retryable, o.base_delay, o.error_json)
                for o in failed
            ],
            now=now,
        )
        recorded |= {
            task_id: (status, available_at if status == "pending" else None)
            for task_id, status, _attempts, available_at in rows
        }
        # Once committed (at once outside a transaction): the caller's may still roll back.
        transaction.on_commit(lambda: log_failures(owner, failed, rows))
    if cancelled := by_kind.get(OutcomeKind.CANCELLED):
        confirmed = outcomes_sql.confirm_cancelled(
            owner=owner, held=[(o.task.id, o.task.lease_token) for o in cancelled], now=now
        )
        recorded |= dict.fromkeys(confirmed, ("cancelled", None))
    return recorded


def release(owner: str, held: list[tuple[UUID, UUID]], now: datetime | None) -> dict[UUID, str]:
    """Give ``owner``'s unfinished tasks back (pending and due now, no attempt counted;
    ``cancelled`` where a cancel was requested) and wake their agents' workers, in one
    transaction (the caller's, if any: no savepoint); {task id: new status} of those
    whose lease still held."""
    with transaction.atomic(savepoint=False):
        released = outcomes_sql.release_tasks(owner=owner, held=held, now=now)
        enqueue_sql.notify_agents([agent for _, agent, status in released if status == "pending"])
    return {task_id: status for task_id, _, status in released}


def log_outcome(outcome: Outcome) -> None:
    """A debug line for a handler's outcome other than a failure (inside the task's
    ``about_task``); failures are logged once written (``log_failures``)."""
    if outcome.kind is not OutcomeKind.FAILED and logger.isEnabledFor(logging.DEBUG):
        logger.debug("task %s %s", outcome.task.id, outcome.kind.value)


# How each new status of a failed attempt is logged: at the default level (INFO) an
# operator sees every failure, and a task that ended badly stands out.
FAILURE_LEVELS = {
    "pending": logging.INFO,  # retried after its backoff
    "cancelled": logging.INFO,  # a cancel was requested while it ran
    "failed": logging.WARNING,  # the agent said not to retry it
    "dead": logging.ERROR,  # every attempt failed
}


def log_failures(owner: str, failed: list[Outcome], rows: list[tuple]) -> None:
    """A line per failed attempt written (``rows``: id, new status, attempts counted,
    when due again), about its task (``task_id``, ``trace_id``, ``agent``, ``attempt``,
    ``worker``: docs/operations.md), with the error's type and message."""
    by_id = {outcome.task.id: outcome for outcome in failed}
    for task_id, status, attempts, available_at in rows:
        outcome = by_id[task_id]
        error = json.loads(outcome.error_json)
        task = outcome.task
        if status == "pending":
            again = available_at.isoformat()
            what = f"attempt {attempts} of {task.max_attempts} failed; retried at {again}"
        elif status == "dead":
            what = f"is dead: all {attempts} attempts failed"
        elif status == "failed":
            what = "failed, not to be retried"
        else:
            what = f"is {status}"
        with about_task(task, owner):
            logger.log(
                FAILURE_LEVELS.get(status, logging.WARNING),
                "task %s %s: %s: %s",
                task_id,
                what,
                error["type"],
                error["message"],
                extra={"status": status, "error_type": error["type"]},
            )
