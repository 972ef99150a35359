"""Formatting for the dashboard's figures."""

import json
from typing import Any

from django import template

from task_queue import ids

register = template.Library()
register.filter("short_id", ids.short_id)


@register.filter
def seconds(value: float | None) -> str:
    """A duration for people: 850 ms, 12.3 s, 4 min 05 s, 2 h 10 min; – when unknown."""
    if value is None or value == "":
        return "–"
    value = float(value)
    if value < 1:
        return f"{value * 1000:.0f} ms"
    if value < 60:
        return f"{value:.1f} s"
    if value < 3600:
        return f"{int(value // 60)} min {int(value % 60):02d} s"
    return f"{int(value // 3600)} h {int(value % 3600 // 60):02d} min"


@register.filter
def percent(value: float | None) -> str:
    return "–" if value is None else f"{value * 100:.1f} %"


@register.filter
def pretty_json(value: Any) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True)
