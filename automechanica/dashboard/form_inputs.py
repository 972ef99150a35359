"""What the dashboard's forms do alike (a schedule's, an alert rule's): JSON typed into
a field, the agent chosen from the registered ones, and saving through the shared
check with its refusal shown on the form."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, TypeVar

from django import forms

from task_queue import registry

T = TypeVar("T")


def parsed_json(text: str, what: str) -> Any:
    """``text`` read as JSON, or a ValidationError saying where it is not (``what``:
    what the text is, for the message)."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as bad:
        raise forms.ValidationError(
            f"Not valid JSON: {bad.msg} (line {bad.lineno}, column {bad.colno})"
        ) from None
    except RecursionError:
        raise forms.ValidationError(f"Nested too deeply to be read as the {what}.") from None
    except ValueError as bad:  # a number over Python's 4,300-digit limit, say
        raise forms.ValidationError(f"Not valid JSON: {bad}") from None


def agent_select(form: forms.Form, field: str, blank: str) -> None:
    """Make ``field`` a choice of the registered agents (``blank``: the empty choice's
    label). An agent no longer registered that the form holds is kept, so that the
    shared check can name it."""
    agents = registry.names()
    current = form[field].value()
    if current and current not in agents:
        agents.append(current)
    form.fields[field].widget = forms.Select(
        choices=[("", blank), *((name, name) for name in agents)]
    )


def saved(form: forms.Form, save: Callable[[], T], refused: type[Exception]) -> T | None:
    """What ``save()`` saved, once ``form`` is valid; None with the reason on the form
    where it is not, or where the shared check refuses it (``refused``, shown on the
    field it names by the form's ``refuse``). Other errors of ``save`` pass through."""
    if not form.is_valid():
        return None
    try:
        return save()
    except refused as refusal:
        form.refuse(refusal)
        return None
