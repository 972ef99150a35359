"""Which tasks became due, for ``relay_events --dispatch`` (seed 000 §3–§10).

A task becomes due at its ``available_at``, and who notices depends on how far that
lies after the change that made it pending (``updated_at``: an enqueue, a retry, a
reap, a release, a revive):

- at most ``HORIZON_SECONDS`` after (nearly every task: due at once, or a short
  backoff): the change's event, read from the stream with the relay's events. The
  task waits in memory until it is due, and its state is read again then;
- later (a delayed task, a long backoff): a scan of due times, with a bookmark in
  ``event_relay_cursors``, which rows committed long before they fall due.

So each due occurrence of a task is found once, and its command has a message_id of
its own (``Dispatch.message_id``). A command is published only for a task still
pending whose agent is not paused; when an agent is resumed, every task of it due by
then is published (a batch a pass), with new message ids. After a restart the scan
resumes from its bookmark, and the tasks that were waiting in memory are read again
from the table (those due within the horizon of their change and after the bookmark).

A command can still be lost (a broker that drops it, a queue deleted, an agent
paused and resumed while the relay was down): every
``QUEUE_DISPATCH_REPUBLISH_SECONDS`` the dispatcher publishes again up to a batch of
tasks due longer than that and still pending, going round all of them a batch at a
time, and ``runworker --dispatch`` keeps claiming by itself at its poll interval.
"""

from __future__ import annotations

import heapq
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from task_queue.event_stream import Envelope
from task_queue.relay.dispatch_commands import Dispatch
from task_queue.sql import db, dispatching

HORIZON_SECONDS = 60.0
# The most tasks read back into memory after a restart (due soon after their change).
RECOVERY_LIMIT = 100_000

# The events that make a task pending, and the reason its command gives.
EVENT_REASONS = {
    "evt.task.created.v1": "new_task",
    "evt.task.retry_scheduled.v1": "retry_due",
    "evt.task.lease_expired.v1": "lease_expired",
    "evt.task.released.v1": "lease_expired",  # given back by its worker: its lease ended
    "evt.task.revived.v1": "revived",
    "evt.task.updated.v1": None,  # an operator's edit: as a scan would say
}
_FIRST = datetime.min.replace(tzinfo=UTC)
_TICK = timedelta(microseconds=1)  # a timestamptz's resolution


def _reason_by_attempts(attempts: int) -> str:
    return "new_task" if attempts == 0 else "retry_due"


@dataclass(order=True)
class _Waiting:
    due_at: datetime
    task_id: uuid.UUID
    reason: str = field(compare=False)


class Dispatcher:
    """The dispatch side of one relay; its methods make database calls (the relay runs
    them on its database thread)."""

    def __init__(self, destination: str, *, batch: int, republish_seconds: float) -> None:
        self.destination = destination
        self.batch = batch
        self.republish_seconds = republish_seconds
        self.bookmark = _FIRST
        self._waiting: list[_Waiting] = []  # a heap by due time
        self._unconfirmed: list[_Waiting] = []  # fell due; their commands not confirmed
        self._republish_from = _FIRST
        self._next_republish = time.monotonic() + republish_seconds
        self.behind = False  # the last pass left more due now: run the next at once
        self._paused: set[str] = set()
        self._resumed: dict[str, datetime] = {}  # agent → how far its sweep has got

    def start(self) -> None:
        """Resume from the bookmark: read back the tasks that waited in memory (due
        within the horizon of their change, so by now + the horizon at the latest)."""
        self.bookmark = dispatching.dispatch_bookmark(self.destination) or _FIRST
        self._paused = dispatching.paused_agents()
        rows = dispatching.due_tasks(
            after=self.bookmark,
            through=db.database_clock() + timedelta(seconds=HORIZON_SECONDS),
            limit=RECOVERY_LIMIT,
            min_lead=0.0,
            max_lead=HORIZON_SECONDS,
        )
        for task_id, _agent, attempts, due_at, _trace in rows:
            heapq.heappush(self._waiting, _Waiting(due_at, task_id, _reason_by_attempts(attempts)))

    def due(self, events: Sequence[Envelope]) -> tuple[list[Dispatch], datetime]:
        """The commands to publish now, given the events just read, and the bookmark
        to record once they are confirmed (:meth:`published`)."""
        for waiting in self._unconfirmed:  # the last commands were not confirmed
            heapq.heappush(self._waiting, waiting)
        self._unconfirmed = []
        through = db.database_clock()
        scanned, bookmark, self.behind = self._page(
            self.bookmark, through, min_lead=HORIZON_SECONDS
        )
        commands = [
            Dispatch(task_id, agent, _reason_by_attempts(attempts), attempts, due_at, trace)
            for task_id, agent, attempts, due_at, trace in scanned
        ]
        reasons = {
            uuid.UUID(event.subject_id): EVENT_REASONS[event.kind]
            for event in events
            if event.kind in EVENT_REASONS
        }
        if reasons:
            rows = dispatching.dispatchable(list(reasons), horizon=HORIZON_SECONDS)
            for task_id, agent, attempts, due_at, trace, near in rows:
                # A task due later is the scan's, unless the scan has passed its due
                # time already (its row committed late: a long transaction).
                if not near and due_at > self.bookmark:
                    continue
                reason = reasons[task_id] or _reason_by_attempts(attempts)
                if due_at <= through:
                    commands.append(Dispatch(task_id, agent, reason, attempts, due_at, trace))
                else:
                    heapq.heappush(self._waiting, _Waiting(due_at, task_id, reason))
        commands += self._fall_due(through)
        commands += self._sweep_resumed(through)
        commands += self._republish(through)
        return commands, bookmark

    def _sweep_resumed(self, through: datetime) -> list[Dispatch]:
        """The tasks due of agents resumed since the last pass (none was published
        while they were paused), a page of each such agent a pass."""
        paused = dispatching.paused_agents()
        for agent in self._paused - paused:
            self._resumed[agent] = _FIRST
        self._paused = paused
        commands = []
        for agent, after in list(self._resumed.items()):
            rows, reached, more = self._page(after, through, agent=agent)
            if more:
                self._resumed[agent] = reached
                self.behind = True
            else:
                del self._resumed[agent]
            commands += [
                Dispatch(task_id, agent_, _reason_by_attempts(attempts), attempts, due, trace, True)
                for task_id, agent_, attempts, due, trace in rows
            ]
        return commands

    def _page(
        self, after: datetime, through: datetime, **bounds: float | str
    ) -> tuple[list[tuple], datetime, bool]:
        """Tasks due in (after, through], at least a batch of them where there are
        more, ending with every task of the last due time read; how far that went, and
        whether more are due by ``through``."""
        rows = dispatching.due_tasks(after=after, through=through, limit=self.batch, **bounds)
        if len(rows) < self.batch:
            return rows, through, False
        last = rows[-1][3]
        rows = [row for row in rows if row[3] < last]
        rows += dispatching.due_tasks(after=last - _TICK, through=last, limit=None, **bounds)
        return rows, last, True

    def published(self, bookmark: datetime) -> None:
        """The broker confirmed the commands of :meth:`due`: move the bookmark."""
        self.bookmark = bookmark
        self._unconfirmed = []
        dispatching.advance_dispatch_bookmark(self.destination, bookmark)

    def _fall_due(self, through: datetime) -> list[Dispatch]:
        """Commands for the waiting tasks due by ``through`` that are still pending
        then, with the due time they waited for."""
        fallen: dict[uuid.UUID, _Waiting] = {}
        while self._waiting and self._waiting[0].due_at <= through:
            waiting = heapq.heappop(self._waiting)
            fallen[waiting.task_id] = waiting
            self._unconfirmed.append(waiting)
        if not fallen:
            return []
        rows = dispatching.dispatchable(list(fallen), horizon=HORIZON_SECONDS)
        return [
            Dispatch(task_id, agent, fallen[task_id].reason, attempts, due_at, trace)
            for task_id, agent, attempts, due_at, trace, _near in rows
            if due_at == fallen[task_id].due_at  # else changed since: its own event says
        ]

    def _republish(self, now: datetime) -> list[Dispatch]:
        """Every republish interval, a batch of the tasks still pending that fell due
        longer than the interval ago, continuing where the last batch stopped."""
        if time.monotonic() < self._next_republish:
            return []
        self._next_republish = time.monotonic() + self.republish_seconds
        stale = now - timedelta(seconds=self.republish_seconds)
        rows, reached, more = self._page(self._republish_from, stale)
        self._republish_from = reached if more else _FIRST
        return [
            Dispatch(task_id, agent, _reason_by_attempts(attempts), attempts, due_at, trace, True)
            for task_id, agent, attempts, due_at, trace in rows
        ]
