"""Recurring schedules: writing them (checked like the tasks they will enqueue) and
the operator actions on them, each written to the audit log in its transaction.

Firing them is ``task_queue.schedules.firing``; when slots fall is
``task_queue.schedules.times``.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any
from uuid import UUID

from django.db import transaction

from task_queue import audit, operations, task_specs
from task_queue.models import OperatorAction, Priority, Schedule, ScheduleRun
from task_queue.sql import db
from task_queue.storable import text_problem
from task_queue.unique_names import save_named

from . import times

Kind = OperatorAction.Kind
# The idempotency key ``schedule:<name>:<slot>`` must stay within the queue's key limit.
MAX_NAME_LENGTH = 100
# The unique index on schedules.name (Django's name for ``unique=True``).
NAME_CONSTRAINT = "schedules_name_key"
# Recent runs kept per schedule (the dashboard shows them; older ones are deleted).
RUNS_KEPT = 20
# What a schedule is; ``enabled`` and ``name`` are handled apart.
DEFINITION = (
    "cron", "interval_seconds", "timezone", "agent_name", "task_type", "payload",
    "priority", "max_attempts", "missed",
)  # fmt: skip
TIMING = ("cron", "interval_seconds", "timezone")
DEFAULTS = {
    "cron": None,
    "interval_seconds": None,
    "timezone": "UTC",
    "payload": {},
    "priority": Priority.MEDIUM,
    "max_attempts": None,
    "missed": Schedule.Missed.RUN_ONCE,
    "enabled": True,
}


class InvalidSchedule(operations.InvalidTask):
    """A schedule was refused; ``field`` names the offending field (the API answers
    it as it answers a refused task)."""


class ScheduleNotFound(LookupError):
    pass


class DeclaredInCode(ValueError):
    """A schedule declared in settings is changed there, not at run time (only paused,
    resumed or run now)."""

    def __init__(self, name: str) -> None:
        super().__init__(f"schedule {name!r} is declared in settings (QUEUE_SCHEDULES)")
        self.name = name


def validated(values: dict[str, Any]) -> dict[str, Any]:
    """A complete schedule definition (``DEFAULTS`` filled in), checked; raises
    :class:`InvalidSchedule` naming the first bad field."""
    unknown = sorted(set(values) - {"name", *DEFINITION, "enabled"})
    if unknown:
        raise InvalidSchedule(unknown[0], "is not a field of a schedule")
    values = {**DEFAULTS, **values}
    name = values.get("name")
    if not isinstance(name, str) or not 1 <= len(name) <= MAX_NAME_LENGTH or text_problem(name):
        raise InvalidSchedule("name", f"must be text of 1 to {MAX_NAME_LENGTH} characters")
    try:
        times.check(values["cron"], values["interval_seconds"], values["timezone"])
    except times.BadTiming as error:
        raise InvalidSchedule(error.field, error.message) from None
    if values["missed"] not in Schedule.Missed.values:
        raise InvalidSchedule("missed", f"must be one of {', '.join(Schedule.Missed.values)}")
    if not isinstance(values["enabled"], bool):
        raise InvalidSchedule("enabled", "must be true or false")
    try:
        task_specs.check(_task_spec(values, key=None))
    except operations.InvalidTask as error:
        raise InvalidSchedule(
            error.field, error.message, code=error.code, details=error.details
        ) from None
    return values


def _task_spec(values: dict[str, Any], *, key: str | None) -> operations.TaskSpec:
    return operations.TaskSpec(
        values["agent_name"],
        values["task_type"],
        values["payload"],
        priority=values["priority"],
        max_attempts=values["max_attempts"],
        idempotency_key=key,
    )


def task_spec(schedule: Schedule, key: str) -> operations.TaskSpec:
    return _task_spec({name: getattr(schedule, name) for name in DEFINITION}, key=key)


def next_slot(schedule: Schedule, after: datetime) -> datetime:
    return times.next_slot(schedule.cron, schedule.interval_seconds, schedule.timezone, after)


def create(values: dict[str, Any], *, actor: str, source: str) -> Schedule:
    """A new schedule, its first slot the next one from now."""
    values = validated(values)
    with transaction.atomic():
        if Schedule.objects.filter(name=values["name"]).exists():
            raise InvalidSchedule("name", f"a schedule named {values['name']!r} exists")
        schedule = Schedule(source=source, **values)
        schedule.next_run_at = next_slot(schedule, db.database_clock())
        _save(schedule)
        _audit(schedule, Kind.CREATE_SCHEDULE, actor, source, {"definition": _definition(schedule)})
    return schedule


def update(schedule_id: int, changes: dict[str, Any], *, actor: str, source: str) -> Schedule:
    """Change a schedule. ``enabled`` alone pauses or resumes it; a schedule declared in
    settings takes nothing else (:class:`DeclaredInCode`). New timing starts from now."""
    with transaction.atomic():
        schedule = _locked(schedule_id)
        if set(changes) - {"enabled"} and schedule.source == Schedule.Source.CODE:
            raise DeclaredInCode(schedule.name)
        before = {name: getattr(schedule, name) for name in ("name", *DEFINITION, "enabled")}
        values = validated({**before, **changes})
        if (
            values["name"] != before["name"]
            and Schedule.objects.filter(name=values["name"]).exists()
        ):
            raise InvalidSchedule("name", f"a schedule named {values['name']!r} exists")
        for name, value in values.items():
            setattr(schedule, name, value)
        clock = db.database_clock()
        if any(before[name] != values[name] for name in TIMING) or (
            values["enabled"] and not before["enabled"]
        ):
            # Slots that fell while it was paused are not fired: pausing means not running.
            schedule.next_run_at = next_slot(schedule, clock)
        schedule.updated_at = clock
        _save(schedule)
        diff = {n: {"from": before[n], "to": values[n]} for n in before if before[n] != values[n]}
        if diff:
            action = Kind.UPDATE_SCHEDULE
            if set(diff) == {"enabled"}:
                action = Kind.RESUME_SCHEDULE if values["enabled"] else Kind.PAUSE_SCHEDULE
            _audit(schedule, action, actor, source, diff)
    return schedule


def _save(schedule: Schedule) -> None:
    save_named(
        schedule,
        NAME_CONSTRAINT,
        lambda: InvalidSchedule("name", f"a schedule named {schedule.name!r} exists"),
    )


def set_enabled(schedule_id: int, enabled: bool, *, actor: str, source: str) -> Schedule:
    """Pause (``False``) or resume (``True``) a schedule; resumed, it waits for its next
    slot from now."""
    return update(schedule_id, {"enabled": enabled}, actor=actor, source=source)


def _audit(schedule: Schedule, action: str, actor: str, source: str, changes: dict) -> None:
    """The audit row of a change to ``schedule`` (named in it, beside ``changes``)."""
    audit.record(
        actor=actor,
        action=action,
        source=source,
        agent_name=schedule.agent_name,
        changes={"schedule": schedule.name, **changes},
    )


def delete(schedule_id: int, *, actor: str, source: str) -> None:
    """Remove a schedule and its recent runs (its tasks stay)."""
    with transaction.atomic():
        schedule = _locked(schedule_id)
        if schedule.source == Schedule.Source.CODE:
            raise DeclaredInCode(schedule.name)
        _audit(schedule, Kind.DELETE_SCHEDULE, actor, source, {"definition": _definition(schedule)})
        schedule.delete()


def run_now(schedule_id: int, *, actor: str, source: str) -> UUID:
    """Enqueue the schedule's task now, outside its slots (paused or not); its id.
    The slots go on as before."""
    with transaction.atomic():
        schedule = _locked(schedule_id)
        clock = db.database_clock()
        task = operations.enqueue_many(
            [task_spec(schedule, slot_key(schedule.name, clock, manual=True))], indexed=False
        )[0]
        record_run(schedule, clock, task.id, manual=True)
        audit.record(
            actor=actor,
            action=Kind.RUN_SCHEDULE,
            source=source,
            task_ids=[task.id],
            agent_name=schedule.agent_name,
            changes={"schedule": schedule.name},
        )
    return task.id


def slot_key(name: str, slot: datetime, *, manual: bool = False) -> str:
    """The idempotency key of the task of ``name``'s ``slot``: one task per slot."""
    return f"schedule:{name}:{'run:' if manual else ''}{slot.isoformat()}"


def record_run(schedule: Schedule, slot: datetime, task_id: UUID | None, *, manual: bool) -> None:
    """Note the run on the schedule and in its recent runs (keeping ``RUNS_KEPT``), in
    the caller's transaction, which holds the schedule's row."""
    ScheduleRun.objects.create(schedule=schedule, slot=slot, task_id=task_id, manual=manual)
    old = ScheduleRun.objects.filter(schedule=schedule).values_list("id", flat=True)[RUNS_KEPT:]
    ScheduleRun.objects.filter(id__in=list(old)).delete()
    if task_id is not None:
        Schedule.objects.filter(id=schedule.id).update(
            last_run_at=slot, last_task_id=task_id, last_error=""
        )


def _locked(schedule_id: int) -> Schedule:
    schedule = Schedule.objects.select_for_update().filter(id=schedule_id).first()
    if schedule is None:
        raise ScheduleNotFound(str(schedule_id))
    return schedule


def _definition(schedule: Schedule) -> dict[str, Any]:
    return {name: getattr(schedule, name) for name in (*DEFINITION, "enabled")}
