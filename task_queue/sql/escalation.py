"""Workflow escalation's statements (spec 001 §9): which workflows crossed their
failure threshold or ran past their deadline, escalating them (``escalate_workflow``,
queue 0035), and an operator's resume.

A workflow row is locked only here, in the maintenance loop, which holds no task's
row: the failing transactions only leave a ``workflow_escalation_checks`` row.
"""

from __future__ import annotations

import json
from typing import Any
from uuid import UUID

from task_queue.sql.db import NOW, fetch

# The workflows whose tasks failed since the last pass, and those of them with at
# least their threshold of dead or failed tasks now. Check rows are taken with SKIP
# LOCKED (a second maintenance process takes others), then their workflows locked in
# id order, skipping one locked elsewhere (an operator's long transaction never holds
# the loop up): of the rows picked, only its newest stays for a later pass (its
# failures are counted then), so a workflow held for long blocks one row of the
# batch, not the batch. Every check row of a workflow locked here goes but one another
# process holds (one count per workflow, however many of its tasks failed, and no
# process waits for another's rows). A failure committed after this statement's
# snapshot has left a check row it does not see: the next pass's.
WORKFLOWS_OVER_THEIR_FAILURES = """
WITH picked AS (
    SELECT id, workflow_id FROM workflow_escalation_checks
    ORDER BY id LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
),
locked AS (
    SELECT w.id, w.escalate_after_failures AS threshold,
           w.escalation IS NULL AND w.cancelled_at IS NULL AS may_escalate
    FROM workflows w
    WHERE w.id IN (SELECT workflow_id FROM picked)
    ORDER BY w.id
    FOR UPDATE OF w SKIP LOCKED
),
checked AS (
    DELETE FROM workflow_escalation_checks c
    WHERE c.id IN (SELECT id FROM workflow_escalation_checks
                   WHERE workflow_id IN (SELECT id FROM locked)
                   FOR UPDATE SKIP LOCKED)
       OR c.id IN (SELECT p.id FROM picked p  -- of a workflow deleted since
                   WHERE NOT EXISTS (SELECT FROM workflows w WHERE w.id = p.workflow_id))
       OR c.id IN (SELECT p.id FROM picked p  -- of one skipped: all but its newest
                   WHERE p.workflow_id NOT IN (SELECT id FROM locked)
                     AND p.id < (SELECT max(q.id) FROM picked q
                                 WHERE q.workflow_id = p.workflow_id))
)
SELECT c.id, f.failures, c.threshold
FROM locked c
CROSS JOIN LATERAL (
    SELECT count(*) AS failures FROM tasks t
    WHERE t.workflow_id = c.id AND t.status IN ('dead', 'failed')
) AS f
WHERE c.may_escalate AND f.failures >= c.threshold
"""

# The workflows whose deadline (escalate_at) passed, the deadline cleared, and
# whether each is to escalate: not cancelled, not escalated already, and not
# completed (open, or without tasks, or with a task not completed nor cancelled: the
# rule of workflows.progress.status_of, which this layer cannot import).
WORKFLOWS_PAST_THEIR_DEADLINE = f"""
WITH due AS (
    SELECT id FROM workflows
    WHERE escalate_at <= {NOW}
    ORDER BY escalate_at LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
UPDATE workflows w SET escalate_at = NULL
FROM due WHERE w.id = due.id
RETURNING w.id, w.escalate_after_seconds,
    w.cancelled_at IS NULL AND w.escalation IS NULL AND (
        w.open
        OR NOT EXISTS (SELECT FROM tasks t WHERE t.workflow_id = w.id)
        OR EXISTS (SELECT FROM tasks t WHERE t.workflow_id = w.id
                                         AND t.status NOT IN ('completed', 'cancelled'))
    ) AS running
"""

ESCALATE = """
SELECT e.id FROM jsonb_to_recordset(%(escalations)s::jsonb) AS e(id uuid, detail jsonb)
WHERE escalate_workflow(e.id, e.detail)
"""

# An escalated workflow resumed by an operator: the escalation stays recorded (it
# never escalates again), with who resumed it and when; its envelope in the same
# transaction.
RESUME = """
WITH resumed AS (
    UPDATE workflows
    SET escalated_at = NULL, updated_at = now(),
        escalation = escalation || jsonb_build_object('resumed_at', now(),
                                                      'resumed_by', %(actor)s::text)
    WHERE id = %(workflow)s AND escalated_at IS NOT NULL AND cancelled_at IS NULL
    RETURNING id, name, trace_id
)
INSERT INTO event_outbox (kind, trace_id, causation_id, subject_id, emitted_at, payload)
SELECT 'evt.workflow.resumed.v1', trace_id, id::text, id::text, now(),
       jsonb_build_object('workflow_id', id, 'name', name, 'resumed_by', %(actor)s::text)
FROM resumed
RETURNING subject_id
"""


# The escalated workflows (resumed or cancelled ones are not), with a task of
# %(agent)s when given: the workflow_escalated alert rules' figure (an index holds
# the escalated ones, however many workflows there are).
ESCALATED_WORKFLOWS = """
SELECT w.id, w.name, w.escalation FROM workflows w
WHERE w.escalated_at IS NOT NULL AND w.cancelled_at IS NULL
  AND (%(agent)s::text IS NULL
       OR EXISTS (SELECT FROM tasks t WHERE t.workflow_id = w.id AND t.agent_name = %(agent)s))
"""


def escalated_workflows(agent: str | None) -> list[tuple[UUID, str, dict[str, Any]]]:
    """(workflow, name, escalation) of each escalated one (with a task of ``agent``)."""
    return [
        (workflow, name, json.loads(escalation))  # Django reads jsonb as text
        for workflow, name, escalation in fetch(ESCALATED_WORKFLOWS, {"agent": agent})
    ]


def workflows_over_their_failures(*, limit: int) -> list[tuple[UUID, int, int]]:
    """(workflow, dead or failed tasks, threshold) of those to escalate."""
    return fetch(WORKFLOWS_OVER_THEIR_FAILURES, {"limit": limit})


def workflows_past_their_deadline(*, limit: int) -> list[tuple[UUID, int, bool]]:
    """(workflow, escalate_after_seconds, still running) of those whose deadline passed."""
    return fetch(WORKFLOWS_PAST_THEIR_DEADLINE, {"limit": limit, "now": None})


def escalate(escalations: dict[UUID, dict[str, Any]]) -> list[UUID]:
    """Escalate these workflows, each with its detail; those that escalated."""
    if not escalations:
        return []
    rows = [{"id": str(wid), "detail": detail} for wid, detail in escalations.items()]
    return [row[0] for row in fetch(ESCALATE, {"escalations": json.dumps(rows)})]


def resume(workflow_id: UUID, actor: str) -> bool:
    """Whether the workflow was escalated (and is now resumed)."""
    return bool(fetch(RESUME, {"workflow": workflow_id, "actor": actor}))
