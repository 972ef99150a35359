"""The reference orchestrator's log lines: driving a workflow because of a task's
event, they carry that task's fields (``LOG_FORMAT=json``, task_queue.task_logging)."""

from __future__ import annotations

import logging

import pytest

from task_queue.task_logging import TaskFields
from tests.support.api import token
from tests.support.queue import complete_pending
from tests.test_orchestrator import TWO_STEPS, CountingClient, next_events, tasks_of
from workflows.orchestrator.definitions import parse
from workflows.orchestrator.driver import Orchestrator
from workflows.orchestrator.follow import EventStream

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.mark.slow
def test_driving_a_workflow_on_an_event_logs_that_events_task(live_servers, caplog):
    caplog.set_level(logging.INFO, logger="workflows.orchestrator")
    caplog.handler.addFilter(TaskFields())  # as settings.LOGGING's handlers have it
    server = live_servers()
    client = CountingClient(server.url, token("write"))
    driver = Orchestrator(client)
    stream = EventStream(server.url, client.token)
    stream.connect()
    try:
        workflow = driver.start(parse(TWO_STEPS), {})
        complete_pending("EchoAgent")  # step a
        assert driver.on_events(next_events(stream)) == 1
    finally:
        stream.close()

    (a,) = tasks_of(workflow, "a")
    enqueued = next(r for r in caplog.records if "enqueued 1 task(s)" in r.getMessage())
    fields = (enqueued.task_id, enqueued.trace_id, enqueued.agent, enqueued.attempt)
    assert fields == (str(a.id), a.trace_id, "EchoAgent", 1)
    assert enqueued.worker is None
    started = next(r for r in caplog.records if "started workflow" in r.getMessage())
    assert not hasattr(started, "task_id")  # a line about no task names none
