"""Drives workflows: enqueues each step once the steps it depends on have completed.

Stateless: everything it needs is in the API. A workflow it started carries its
definition, input and a run id in ``metadata["orchestrator"]``; each task's
idempotency key (``wf:<run id>:<step>`` or ``wf:<run id>:<step>:<item index>``)
says which step it belongs to. Killed and restarted, it reads the open workflows and
their tasks and carries on; a task it already created is answered with the
existing one, never created twice.

An escalated workflow (``task_queue.escalation``) is not driven: it is logged once,
and driven again once an operator resumes it (its status, or the stream's
``evt.workflow.resumed.v1``). A cancel stops it for good.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from task_queue import task_logging

from .client import ApiClient, ApiError
from .definitions import Definition, DefinitionError, Step, parse, render

log = logging.getLogger(__name__)

# The API's largest batch of tasks in one request.
BATCH = 1000
# The stream's workflow events (follow.KINDS): driving stops and starts again.
ESCALATED, RESUMED = "evt.workflow.escalated.v1", "evt.workflow.resumed.v1"
WORKFLOW_KINDS = (ESCALATED, RESUMED)
# Tasks whose workflow is remembered, beyond which they are forgotten (and asked for
# again when their events come).
MAX_REMEMBERED = 100_000


def task_key(run_id: str, step: Step, index: int | None) -> str:
    return f"wf:{run_id}:{step.name}" + (f":{index}" if index is not None else "")


@dataclass
class Plan:
    """What a workflow needs next, given the tasks it has."""

    new_tasks: list[dict[str, Any]] = field(default_factory=list)
    # Every step has all its tasks (the workflow can be closed).
    complete: bool = True
    # Steps that cannot go on until revived: one of their tasks is dead or failed.
    stuck: list[str] = field(default_factory=list)
    # Steps that can never go on: one of their tasks was cancelled.
    cancelled: list[str] = field(default_factory=list)


def plan(
    definition: Definition, run_id: str, workflow_input: Any, tasks: Iterable[dict[str, Any]]
) -> Plan:
    """The tasks to create now: those of every step whose dependencies have completed."""
    by_key = {t["idempotency_key"]: t for t in tasks if t.get("idempotency_key")}
    context: dict[str, Any] = {"input": workflow_input, "steps": {}}
    done: dict[str, bool] = {}
    result = Plan()
    for step in definition.steps:
        if not all(done[d] for d in step.depends_on):
            done[step.name] = False
            result.complete = False
            continue
        if step.for_each is not None:
            items = render(step.for_each, context)
            if not isinstance(items, list):
                raise DefinitionError(f"step {step.name}: for_each {step.for_each} is not a list")
            indexed: list[tuple[int | None, Any]] = list(enumerate(items))
        else:
            indexed = [(None, None)]
        existing = []
        for index, item in indexed:
            key = task_key(run_id, step, index)
            task = by_key.get(key)
            existing.append(task)
            if task is None:
                scope = {**context, "item": item, "index": index}
                result.new_tasks.append(_new_task(step, key, render(step.payload, scope)))
        statuses = [t["status"] if t else None for t in existing]
        if any(s in ("dead", "failed") for s in statuses):
            result.stuck.append(step.name)
        if "cancelled" in statuses:
            result.cancelled.append(step.name)
        done[step.name] = all(s == "completed" for s in statuses)
        if done[step.name]:
            results = [t["result"] for t in existing]
            context["steps"][step.name] = {
                "results": results,
                "result": results[0] if step.for_each is None else None,
            }
    return result


def _new_task(step: Step, key: str, payload: Any) -> dict[str, Any]:
    task = {
        "agent_name": step.agent_name,
        "task_type": step.task_type,
        "payload": payload,
        "idempotency_key": key,
    }
    if step.priority is not None:
        task["priority"] = step.priority
    if step.max_attempts is not None:
        task["max_attempts"] = step.max_attempts
    return task


class Orchestrator:
    """Drives workflows by polling (``run_once``) or, following the live stream, as
    their tasks' events arrive (``on_events``): then each event costs the requests
    of driving its workflow, and nothing changing costs none."""

    def __init__(self, client: ApiClient) -> None:
        self.client = client
        # Workflow id -> the stuck steps last reported, so that a workflow waiting
        # for an operator is logged once per change, not at every pass.
        self._stuck: dict[str, tuple[str, ...]] = {}
        # What the events name, learnt from passes, drives and lookups: a task's or a
        # trace's workflow (None: in none, or in one not driven here), and the open
        # workflows driven here (None: closed, or someone else's).
        self._task_workflows: dict[str, str | None] = {}
        self._trace_workflows: dict[str, str | None] = {}
        self._workflows: dict[str, dict[str, Any] | None] = {}
        # Following the stream: events and workflows to try again (``on_events``).
        self._unresolved: list[dict[str, Any]] = []
        self._retry: set[str] = set()
        # Escalated workflows, as last heard (a fresh read or an event), and those of
        # them already logged as not driven.
        self._escalated: set[str] = set()
        self._escalation_logged: set[str] = set()

    def start(self, definition: Definition, workflow_input: Any, *, name: str = "") -> str:
        """Create a workflow running ``definition`` with its first steps' tasks."""
        run_id = uuid.uuid4().hex
        first = plan(definition, run_id, workflow_input, [])
        body = {
            "name": name or definition.name,
            # The workflow's tasks share its trace: the events of a task name it.
            "trace_id": f"wf-{run_id}",
            # Open while steps remain, or first tasks beyond one request's batch.
            "open": not first.complete or len(first.new_tasks) > BATCH,
            "metadata": {
                "orchestrator": {
                    "definition": definition.as_json(),
                    "input": workflow_input,
                    "run_id": run_id,
                }
            },
            "tasks": first.new_tasks[:BATCH],
            **definition.escalation(),
        }
        try:
            created = self.client.post("/api/v1/workflows", body)
            workflow_id = created["id"]
            self._remember(created, created["task_ids"])
        except ApiError as error:
            # The client resent the request after a lost answer and the first attempt
            # had committed: its tasks' keys now belong to that workflow.
            if error.status != 409 or not first.new_tasks:
                raise
            task_id = error.body["details"]["task_id"]
            workflow_id = self.client.get(f"/api/v1/tasks/{task_id}")["workflow_id"]
        log.info("started workflow %s (%s)", workflow_id, definition.name)
        return workflow_id

    def run_once(self) -> int:
        """One pass over every open workflow this orchestrator drives; returns how many
        tasks it created."""
        created = 0
        seen = set()
        for workflow in self.client.pages("/api/v1/workflows", open="true"):
            workflow = self._whole(workflow, "workflows", "metadata")
            state = (workflow.get("metadata") or {}).get("orchestrator")
            if not isinstance(state, dict):
                continue  # a workflow someone else drives
            seen.add(workflow["id"])
            self._note_status(workflow)
            created += self._drive_one(workflow, state) or 0
        # Closed or cancelled workflows are no longer driven: forget what was reported
        # and what was heard of their escalation.
        self._stuck = {key: steps for key, steps in self._stuck.items() if key in seen}
        self._escalated &= seen
        self._escalation_logged &= seen
        return created

    def on_events(self, events: Iterable[dict[str, Any]]) -> int:
        """Drive, once each, the workflows of these task events (envelopes from the
        stream), and those whose driving failed for a reason that may pass (the
        server unreachable or failing); returns how many tasks were created."""
        events, self._unresolved = [*self._unresolved, *events], []
        # Each workflow to drive, with the event that made it due (None: a retry).
        due: dict[str, dict[str, Any] | None] = dict.fromkeys(self._retry)
        self._retry = set()
        for event in events:
            if event.get("kind") in WORKFLOW_KINDS:
                workflow_id = str(event["payload"]["workflow_id"])
                if self._note_event(event["kind"], workflow_id):
                    due[workflow_id] = None  # resumed: driven again now
                continue
            try:
                with task_logging.about_task(_task_of(event)):
                    workflow_id = self._workflow_of(event)
            except (OSError, ApiError) as error:
                if not _passing(error):
                    raise
                self._unresolved.append(event)
                continue
            if workflow_id is not None:
                due[workflow_id] = event
        created = 0
        for workflow_id, event in due.items():
            # The lines about driving it name the task whose event made it due.
            with task_logging.about_task(_task_of(event) if event else None):
                created += self._drive_due(workflow_id)
        return created

    def _drive_due(self, workflow_id: str) -> int:
        try:
            workflow = self._open_workflow(workflow_id)
        except (OSError, ApiError) as error:
            if not _passing(error):
                raise
            self._retry.add(workflow_id)
            return 0
        if workflow is None:
            return 0
        done = self._drive_one(workflow, workflow["metadata"]["orchestrator"])
        if done is None:
            self._retry.add(workflow_id)
        return done or 0

    def _drive_one(self, workflow: dict[str, Any], state: dict[str, Any]) -> int | None:
        """``drive``, its errors logged; None if driving it again may work."""
        try:
            return self.drive(workflow, state)
        except (ApiError, DefinitionError, OSError) as error:
            log.error("workflow %s: %s", workflow["id"], error)
            return None if _passing(error) else 0
        except Exception:
            # One malformed workflow (its metadata edited by hand, say) must not
            # stop the others from being driven.
            log.exception("workflow %s: cannot drive it", workflow["id"])
            return 0

    def _workflow_of(self, event: dict[str, Any]) -> str | None:
        """The workflow of an event's task: known, or known by its trace, or asked
        for (once per task, or per trace when it has one)."""
        task_id, trace = event["payload"].get("task_id"), event.get("trace_id")
        if task_id in self._task_workflows:
            return self._task_workflows[task_id]
        if trace is not None and trace in self._trace_workflows:
            return self._trace_workflows[trace]
        if task_id is None:
            return None
        try:
            workflow_id = self.client.get(f"/api/v1/tasks/{task_id}")["workflow_id"]
        except ApiError as error:
            if error.status != 404:  # deleted since (retention): nothing to drive
                raise
            workflow_id = None
        if len(self._task_workflows) > MAX_REMEMBERED:
            self._task_workflows.clear()
        self._task_workflows[task_id] = workflow_id
        if trace is not None:
            self._trace_workflows[trace] = workflow_id
        return workflow_id

    def _open_workflow(self, workflow_id: str) -> dict[str, Any] | None:
        """The workflow if it is open and driven here (asked for the first time)."""
        if workflow_id not in self._workflows:
            workflow = self.client.get(f"/api/v1/workflows/{workflow_id}")
            state = (workflow.get("metadata") or {}).get("orchestrator")
            self._workflows[workflow_id] = None
            if workflow["open"] and isinstance(state, dict):
                self._note_status(workflow)
                self._remember(workflow, ())
        return self._workflows[workflow_id]

    def _remember(self, workflow: dict[str, Any], task_ids: Iterable[str]) -> None:
        """A workflow driven here, and some of its tasks."""
        self._workflows[workflow["id"]] = workflow
        if workflow.get("trace_id"):
            self._trace_workflows[workflow["trace_id"]] = workflow["id"]
        for task_id in task_ids:
            self._task_workflows[str(task_id)] = workflow["id"]

    def _note_status(self, workflow: dict[str, Any]) -> None:
        """What a fresh read of the workflow says of its escalation."""
        if workflow.get("status") == "escalated":
            self._escalated.add(workflow["id"])
        else:
            self._resumed(workflow["id"])

    def _note_event(self, kind: str, workflow_id: str) -> bool:
        """An escalation event; True if it resumed a workflow this held back."""
        if kind == ESCALATED:
            self._escalated.add(workflow_id)
            return False
        held_back = workflow_id in self._escalated
        self._resumed(workflow_id)
        return held_back

    def _resumed(self, workflow_id: str) -> None:
        if workflow_id in self._escalation_logged:
            log.info("workflow %s: resumed by an operator; driving it again", workflow_id)
        self._escalated.discard(workflow_id)
        self._escalation_logged.discard(workflow_id)

    def _forget(self, workflow_id: str) -> None:
        """A workflow no longer driven (closed or cancelled): its events are ignored,
        and nothing is kept of its escalation."""
        self._workflows[workflow_id] = None
        self._escalated.discard(workflow_id)
        self._escalation_logged.discard(workflow_id)

    def _whole(self, item: dict[str, Any], kind: str, field: str) -> dict[str, Any]:
        """A list item with ``field``: a list leaves a large one out (``omitted``)."""
        if field not in item.get("omitted", ()):
            return item
        return self.client.get(f"/api/v1/{kind}/{item['id']}")

    def drive(self, workflow: dict[str, Any], state: dict[str, Any]) -> int:
        if workflow["id"] in self._escalated:
            if workflow["id"] not in self._escalation_logged:
                log.warning(
                    "workflow %s escalated: not driven until an operator resumes or cancels it",
                    workflow["id"],
                )
                self._escalation_logged.add(workflow["id"])
            return 0
        definition = parse(state["definition"])
        tasks = [
            self._whole(task, "tasks", "result")
            for task in self.client.pages("/api/v1/tasks", workflow_id=workflow["id"])
        ]
        self._remember(workflow, (t["id"] for t in tasks))
        next_step = plan(definition, state["run_id"], state["input"], tasks)
        if next_step.cancelled:
            # An operator cancelled one of its tasks: the steps after it can never run.
            self.client.post(f"/api/v1/workflows/{workflow['id']}/cancel")
            self._forget(workflow["id"])
            log.warning("workflow %s: cancelled with %s", workflow["id"], next_step.cancelled)
            return 0
        for start in range(0, len(next_step.new_tasks), BATCH):
            batch = [
                {**task, "workflow_id": workflow["id"], "trace_id": workflow["trace_id"]}
                for task in next_step.new_tasks[start : start + BATCH]
            ]
            created = self.client.post("/api/v1/tasks", batch)
            self._remember(workflow, (t["id"] for t in created["items"]))
        if next_step.new_tasks:
            log.info("workflow %s: enqueued %d task(s)", workflow["id"], len(next_step.new_tasks))
        self._report_stuck(workflow["id"], tuple(next_step.stuck))
        if next_step.complete:
            self.client.patch(f"/api/v1/workflows/{workflow['id']}", {"open": False})
            self._forget(workflow["id"])
            log.info("workflow %s: every step enqueued; closed", workflow["id"])
        return len(next_step.new_tasks)

    def _report_stuck(self, workflow_id: str, stuck: tuple[str, ...]) -> None:
        """Log a workflow's stuck steps when they change (not at every pass)."""
        if stuck == self._stuck.get(workflow_id, ()):
            return
        if stuck:
            log.warning("workflow %s needs attention: %s", workflow_id, list(stuck))
            self._stuck[workflow_id] = stuck
        else:
            log.info("workflow %s: no step is stuck any more", workflow_id)
            del self._stuck[workflow_id]


def _task_of(event: dict[str, Any]) -> task_logging.TaskRef | None:
    """The task an event is about, for the log lines' fields (``LOG_FORMAT=json``)."""
    payload = event.get("payload") or {}
    if payload.get("task_id") is None:
        return None
    attempt = payload.get("attempt")
    return task_logging.TaskRef(
        payload["task_id"],
        event.get("trace_id"),
        payload.get("agent_type"),
        attempt - 1 if isinstance(attempt, int) else None,
    )


def _passing(error: Exception) -> bool:
    """Whether an error may pass by itself: the server unreachable, failing or busy."""
    if isinstance(error, ApiError):
        return error.status >= 500 or error.status == 429
    return isinstance(error, OSError)
