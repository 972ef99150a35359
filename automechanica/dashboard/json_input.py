"""JSON typed into a dashboard form (a schedule's payload, an alert rule's channels)."""

from __future__ import annotations

import json
from typing import Any

from django import forms


def parsed(text: str, what: str) -> Any:
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
