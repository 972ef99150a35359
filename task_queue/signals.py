"""Checks wired to Django signals in ``TaskQueueConfig.ready``."""

from typing import Any

from django.core.management.base import CommandError
from django.db import connections


def require_pgvector(using: str = "default", **kwargs: Any) -> None:
    """pre_migrate: stop ``migrate`` before it applies anything if pgvector is missing.

    CommandError is what ``manage.py`` prints as one line, exiting non-zero.
    """
    with connections[using].cursor() as cursor:
        cursor.execute("SELECT 1 FROM pg_available_extensions WHERE name = 'vector'")
        if cursor.fetchone() is not None:
            return
        cursor.execute("SHOW server_version")
        version = cursor.fetchone()[0]
    raise CommandError(
        f"the PostgreSQL server ({version}) lacks the pgvector extension, which the "
        "schema needs: install pgvector on it (the pgvector/pgvector image or the "
        "postgresql-NN-pgvector package), or unset DATABASE_URL to use the embedded "
        "server, which has it"
    )
