"""``settings.LOGGING`` from the environment: ``LOG_LEVEL`` and ``LOG_FORMAT``.

``LOG_FORMAT=json`` writes each line as one JSON object (python-json-logger): the
time, level, logger and message, and for a line about a task its ``task_id``,
``trace_id``, ``agent``, ``worker`` and ``attempt`` (``task_queue.task_logging``).
Unset (or ``text``), lines are human text, on a terminal or not. Every process
Django starts reads it, so ``up`` passes it on to the processes it runs.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from automechanica.deployment import SettingsRefused

FORMATS = ("text", "json")


def logging_settings(env: Mapping[str, str]) -> dict[str, Any]:
    """The ``LOGGING`` dict; :class:`SettingsRefused` for an unknown ``LOG_FORMAT``."""
    chosen = env.get("LOG_FORMAT", "").strip().lower() or "text"
    if chosen not in FORMATS:
        raise SettingsRefused(f"LOG_FORMAT must be text or json, not {env['LOG_FORMAT']!r}")
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "filters": {"task": {"()": "task_queue.task_logging.TaskFields"}},
        "formatters": {
            "text": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"},
            "json": {
                "()": "pythonjsonlogger.json.JsonFormatter",
                "fmt": "%(asctime)s %(levelname)s %(name)s %(message)s",
                "rename_fields": {"asctime": "time", "levelname": "level", "name": "logger"},
            },
        },
        "handlers": {
            "console": {
                "class": "logging.StreamHandler",
                "formatter": chosen,
                "filters": ["task"],
            }
        },
        "root": {"handlers": ["console"], "level": env.get("LOG_LEVEL", "INFO")},
    }
