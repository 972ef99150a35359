"""The alerts page's form for a new or changed alert rule.

It only reads what was typed (numbers, the channels' JSON, a blank agent meaning
every agent); whether that makes a rule (the kind's threshold range, the agent, each
channel's URL) is decided by ``task_queue.alerts.rules``, as for the API, and its
refusal is shown on the field it names (:meth:`AlertRuleForm.refuse`).

A channel's secret is never shown back: when a rule is changed, a blank channels
field keeps the channels it has (``[]`` removes them all).
"""

from __future__ import annotations

from typing import Any

from django import forms

from task_queue.alerts import rules
from task_queue.alerts.channels import shown
from task_queue.models import AlertKind, AlertRule

from . import form_inputs

TEXT = forms.TextInput(attrs={"autocomplete": "off", "spellcheck": "false"})
CHANNELS_EXAMPLE = (
    '[{"type": "webhook", "url": "https://ops.example.com/hook", "secret": "…"},\n'
    ' {"type": "slack", "url": "https://hooks.slack.com/services/…"},\n'
    ' {"type": "email", "to": ["oncall@example.com"]}]'
)


class AlertRuleForm(forms.Form):
    # Blanks are left to the shared check where it names what is needed (the name,
    # the threshold); the kind and the whole numbers are the form's own to require.
    name = forms.CharField(required=False, widget=TEXT)
    kind = forms.ChoiceField(choices=AlertKind.choices)
    agent = forms.CharField(required=False, help_text="Blank: every agent, each on its own.")
    threshold = forms.FloatField(
        required=False,
        help_text="dead_letter, lease_expirations: tasks; failure_rate: 0 to 1; "
        "backlog_age, schedule_missed: seconds; no_workers, workflow_escalated: 0.",
    )
    window_seconds = forms.IntegerField(
        label="Window (seconds)", initial=rules.DEFAULTS["window_seconds"]
    )
    min_count = forms.IntegerField(
        label="Minimum count",
        initial=rules.DEFAULTS["min_count"],
        help_text="failure_rate: fewer tasks finished in the window never fire it.",
    )
    repeat_seconds = forms.IntegerField(
        label="Repeat (seconds)",
        initial=rules.DEFAULTS["repeat_seconds"],
        help_text="While it holds, notify again this often.",
    )
    channels = forms.CharField(
        required=False,
        widget=forms.Textarea(
            attrs={"rows": 4, "spellcheck": "false", "placeholder": CHANNELS_EXAMPLE}
        ),
        help_text="A JSON list of channels.",
    )
    enabled = forms.BooleanField(required=False, initial=True)

    def __init__(self, *args: Any, rule: AlertRule | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.rule = rule
        form_inputs.agent_select(self, "agent", blank="every agent")
        if rule is not None and rule.channels:
            now = "; ".join(_described(shown(channel)) for channel in rule.channels)
            self.fields["channels"].help_text = (
                f"Now: {now}. Blank keeps these {len(rule.channels)} channel(s), whose "
                "secrets and paths are not shown; a JSON list replaces them ([] removes them)."
            )

    @classmethod
    def of(cls, rule: AlertRule) -> AlertRuleForm:
        """An unbound form showing ``rule`` (its channels left blank: they hold secrets)."""
        initial = {field: getattr(rule, field) for field in rules.FIELDS if field != "channels"}
        return cls(initial={**initial, "agent": rule.agent or ""}, rule=rule)

    def clean_channels(self) -> Any:
        text = self.cleaned_data["channels"].strip()
        if not text:
            return None  # kept (a change) or none (a new rule)
        return form_inputs.parsed_json(text, "channels")

    def values(self) -> dict[str, Any]:
        """What was typed, as ``task_queue.alerts.rules`` takes it (a valid form only).
        A whole-number threshold is given as an integer, as the API would."""
        values = dict(self.cleaned_data)
        values["agent"] = values["agent"] or None
        threshold = values["threshold"]
        if threshold is not None and threshold.is_integer():
            values["threshold"] = int(threshold)
        if values["channels"] is None:
            if self.rule is not None:
                del values["channels"]
            else:
                values["channels"] = []
        return values

    def refuse(self, error: rules.InvalidRule) -> None:
        """Show the shared check's refusal on the field it names (a channel's own
        field, ``channels[1].url``, on the channels)."""
        field = error.field.split("[", 1)[0].split(".", 1)[0]
        message = error.message if field == error.field else f"{error.field}: {error.message}"
        self.add_error(field if field in self.fields else None, message)


def _described(channel: dict[str, Any]) -> str:
    """A channel as ``channels.shown`` gives it, in words."""
    if channel["type"] == "email":
        return f"email to {', '.join(channel['to'])}"
    return f"{channel['type']} {channel['url']}{' (signed)' if channel['signed'] else ''}"
