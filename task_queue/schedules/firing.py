"""Firing schedules from the maintenance loop, exactly once per slot.

Each pass takes the enabled schedules whose ``next_run_at`` has come, one at a time:
it locks the row (``SKIP LOCKED``: another maintenance process has it), checks that
it is still due, enqueues the slot's task and moves ``next_run_at`` on, all in one
transaction. A process killed half-way commits nothing and leaves the row to the
next; a process that read the row before another committed sees, once it has the
lock, that it is no longer due. Beneath both, the slot's task has the idempotency
key ``schedule:<name>:<slot>``, and the queue keeps one task per key.

Slots missed while nothing ran: ``run_once`` fires the latest of them once; ``skip``
fires none. A slot is missed once a later one has come, or once it is older than
``QUEUE_SCHEDULE_GRACE_SECONDS``. Either way ``next_run_at`` becomes the first slot
after now.

Higher layers can hold back a kind of task until it can be useful
(:func:`register_guard`): the AnalyticsAgent's daily report waits until the day is
rolled up. The slot stays due meanwhile, and fires at the first pass the guard allows.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db import transaction

from task_queue import operations, schedules
from task_queue.models import Schedule
from task_queue.sql import db, locks

from . import times

logger = logging.getLogger(__name__)

# Schedules looked at per pass; the rest wait for the next pass.
BATCH = 100
# Guard(payload, now): whether a slot of this agent's task type may fire now.
Guard = Callable[[dict[str, Any], datetime], bool]
_guards: dict[tuple[str, str], Guard] = {}


def register_guard(agent_name: str, task_type: str, guard: Guard) -> None:
    """Hold back the slots of schedules of ``agent_name``'s ``task_type`` until
    ``guard(payload, now)`` is true (called at each pass while the slot is due)."""
    _guards[(agent_name, task_type)] = guard


def fire_due(*, now: datetime | None = None) -> int:
    """Fire every due slot (see the module's docstring); how many tasks were made."""
    clock = now or db.database_clock()
    due = Schedule.objects.filter(enabled=True, next_run_at__lte=clock).order_by("next_run_at")
    return sum(
        _fire(schedule_id, clock) for schedule_id in due.values_list("id", flat=True)[:BATCH]
    )


def _fire(schedule_id: int, clock: datetime) -> bool:
    with transaction.atomic():
        schedule = (
            Schedule.objects.select_for_update(skip_locked=True)
            .filter(id=schedule_id, enabled=True, next_run_at__lte=clock)
            .first()
        )
        if schedule is None:  # another process has it, or fired it a moment ago
            return False
        guard = _guards.get((schedule.agent_name, schedule.task_type))
        if guard is not None and not guard(schedule.payload, clock):
            return False
        slot = times.latest_slot(schedule.cron, schedule.interval_seconds, schedule.timezone, clock)
        grace = timedelta(seconds=settings.QUEUE_SCHEDULE_GRACE_SECONDS)
        on_time = slot == schedule.next_run_at and clock - slot <= grace
        fired = on_time or schedule.missed == Schedule.Missed.RUN_ONCE
        error = ""
        if fired:
            key = schedules.slot_key(schedule.name, slot)
            try:
                task = operations.enqueue_many([schedules.task_spec(schedule, key)], indexed=False)
            except (operations.InvalidTask, operations.IdempotencyConflict) as refused:
                # An agent no longer registered, say: the slot passes, the row says why.
                logger.warning(
                    "schedule %r: slot %s made no task: %s", schedule.name, slot, refused
                )
                fired, error = False, str(refused)
            else:
                schedules.record_run(schedule, slot, task[0].id, manual=False)
        # A missed slot (skipped, or fired late) is recorded for the schedule_missed
        # alert rules: how late the earliest due slot was when a pass found it.
        late = {} if on_time else {"late_at": clock, "late_by_seconds": _late_by(schedule, clock)}
        Schedule.objects.filter(id=schedule.id).update(
            next_run_at=schedules.next_slot(schedule, clock),
            **({"last_error": error} if error else {}),
            **late,
        )
        return fired


def _late_by(schedule: Schedule, clock: datetime) -> float:
    return (clock - schedule.next_run_at).total_seconds()


def sync_declared(*, now: datetime | None = None) -> None:
    """Make the schedules of ``QUEUE_SCHEDULES`` rows marked as code: new ones created,
    changed ones updated (their paused or running state kept), removed ones deleted.
    A row of the same name made in the admin or the API is taken over."""
    declared: dict[str, dict[str, Any]] = settings.QUEUE_SCHEDULES
    checked = {}
    for name, definition in declared.items():
        try:
            checked[name] = schedules.validated({**definition, "name": name})  # the key names it
        except operations.InvalidTask as error:
            raise ImproperlyConfigured(f"QUEUE_SCHEDULES[{name!r}]: {error}") from None
    with transaction.atomic():
        locks.advisory_xact_lock(locks.SCHEDULE_SYNC)  # one process syncs at a time
        clock = now or db.database_clock()
        for name, values in checked.items():
            enabled = values.pop("enabled")
            row = Schedule.objects.select_for_update().filter(name=name).first()
            if row is None:
                row = Schedule(source=Schedule.Source.CODE, enabled=enabled, **values)
            elif all(getattr(row, n) == values[n] for n in values) and row.source == "code":
                continue
            retimed = row.pk is None or any(getattr(row, n) != values[n] for n in schedules.TIMING)
            for field, value in values.items():
                setattr(row, field, value)
            row.source = Schedule.Source.CODE
            if retimed:
                row.next_run_at = schedules.next_slot(row, clock)
            row.save()
        Schedule.objects.filter(source=Schedule.Source.CODE).exclude(
            name__in=list(checked)
        ).delete()


def fire_due_slots() -> str | None:
    """The maintenance job's pass (after ``sync_declared``, once)."""
    fired = fire_due()
    return f"schedules: fired {fired} slot(s)" if fired else None
