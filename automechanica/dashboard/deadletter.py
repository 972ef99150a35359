"""The dead-letter page's filter: a form whose cleaned values narrow a queryset.

The same filter selects the rows shown, the rows a "revive all matching" acts on and
the count its confirmation states, so the three cannot disagree.
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.db.models import QuerySet

from task_queue import registry
from task_queue.models import REVIVABLE_STATUSES, Task, dead_letter_payload_contains


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

    def tasks(self) -> QuerySet[Task]:
        """Dead and failed tasks matching the valid filters, newest death first."""
        # The list shows neither payload nor result: they stay in the database.
        tasks = Task.objects.filter(status__in=REVIVABLE_STATUSES).defer("payload", "result")
        if self.is_bound and not self.is_valid():
            # Never widen an invalid filter to "everything": match nothing and say why.
            return tasks.none()
        values = self.cleaned_data if self.is_bound else {}
        if values.get("agent"):
            tasks = tasks.filter(agent_name=values["agent"])
        if values.get("task_type"):
            tasks = tasks.filter(task_type=values["task_type"])
        if values.get("error_class"):
            tasks = tasks.filter(error_info__type=values["error_class"])
        if values.get("since"):
            tasks = tasks.filter(finished_at__gte=values["since"])
        if values.get("until"):
            tasks = tasks.filter(finished_at__lt=values["until"])
        if values.get("q"):
            tasks = dead_letter_payload_contains(tasks, values["q"])
        return tasks.order_by("-finished_at", "-id")

    def as_record(self) -> dict[str, str]:
        """The filter as the operator set it, for the audit log and links."""
        if not self.is_valid():
            return {}
        return {
            name: str(value) for name, value in self.cleaned_data.items() if value not in ("", None)
        }
