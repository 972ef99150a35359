"""The dashboard's form for a new or changed schedule.

It only reads what was typed (whole numbers, the payload's JSON, blanks meaning
"none"); whether that makes a schedule (cron, time zone, one of cron and interval,
the agent and its task type, a free name) is decided by ``task_queue.schedules``, as
for the API and the admin, and its refusal is shown on the field it names
(:meth:`ScheduleForm.refuse`).
"""

from __future__ import annotations

import json
from typing import Any

from django import forms

from task_queue import registry, schedules
from task_queue.models import Schedule

from . import form_inputs

TEXT = forms.TextInput(attrs={"autocomplete": "off", "spellcheck": "false"})


class ScheduleForm(forms.Form):
    # Nothing is "required" here: an empty field goes to the shared check, which says
    # what it needs.
    name = forms.CharField(required=False, widget=TEXT)
    cron = forms.CharField(
        required=False,
        widget=forms.TextInput(attrs={"placeholder": "*/5 * * * *", "spellcheck": "false"}),
        help_text="Five fields: minute hour day month weekday. Or an interval below.",
    )
    timezone = forms.CharField(
        required=False,
        label="Time zone",
        initial="UTC",
        widget=TEXT,
        help_text="IANA name the cron expression is read in (blank: UTC).",
    )
    interval_seconds = forms.IntegerField(
        required=False,
        label="Interval (seconds)",
        help_text="Instead of cron: slots on multiples of this since the Unix epoch.",
    )
    agent_name = forms.CharField(required=False, label="Agent")
    task_type = forms.CharField(
        required=False, widget=forms.TextInput(attrs={"list": "schedule-task-types"})
    )
    payload = forms.CharField(
        required=False,
        initial="{}",
        widget=forms.Textarea(attrs={"rows": 4, "spellcheck": "false"}),
        help_text="A JSON object.",
    )
    priority = forms.IntegerField(initial=2, help_text="0 runs first (critical) … 9.")
    max_attempts = forms.IntegerField(required=False, help_text="Blank: the agent's own.")
    missed = forms.CharField(
        initial=Schedule.Missed.RUN_ONCE,
        label="Missed slots",
        widget=forms.Select(choices=Schedule.Missed.choices),
    )
    enabled = forms.BooleanField(required=False, initial=True)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        form_inputs.agent_select(self, "agent_name", blank="—")

    @classmethod
    def of(cls, schedule: Schedule) -> ScheduleForm:
        """An unbound form showing ``schedule``."""
        initial = {name: getattr(schedule, name) for name in ("name", *schedules.DEFINITION)}
        initial["payload"] = json.dumps(schedule.payload, indent=2, ensure_ascii=False)
        return cls(initial={**initial, "enabled": schedule.enabled})

    def clean_payload(self) -> Any:
        text = self.cleaned_data["payload"].strip() or "{}"
        return form_inputs.parsed_json(text, "payload")

    def definition(self) -> dict[str, Any]:
        """What was typed, as ``task_queue.schedules`` takes it (a valid form only)."""
        values = dict(self.cleaned_data)
        values["cron"] = values["cron"].strip() or None
        if not values["timezone"].strip():
            del values["timezone"]  # the default, UTC
        return values

    def refuse(self, error: schedules.InvalidSchedule) -> None:
        """Show the shared check's refusal on the field it names."""
        self.add_error(error.field if error.field in self.fields else None, error.message)

    @staticmethod
    def task_types() -> list[tuple[str, str]]:
        """Each registered agent's task types, for the task type's suggestions."""
        return [(agent.name, kind) for agent in registry.all_agents() for kind in agent.task_types]
