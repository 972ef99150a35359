"""Recurring schedules: their slots, what is refused, firing exactly once per slot
(in-process with a given clock, and across three real maintenance processes, one of
them killed), missed slots, pausing, running now, and the schedules declared in
settings."""

from __future__ import annotations

import signal
import threading
from datetime import UTC, datetime, timedelta

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.db import connection, transaction

from task_queue import schedules
from task_queue.models import OperatorAction, Schedule, ScheduleRun, Task
from task_queue.schedules import firing as schedule_firing
from task_queue.schedules import times as schedule_times
from task_queue.sql import db
from tests.support.waiting import wait_for

pytestmark = pytest.mark.django_db(transaction=True)

ECHO = {"agent_name": "EchoAgent", "task_type": "echo", "payload": {"n": 1}}
ACTOR = {"actor": "user:tester", "source": "api"}


def make(name: str = "tick", **values) -> Schedule:
    return schedules.create({"name": name, **ECHO, **values}, **ACTOR)


def slot_tasks(name: str) -> list[Task]:
    return list(
        Task.objects.filter(idempotency_key__startswith=f"schedule:{name}:").order_by("created_at")
    )


# ---------------------------------------------------------------- slots


def test_interval_slots_fall_on_multiples_of_the_interval():
    at = datetime(2026, 11, 25, 10, 0, 7, 500, tzinfo=UTC)
    assert schedule_times.next_slot(None, 5, "UTC", at) == at.replace(second=10, microsecond=0)
    assert schedule_times.latest_slot(None, 5, "UTC", at) == at.replace(second=5, microsecond=0)
    on_slot = at.replace(second=10, microsecond=0)
    assert schedule_times.next_slot(None, 5, "UTC", on_slot) == on_slot + timedelta(seconds=5)
    assert schedule_times.latest_slot(None, 5, "UTC", on_slot) == on_slot


def test_cron_slots_are_read_in_the_time_zone_across_dst():
    # Paris skips 02:00-03:00 on 2026-03-29: the 02:30 slot that day fires at 03:00.
    before = datetime(2026, 3, 28, 23, 0, tzinfo=UTC)  # 00:00 in Paris
    slot = schedule_times.next_slot("30 2 * * *", None, "Europe/Paris", before)
    assert slot == datetime(2026, 3, 29, 1, 0, tzinfo=UTC)  # 03:00 CEST
    after = schedule_times.next_slot("30 2 * * *", None, "Europe/Paris", slot)
    assert after == datetime(2026, 3, 30, 0, 30, tzinfo=UTC)  # 02:30 CEST
    at = datetime(2026, 11, 25, 10, 4, 59, 900_000, tzinfo=UTC)
    latest = schedule_times.latest_slot("*/5 * * * *", None, "UTC", at)
    assert latest == datetime(2026, 11, 25, 10, 0, tzinfo=UTC)
    exact = datetime(2026, 11, 25, 10, 5, tzinfo=UTC)
    assert schedule_times.latest_slot("*/5 * * * *", None, "UTC", exact) == exact


@pytest.mark.parametrize(
    ("values", "field"),
    [
        ({"cron": "* * * * *", "interval_seconds": 60}, "cron"),
        ({}, "cron"),
        ({"cron": "61 * * * *"}, "cron"),
        ({"cron": "* * *"}, "cron"),
        ({"cron": "0 0 30 2 *"}, "cron"),
        ({"cron": "* * * * *", "timezone": "Mars/Olympus"}, "timezone"),
        ({"interval_seconds": 10**9}, "interval_seconds"),
        ({"interval_seconds": 0}, "interval_seconds"),
        ({"interval_seconds": 60, "agent_name": "NoSuchAgent"}, "agent_name"),
        ({"interval_seconds": 60, "task_type": "nope"}, "task_type"),
        ({"interval_seconds": 60, "priority": 99}, "priority"),
        ({"interval_seconds": 60, "missed": "twice"}, "missed"),
        ({"interval_seconds": 60, "name": ""}, "name"),
    ],
)
def test_a_bad_schedule_is_refused_naming_the_field(values, field):
    with pytest.raises(schedules.InvalidSchedule) as refused:
        schedules.create({"name": "bad", **ECHO, **values}, **ACTOR)
    assert refused.value.field == field
    assert not Schedule.objects.exists()


# ---------------------------------------------------------------- firing


def test_a_slot_fires_once_and_the_next_slot_is_set_in_the_same_transaction():
    schedule = make(interval_seconds=60)
    slot = schedule.next_run_at
    assert schedule_firing.fire_due(now=slot - timedelta(seconds=1)) == 0
    now = slot + timedelta(seconds=2)
    assert schedule_firing.fire_due(now=now) == 1
    assert schedule_firing.fire_due(now=now) == 0
    (task,) = slot_tasks("tick")
    assert task.idempotency_key == f"schedule:tick:{slot.isoformat()}"
    assert (task.agent_name, task.task_type, task.payload) == ("EchoAgent", "echo", {"n": 1})
    schedule.refresh_from_db()
    assert schedule.next_run_at == slot + timedelta(seconds=60)
    assert (schedule.last_run_at, schedule.last_task_id) == (slot, task.id)
    assert list(schedule.runs.values_list("slot", "task_id")) == [(slot, task.id)]


@pytest.mark.parametrize("missed", ["run_once", "skip"])
def test_missed_slots_run_the_latest_once_or_are_skipped(missed):
    schedule = make(interval_seconds=60, missed=missed)
    first = schedule.next_run_at
    now = first + timedelta(minutes=5, seconds=30)  # six slots went by unfired
    fired = schedule_firing.fire_due(now=now)
    schedule.refresh_from_db()
    assert schedule.next_run_at == first + timedelta(minutes=6)
    if missed == "run_once":
        assert fired == 1
        (task,) = slot_tasks("tick")
        latest = first + timedelta(minutes=5)
        assert task.idempotency_key == f"schedule:tick:{latest.isoformat()}"
    else:
        assert fired == 0 and not slot_tasks("tick")
        # A slot within the grace still fires under skip.
        assert schedule_firing.fire_due(now=schedule.next_run_at + timedelta(seconds=1)) == 1


def test_a_paused_schedule_does_not_fire_and_resumes_at_its_next_slot():
    schedule = make(interval_seconds=60)
    slot = schedule.next_run_at
    schedules.set_enabled(schedule.id, False, **ACTOR)
    assert schedule_firing.fire_due(now=slot + timedelta(minutes=10)) == 0
    schedules.set_enabled(schedule.id, True, **ACTOR)
    schedule.refresh_from_db()
    assert schedule.next_run_at > db.database_clock()  # the slots it slept through are gone
    actions = OperatorAction.objects.order_by("id").values_list("action", flat=True)
    assert list(actions) == ["create_schedule", "pause_schedule", "resume_schedule"]


def test_run_now_enqueues_outside_the_slots_and_is_audited():
    schedule = make(interval_seconds=3600)
    task_id = schedules.run_now(schedule.id, **ACTOR)
    task = Task.objects.get(id=task_id)
    assert task.idempotency_key.startswith("schedule:tick:run:")
    schedule.refresh_from_db()
    assert schedule.last_task_id == task_id
    assert schedule.runs.get().manual is True
    action = OperatorAction.objects.get(action="run_schedule")
    assert action.task_ids == [task_id] and action.changes == {"schedule": "tick"}


def test_only_the_recent_runs_are_kept():
    schedule = make(interval_seconds=1)
    start = schedule.next_run_at
    for n in range(schedules.RUNS_KEPT + 5):
        assert schedule_firing.fire_due(now=start + timedelta(seconds=n)) == 1
    assert ScheduleRun.objects.filter(schedule=schedule).count() == schedules.RUNS_KEPT
    assert len(slot_tasks("tick")) == schedules.RUNS_KEPT + 5


def test_a_slot_whose_task_is_refused_passes_and_says_why():
    schedule = make(interval_seconds=60)
    Schedule.objects.filter(id=schedule.id).update(agent_name="GoneAgent")
    assert schedule_firing.fire_due(now=schedule.next_run_at) == 0
    schedule.refresh_from_db()
    assert "GoneAgent" in schedule.last_error
    assert schedule.next_run_at > schedule.created_at


# ---------------------------------------------------------------- declared in settings


def test_declared_schedules_are_synced_and_marked_as_code(settings):
    settings.QUEUE_SCHEDULES = {"nightly": {"cron": "0 3 * * *", **ECHO}}
    schedule_firing.sync_declared()
    nightly = Schedule.objects.get(name="nightly")
    assert nightly.source == "code" and nightly.timezone == "UTC"
    schedules.set_enabled(nightly.id, False, **ACTOR)  # an operator pauses it
    with pytest.raises(schedules.DeclaredInCode):
        schedules.update(nightly.id, {"cron": "0 4 * * *"}, **ACTOR)
    with pytest.raises(schedules.DeclaredInCode):
        schedules.delete(nightly.id, **ACTOR)
    settings.QUEUE_SCHEDULES = {"nightly": {"cron": "0 4 * * *", "timezone": "Asia/Tokyo", **ECHO}}
    schedule_firing.sync_declared()
    nightly.refresh_from_db()
    assert (nightly.cron, nightly.enabled) == ("0 4 * * *", False)  # still paused
    assert nightly.next_run_at.astimezone(UTC).hour == 19  # 04:00 in Tokyo
    settings.QUEUE_SCHEDULES = {}
    schedule_firing.sync_declared()
    assert not Schedule.objects.exists()


def test_a_bad_declared_schedule_stops_the_start(settings):
    settings.QUEUE_SCHEDULES = {"broken": {"cron": "every day", **ECHO}}
    with pytest.raises(ImproperlyConfigured, match=r"QUEUE_SCHEDULES\['broken'\]: cron"):
        schedule_firing.sync_declared()


# ---------------------------------------------------------------- many processes


@pytest.mark.slow
def test_three_maintenance_processes_one_killed_fire_each_slot_once(manage_processes):
    """Three maintenance loops race for every slot of a one-second schedule while the
    clock crosses several; one is SIGKILLed on the way. A slot fired twice would
    show as a second run of the slot (a unique violation in a loop's log) or as more
    tasks than runs; a slot lost to the kill would show as a slot's run without its
    task."""
    schedule = make("every second", interval_seconds=1)
    loops = [manage_processes("runmaintenance", "--every", "0.05") for _ in range(3)]
    wait_for(lambda: schedule.runs.count() >= 3, timeout=60, what="three slots fired")
    loops[0].signal(signal.SIGKILL)
    loops[0].wait(10)
    killed_at = schedule.runs.count()
    wait_for(lambda: schedule.runs.count() >= killed_at + 4, timeout=60, what="four more slots")
    for loop in loops[1:]:
        loop.signal(signal.SIGTERM)
        assert loop.wait(30) == 0
        log = loop.log()
        assert "Traceback" not in log and "maintenance pass failed" not in log, log
        assert "made no task" not in log, log
    tasks = slot_tasks("every second")
    keys = [task.idempotency_key for task in tasks]
    assert len(keys) == len(set(keys)) >= 7
    runs = list(schedule.runs.order_by("slot"))  # the latest RUNS_KEPT
    assert len(runs) == min(len(tasks), schedules.RUNS_KEPT)
    assert [schedules.slot_key("every second", run.slot) for run in runs] == sorted(keys)[
        -len(runs) :
    ]
    assert {run.task_id for run in runs} <= {task.id for task in tasks}
    for task in tasks:  # never before its slot
        slot = datetime.fromisoformat(task.idempotency_key.removeprefix("schedule:every second:"))
        assert slot.microsecond == 0 and task.created_at >= slot
    schedule.refresh_from_db()
    assert schedule.last_run_at == runs[-1].slot and schedule.last_error == ""


def test_an_unknown_field_in_a_declared_schedule_is_named(settings):
    settings.QUEUE_SCHEDULES = {"typo": {"cron": "0 3 * * *", "paylod": {}, **ECHO}}
    with pytest.raises(ImproperlyConfigured, match=r"QUEUE_SCHEDULES\['typo'\]: paylod"):
        schedule_firing.sync_declared()


def test_two_creates_of_one_name_at_once_refuse_the_second_by_its_field():
    """The second create passes the name check while the first is uncommitted, then
    waits on the unique index; once the first commits it is refused as a taken name
    (InvalidSchedule on `name`), not a database error."""
    first_inserted = threading.Event()
    commit_first = threading.Event()
    outcome: dict[str, object] = {}

    def first() -> None:
        try:
            with transaction.atomic():
                make("race", interval_seconds=60)
                first_inserted.set()
                commit_first.wait(30)
        except Exception as error:  # the test reports whatever it got
            outcome["first"] = error
            first_inserted.set()
        finally:
            connection.close()

    def second() -> None:
        try:
            outcome["result"] = make("race", interval_seconds=60)
        except Exception as error:  # the test reports whatever it got
            outcome["result"] = error
        finally:
            connection.close()

    a = threading.Thread(target=first)
    a.start()
    assert first_inserted.wait(30)
    assert "first" not in outcome, outcome
    b = threading.Thread(target=second)
    b.start()
    wait_for(
        lambda: db.fetch(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
            "AND datname = current_database() AND query LIKE 'INSERT INTO \"schedules\"%%'",
            {},
        )[0][0],
        what="the second insert waiting on the first",
    )
    commit_first.set()
    a.join(30)
    b.join(30)
    refused = outcome["result"]
    assert isinstance(refused, schedules.InvalidSchedule), refused
    assert refused.field == "name"
    assert Schedule.objects.filter(name="race").count() == 1
