"""The dead letter's compact table: one short row per dead or failed task.

``dead_letter_payloads`` (migrations ``queue 0023`` and ``0025``) holds, for each dead
or failed task, its upper-cased payload text and the columns the dead letter filters
and orders by, kept exact by row triggers on ``tasks`` whose WHEN clause is false for
every other task. The dead letter (the dashboard's page and count, the API's list and
bulk revive) is filtered, counted and paged here, 200,000 short rows at ten million
tasks, never over the dead tasks' heap rows spread over the whole table; only the
rows of a page are read from ``tasks``, by key (:func:`dead_letter_tasks`).
"""

from __future__ import annotations

from django.db import models
from django.db.models.functions import Upper

from .tasks import Task


class DeadLetterEntry(models.Model):
    """A dead or failed task as the dead letter filters and orders it (read only: the
    triggers write it). Its fields have the names of the task's, so the same filters
    apply to either."""

    id = models.UUIDField(primary_key=True, db_column="task_id")
    # upper(payload::text): what the payload search matches.
    payload_text = models.TextField()
    status = models.TextField()
    agent_name = models.TextField()
    task_type = models.TextField()
    # error_info's "type" when it is a JSON string, else null.
    error_class = models.TextField(null=True)
    priority = models.IntegerField()
    workflow_id = models.UUIDField(null=True)
    trace_id = models.TextField(null=True)
    created_at = models.DateTimeField()
    updated_at = models.DateTimeField()
    finished_at = models.DateTimeField(null=True)

    class Meta:
        db_table = "dead_letter_payloads"
        managed = False

    def __str__(self) -> str:
        return f"{self.agent_name}.{self.task_type} {self.id} ({self.status})"


def dead_letter_payload_contains(
    entries: models.QuerySet[DeadLetterEntry], text: str
) -> models.QuerySet[DeadLetterEntry]:
    """The ``entries`` whose task's payload, as JSON text, contains ``text`` in any
    case: the tasks :func:`~task_queue.models.payload_contains` finds among the dead
    and failed ones. Django's ``contains`` is a ``LIKE`` with the term's ``%``, ``_``
    and ``\\`` escaped, so the term matches literally.

    A ``LIKE`` rather than ``strpos(...) > 0``, whose share of matching rows the
    planner cannot estimate (it takes a third): then it walked an order index of the
    whole table in hope of an early stop, and a term that matches few read every
    entry that way (240 ms at ten million tasks, against 40 ms for a scan and a
    sort). The pattern's share it estimates from the column's statistics."""
    return entries.filter(payload_text__contains=Upper(models.Value(text)))


def dead_letter_tasks(entries: models.QuerySet[DeadLetterEntry]) -> models.QuerySet[Task]:
    """The tasks of ``entries`` (typically a page of them, sliced), read from ``tasks``
    by key in the same statement as the entries are chosen, so both come from one
    snapshot. Unordered: the caller orders them as it ordered the entries."""
    return Task.objects.filter(id__in=entries.values("id"))
