"""The dead-letter page's filter: a form whose cleaned values narrow a queryset.

The same filter selects the rows shown, the rows a "revive all matching" acts on and
the count its confirmation states, so the three cannot disagree. It narrows the dead
letter's compact table (``DeadLetterEntry``), which counts and pages it; a page's
tasks are then read by key (:class:`DeadLetterRows`).
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.db.models import QuerySet

from task_queue import registry
from task_queue.models import (
    DeadLetterEntry,
    Task,
    dead_letter_payload_contains,
    dead_letter_tasks,
)

# Newest death first, the same in the compact table and in tasks.
ORDER = ("-finished_at", "-id")


class DeadLetterFilter(forms.Form):
    agent = forms.ChoiceField(required=False)
    task_type = forms.CharField(required=False, max_length=200)
    error_class = forms.CharField(required=False, max_length=200, label="Error class")
    since = forms.DateTimeField(
        required=False, widget=forms.DateTimeInput(attrs={"type": "datetime-local"})
    )
    until = forms.DateTimeField(
        required=False, widget=forms.DateTimeInput(attrs={"type": "datetime-local"})
    )
    q = forms.CharField(required=False, max_length=200, label="Payload contains")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["agent"].choices = [("", "any agent")] + [(n, n) for n in registry.names()]

    def entries(self) -> QuerySet[DeadLetterEntry]:
        """The dead letter's entries (dead and failed tasks) matching the valid
        filters, newest death first."""
        entries = DeadLetterEntry.objects.all()
        if self.is_bound and not self.is_valid():
            # Never widen an invalid filter to "everything": match nothing and say why.
            return entries.none()
        values = self.cleaned_data if self.is_bound else {}
        if values.get("agent"):
            entries = entries.filter(agent_name=values["agent"])
        if values.get("task_type"):
            entries = entries.filter(task_type=values["task_type"])
        if values.get("error_class"):
            entries = entries.filter(error_class=values["error_class"])
        if values.get("since"):
            entries = entries.filter(finished_at__gte=values["since"])
        if values.get("until"):
            entries = entries.filter(finished_at__lt=values["until"])
        if values.get("q"):
            entries = dead_letter_payload_contains(entries, values["q"])
        return entries.order_by(*ORDER)

    def as_record(self) -> dict[str, str]:
        """The filter as the operator set it, for the audit log and links."""
        if not self.is_valid():
            return {}
        return {
            name: str(value) for name, value in self.cleaned_data.items() if value not in ("", None)
        }


class DeadLetterRows:
    """Filtered entries as Django's Paginator reads them: counted in the compact table,
    and a page (a slice) read as tasks, by key, newest death first."""

    def __init__(self, entries: QuerySet[DeadLetterEntry], *, page_size: int) -> None:
        self.entries = entries
        self.page_size = page_size

    def count(self) -> int:
        return self.entries.count()

    def __getitem__(self, window: slice) -> list[Task]:
        # The Paginator asks the last page for exactly the entries it counted (one, for
        # a rare search term). Asked for so few, the planner expects to find them early
        # in the order index and walks it, all of it when the few are old; asked for a
        # whole page it scans and sorts the matches when its statistics say they are
        # few (a rare term at ten million tasks: that statement 106 -> 50 ms).
        wanted = window.stop - window.start
        whole_page = slice(window.start, window.start + max(wanted, self.page_size))
        # The list shows neither payload nor result: they stay in the database.
        tasks = dead_letter_tasks(self.entries[whole_page]).defer("payload", "result")
        return list(tasks.order_by(*ORDER))[:wanted]
