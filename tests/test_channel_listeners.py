"""The busiest notifications, the dashboard's task changes and the event stream's
wake-up, are sent only while someone listens (``channel_listeners``, migration
queue 0026): every LISTEN of the product (``task_queue.listen``) registers first."""

from __future__ import annotations

import json

import psycopg
import pytest

from task_queue import operations
from task_queue.listen import listening
from task_queue.operations import TaskSpec
from task_queue.sql.channels import (
    EVENTS_CHANNEL,
    NOTIFY_CHANNEL,
    REGISTER_LISTENER,
    SWEEP_LISTENERS,
    TASK_CHANGES_CHANNEL,
)
from task_queue.sql.connections import connection_params
from task_queue.sql.db import execute, fetch
from tests.support.queue import complete_pending

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def no_one_registered() -> None:
    """Django's flush leaves this table alone: no registration from an earlier test
    (a hub of this process) counts here."""
    execute("DELETE FROM channel_listeners", {})


END = "end"


def _heard(conn: psycopg.Connection, channel: str) -> list[str]:
    """The payloads ``conn`` received on ``channel`` before this call's own end marker
    (notifications arrive in commit order)."""
    execute("SELECT pg_notify(%(channel)s, %(end)s)", {"channel": channel, "end": END})
    heard = []
    for notification in conn.notifies(timeout=10):
        if notification.channel == channel and notification.payload == END:
            return heard
        if notification.channel == channel:
            heard.append(notification.payload)
    raise AssertionError(f"the end marker on {channel} never came")


def _unregistered_listener(*channels: str) -> psycopg.Connection:
    """A bare LISTEN, which the triggers do not know of."""
    conn = psycopg.connect(**connection_params(), autocommit=True)
    for channel in channels:
        conn.execute(f"LISTEN {channel}")
    return conn


def test_with_no_one_registered_claims_and_completions_notify_no_one():
    operations.enqueue_many([TaskSpec("EchoAgent", "echo")] * 3)
    with _unregistered_listener(TASK_CHANGES_CHANNEL, EVENTS_CHANNEL) as bare:
        complete_pending("EchoAgent")
        assert _heard(bare, TASK_CHANGES_CHANNEL) == []
        assert _heard(bare, EVENTS_CHANNEL) == []


def test_a_registered_listener_hears_every_change_and_takes_its_row_back():
    task_ids = {e.id for e in operations.enqueue_many([TaskSpec("EchoAgent", "echo")] * 3)}
    with listening(TASK_CHANGES_CHANNEL) as changes, listening(EVENTS_CHANNEL) as events:
        assert fetch("SELECT count(*) FROM channel_listeners", {}) == [(2,)]
        complete_pending("EchoAgent")  # a claim, then a completion
        claimed, completed = (json.loads(p) for p in _heard(changes, TASK_CHANGES_CHANNEL))
        assert _heard(events, EVENTS_CHANNEL) == ["", ""]  # one per transaction
    assert {(t[0], t[1], t[2]) for t in claimed["tasks"]} == {
        (str(i), "pending", "running") for i in task_ids
    }
    assert {(t[0], t[1], t[2]) for t in completed["tasks"]} == {
        (str(i), "running", "completed") for i in task_ids
    }
    assert fetch("SELECT count(*) FROM channel_listeners", {}) == [(0,)]


def test_the_rows_of_listeners_that_ended_without_a_word_are_swept():
    execute(
        "INSERT INTO channel_listeners (channel, backend_pid) VALUES (%(channel)s, -1)",
        {"channel": TASK_CHANGES_CHANNEL},
    )
    with listening(EVENTS_CHANNEL):
        rows = fetch("SELECT channel, backend_pid > 0 FROM channel_listeners", {})
    assert rows == [(EVENTS_CHANNEL, True)]


def _stale_row(channel: str, pid: int) -> None:
    """The row of a backend killed without a word, whose process id ``pid`` took."""
    execute(
        "INSERT INTO channel_listeners (channel, backend_pid, since) "
        "VALUES (%(channel)s, %(pid)s, now() - interval '1 hour')",
        {"channel": channel, "pid": pid},
    )


def test_a_row_whose_process_id_a_newer_backend_took_is_swept():
    """Its process id reused by a backend that does not listen: the row is older than
    that backend, so it no longer says anyone listens."""
    with psycopg.connect(**connection_params(), autocommit=True) as newer:
        _stale_row(TASK_CHANGES_CHANNEL, newer.info.backend_pid)
        with listening(EVENTS_CHANNEL):
            rows = fetch("SELECT channel FROM channel_listeners", {})
    assert rows == [(EVENTS_CHANNEL,)]


def test_a_stale_row_of_the_registering_process_id_and_channel_leaves_it_registered():
    """The sweep runs before the registration, as ``listening`` runs them: the stale
    row goes and the listener's own row is written (in one statement, the INSERT found
    the stale row and added nothing, and the DELETE then removed it)."""
    with psycopg.connect(**connection_params(), autocommit=True) as conn:
        _stale_row(TASK_CHANGES_CHANNEL, conn.info.backend_pid)
        conn.execute(SWEEP_LISTENERS)
        conn.execute(REGISTER_LISTENER, {"channel": TASK_CHANGES_CHANNEL})
        rows = fetch("SELECT channel, backend_pid, since > now() - interval '1 minute' "
                     "FROM channel_listeners", {})  # fmt: skip
        assert rows == [(TASK_CHANGES_CHANNEL, conn.info.backend_pid, True)]


def test_only_the_channels_notified_on_demand_register():
    with listening(NOTIFY_CHANNEL):  # workers always listen, and are always woken
        assert fetch("SELECT count(*) FROM channel_listeners", {}) == [(0,)]
