"""One evaluation of every enabled alert rule, per agent.

It runs in one transaction under the ``ALERTS`` advisory lock, taken without waiting:
a second maintenance process skips the pass. The states it moves and the
notifications (and their deliveries) it makes commit together, so a process killed
mid-evaluation leaves nothing behind, and the next evaluation makes the notification
once.

Each kind's figure comes from the running counters (``task_queue.sql.alerts``,
``task_queue.sql.reading``): an evaluation costs the same at any number of tasks.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import quote
from uuid import UUID

from django.conf import settings
from django.db import transaction
from django.db.models import Value
from django.db.models.functions import Greatest

from task_queue import audit, registry
from task_queue.models import (
    AlertDelivery,
    AlertFiring,
    AlertKind,
    AlertNotification,
    AlertRule,
    AlertState,
    OperatorAction,
)
from task_queue.sql import alerts as alerts_sql
from task_queue.sql import db, locks
from task_queue.sql import escalation as escalation_sql
from task_queue.sql import reading as reading_sql


@dataclass(frozen=True)
class Reading:
    """A rule's figure for one agent (and workflow, for workflow_escalated), and
    whether its condition holds; ``about``: what the summary says of it."""

    agent: str
    value: float
    holds: bool
    workflow: UUID | None = None
    about: str = ""

    @property
    def key(self) -> tuple[str, UUID | None]:
        return (self.agent, self.workflow)


def evaluate(*, now: datetime | None = None) -> list[AlertNotification] | None:
    """Evaluate every enabled rule; the notifications made, or None when another
    process is evaluating. ``now``: the clock for firing times and repeats (tests)."""
    with transaction.atomic():
        if not locks.try_advisory_xact_lock(locks.ALERTS):
            return None
        clock = now or db.database_clock()
        rules = list(AlertRule.objects.filter(enabled=True))
        states: dict[int, dict[tuple[str, UUID | None], AlertState]] = {r.id: {} for r in rules}
        for state in AlertState.objects.filter(rule__in=rules):
            states[state.rule_id][(state.agent, state.workflow_id)] = state
        figures = _Figures()
        made = []
        for rule in rules:
            for reading in figures.readings(rule, set(states[rule.id])):
                state = states[rule.id].get(reading.key)
                notification = _step(rule, state, reading, clock)
                if notification is not None:
                    made.append(notification)
        return made


def _step(
    rule: AlertRule, state: AlertState | None, reading: Reading, clock: datetime
) -> AlertNotification | None:
    """Move one (rule, agent) state by its reading; the notification it makes, if any.
    A silenced rule's states move as ever, but it sends no firing nor reminder: a
    firing nobody was told of is notified at the first evaluation after the silence,
    and its resolve is sent only if they were told of it."""
    if state is None:
        if not reading.holds:
            return None
        state = AlertState(rule=rule, agent=reading.agent, workflow_id=reading.workflow)
    silenced = rule.silenced_until is not None and clock < rule.silenced_until
    told = _told(state)  # of the firing now ending, if it ends
    notify = None
    began = reading.holds and state.firing_since is None
    if began:
        state.firing_since = clock
        notify = AlertNotification.State.FIRING
    elif reading.holds and not silenced and _reminder_due(rule, state, clock):
        notify = AlertNotification.State.FIRING  # still holding: a reminder
    elif not reading.holds and state.firing_since is not None:
        notify = AlertNotification.State.RESOLVED
    started_at = state.firing_since
    resolved = notify == AlertNotification.State.RESOLVED
    _record_firing(rule, state, reading, clock, began=began, resolved=resolved)
    if resolved:
        state.firing_since = None
    # Sent: a firing or a reminder unless silenced; a resolve only of a firing people
    # were told of (silenced or not), never of one they were not.
    send = notify is not None and (told if resolved else not silenced)
    if send:
        state.notified_at = clock
    if notify is None and state.pk is not None and state.value == reading.value:
        return None  # nothing changed: no write
    state.value = reading.value
    state.evaluated_at = clock
    if resolved and reading.workflow is not None:
        state.delete()  # a workflow escalates once: its state is done with
    else:
        state.save()
    if not send:
        return None
    return _notify(rule, reading, notify, started_at)


def _record_firing(
    rule: AlertRule,
    state: AlertState,
    reading: Reading,
    clock: datetime,
    *,
    began: bool,
    resolved: bool,
) -> None:
    """Keep the firings' history: one begins with the firing, ends with its resolve,
    and keeps the highest reading in between."""
    if began:
        AlertFiring.objects.create(
            rule=rule,
            agent=reading.agent,
            workflow_id=reading.workflow,
            started_at=clock,
            peak_value=reading.value,
        )
        return
    firing = AlertFiring.objects.filter(
        rule=rule, agent=reading.agent, workflow_id=reading.workflow, ended_at__isnull=True
    )
    if resolved:
        firing.update(ended_at=clock, ended_by=AlertFiring.End.RESOLVED)
    elif state.firing_since is not None and state.value != reading.value:
        firing.update(peak_value=Greatest("peak_value", Value(reading.value)))


def _told(state: AlertState) -> bool:
    """Whether people were told of the state's current firing (not: it began while
    the rule was silenced, and no reminder has gone since)."""
    return (
        state.firing_since is not None
        and state.notified_at is not None
        and state.notified_at >= state.firing_since
    )


def _reminder_due(rule: AlertRule, state: AlertState, clock: datetime) -> bool:
    """Firing, and not notified of for ``repeat_seconds``, or never (silenced then)."""
    if not _told(state):
        return True
    return clock - state.notified_at >= timedelta(seconds=rule.repeat_seconds)


def send_test(rule: AlertRule, *, actor: str, source: str) -> AlertNotification:
    """A ``test`` notification of the rule to each of its channels, delivered as any
    other (audited): an operator checks the channels reach people."""
    with transaction.atomic():
        reading = Reading(rule.agent or "", 0.0, False)
        what = f"a test of {rule.name!r}, sent by {actor}: nothing is wrong"
        test = AlertNotification.State.TEST
        notification = _notify(rule, reading, test, db.database_clock(), what)
        audit.record(
            actor=actor,
            action=OperatorAction.Kind.TEST_ALERT_RULE,
            source=source,
            agent_name=rule.agent,
            changes={"alert_rule": rule.name},
        )
    return notification


def _notify(
    rule: AlertRule, reading: Reading, state: str, started_at: datetime, what: str = ""
) -> AlertNotification:
    body = {
        "rule": rule.name,
        "kind": rule.kind,
        "agent": reading.agent,
        "workflow": str(reading.workflow) if reading.workflow else None,
        "state": state,
        "value": reading.value,
        "threshold": rule.threshold,
        "started_at": started_at.isoformat(),
        "summary": what or summary(rule, reading, state),
        "links": links(rule.kind, reading.agent, reading.workflow)
        if state != AlertNotification.State.TEST
        else {"alerts": settings.ALERTS_BASE_URL.rstrip("/") + "/alerts/"},
    }
    notification = AlertNotification.objects.create(
        rule=rule,
        agent=reading.agent,
        workflow_id=reading.workflow,
        state=state,
        value=reading.value,
        threshold=rule.threshold,
        started_at=started_at,
        body=body,
    )
    AlertDelivery.objects.bulk_create(
        AlertDelivery(notification=notification, channel=channel) for channel in rule.channels
    )
    return notification


DESCRIBED: dict[str, Callable[[AlertRule, Reading], str]] = {
    AlertKind.DEAD_LETTER: lambda rule, reading: (
        f"{reading.value:g} task(s) ended dead or failed in {rule.window_seconds} s"
    ),
    AlertKind.FAILURE_RATE: lambda rule, reading: (
        f"{reading.value:.0%} of the tasks finished in {rule.window_seconds} s failed"
    ),
    AlertKind.BACKLOG_AGE: lambda rule, reading: f"a due task has waited {reading.value:.0f} s",
    AlertKind.NO_WORKERS: lambda rule, reading: "tasks are due and no worker serves the agent",
    AlertKind.LEASE_EXPIRATIONS: lambda rule, reading: (
        f"{reading.value:g} lease(s) expired in {rule.window_seconds} s: workers stopped "
        "heartbeating mid-task"
    ),
    AlertKind.SCHEDULE_MISSED: lambda rule, reading: (
        f"a schedule's slot was skipped or fired {reading.value:.0f} s late"
    ),
    AlertKind.WORKFLOW_ESCALATED: lambda rule, reading: (
        reading.about or f"workflow {reading.workflow} is escalated no more"
    ),
}


def summary(rule: AlertRule, reading: Reading, state: str) -> str:
    what = DESCRIBED[rule.kind](rule, reading)
    subject = reading.agent or "every agent"
    if state == AlertNotification.State.RESOLVED:
        return f"resolved: {rule.name} ({subject}): {what}"
    if rule.kind == AlertKind.WORKFLOW_ESCALATED:
        return f"{rule.name} ({subject}): {what}"
    return f"{rule.name} ({subject}): {what} (threshold {rule.threshold:g})"


def links(kind: str, agent: str, workflow: UUID | None = None) -> dict[str, str]:
    """The dashboard pages an operator opens for this alert (``ALERTS_BASE_URL`` in
    front, the address people reach the dashboard at)."""
    base = settings.ALERTS_BASE_URL.rstrip("/")
    pages = {
        "dead_letter": f"/dead-letter/?agent={quote(agent)}",
        "agent": "/",
        "workers": "/workers/",
        "workflow": f"/workflows/{workflow}/",
        "schedules": "/schedules/",
    }
    wanted = {
        AlertKind.DEAD_LETTER: ("dead_letter", "agent"),
        AlertKind.FAILURE_RATE: ("dead_letter", "agent"),
        AlertKind.BACKLOG_AGE: ("agent", "workers"),
        AlertKind.NO_WORKERS: ("workers", "agent"),
        AlertKind.LEASE_EXPIRATIONS: ("workers", "agent"),
        AlertKind.SCHEDULE_MISSED: ("schedules",),
        AlertKind.WORKFLOW_ESCALATED: ("workflow",),
    }[kind]
    return {name: base + pages[name] for name in wanted}


class _Figures:
    """The counters one evaluation reads, each once (per window for the finishes)."""

    def __init__(self) -> None:
        self._finished: dict[int, dict[str, tuple[int, int]]] = {}
        self._ages: dict[str, float | None] | None = None
        self._served: set[str] | None = None

    def readings(self, rule: AlertRule, known: set[tuple[str, UUID | None]]) -> Iterator[Reading]:
        """The rule's reading for its agent, or for every agent that is registered,
        has figures, or had a state (so that one that went quiet resolves)."""
        if rule.kind == AlertKind.WORKFLOW_ESCALATED:
            yield from self._escalations(rule, known)
            return
        figures = self._of_kind(rule)
        every = {*registry.names(), *figures, *(agent for agent, _ in known)}
        agents = [rule.agent] if rule.agent else sorted(every)
        for agent in agents:
            value, holds = figures.get(agent, (0.0, False))
            yield Reading(agent, value, holds)

    def _escalations(
        self, rule: AlertRule, known: set[tuple[str, UUID | None]]
    ) -> Iterator[Reading]:
        """Each escalated workflow holds on its own; one that had a state and is
        escalated no more (resumed, cancelled) resolves."""
        agent = rule.agent or ""
        escalated = escalation_sql.escalated_workflows(rule.agent)
        for workflow, name, escalation in escalated:
            yield Reading(agent, 1.0, True, workflow, _escalation_text(name, escalation))
        gone = {workflow for _, workflow in known} - {workflow for workflow, _, _ in escalated}
        for workflow in sorted(gone - {None}):
            yield Reading(agent, 0.0, False, workflow)

    def _of_kind(self, rule: AlertRule) -> dict[str, tuple[float, bool]]:
        if rule.kind in (AlertKind.DEAD_LETTER, AlertKind.FAILURE_RATE):
            window = rule.window_seconds
            if window not in self._finished:
                self._finished[window] = alerts_sql.finished_in_window(window)
            finished = self._finished[window]
            if rule.kind == AlertKind.DEAD_LETTER:
                return {a: (bad, bad >= rule.threshold) for a, (_, bad) in finished.items()}
            return {
                agent: (rate, done + bad >= rule.min_count and rate >= rule.threshold)
                for agent, (done, bad) in finished.items()
                if done + bad > 0
                for rate in [bad / (done + bad)]
            }
        if rule.kind == AlertKind.LEASE_EXPIRATIONS:
            expired = alerts_sql.leases_expired_in_window(rule.window_seconds)
            return {a: (n, n >= rule.threshold) for a, n in expired.items()}
        if rule.kind == AlertKind.SCHEDULE_MISSED:
            late = alerts_sql.schedules_late_in_window(rule.window_seconds)
            return {a: (s, s >= rule.threshold) for a, s in late.items()}
        ages = self._ages_by_agent()
        if rule.kind == AlertKind.BACKLOG_AGE:
            return {a: (age, age >= rule.threshold) for a, age in ages.items() if age is not None}
        served = self._served_agents()
        return {a: (1.0, True) for a, age in ages.items() if age is not None and a not in served}

    def _ages_by_agent(self) -> dict[str, float | None]:
        if self._ages is None:
            self._ages = reading_sql.oldest_pending_age_by_agent(registry.names())
        return self._ages

    def _served_agents(self) -> set[str]:
        if self._served is None:
            self._served = alerts_sql.served_agents(settings.QUEUE_LEASE_SECONDS)
        return self._served


def _escalation_text(name: str, escalation: dict[str, Any]) -> str:
    if escalation.get("reason") == "failures":
        failures, threshold = escalation["failures"], escalation["threshold"]
        why = f"{failures} task(s) dead or failed (threshold {threshold})"
    else:
        why = f"not completed {escalation.get('seconds')} s after it was created"
    return f"workflow {name!r} escalated: {why}"
