"""The system checks a long-running command that serves no URL runs as it starts."""

from __future__ import annotations

from django.core.checks import Tags
from django.core.checks.registry import registry


class ChecksWithoutUrls:
    """For a ``BaseCommand`` that serves no URL (a worker, a loop): every system check
    but the URL conf's. Those import the whole URL conf, the HTTP API with its
    schemas, half a second of every start of a process that never serves it. A
    check without a tag is not run either: the project's own are tagged ``settings``
    (``automechanica.apps``)."""

    @property
    def requires_system_checks(self) -> list[str]:
        return sorted(registry.tags_available() - {Tags.urls})
