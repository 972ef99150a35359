"""Checks wired to Django signals in ``TaskQueueConfig.ready``."""

from typing import Any

from django.core.management.base import CommandError
from django.db import connections

# Migration queue 0030 calls random(min, max), which PostgreSQL has from 17 on.
MIN_SERVER_VERSION_NUM, MIN_SERVER_VERSION = 170000, "17"

SERVER = """
SELECT current_setting('server_version_num')::int, current_setting('server_version'),
       EXISTS (SELECT FROM pg_available_extensions WHERE name = 'vector')
"""


def require_a_capable_server(using: str = "default", **kwargs: Any) -> None:
    """pre_migrate: stop ``migrate`` before it applies anything if the server is too
    old for the schema or lacks pgvector (a half-migrated database otherwise).

    CommandError is what ``manage.py`` prints as one line, exiting non-zero.
    """
    with connections[using].cursor() as cursor:
        cursor.execute(SERVER)
        number, version, has_pgvector = cursor.fetchone()
    problems = []
    if number < MIN_SERVER_VERSION_NUM:
        problems.append(
            f"is older than PostgreSQL {MIN_SERVER_VERSION}, which the schema needs "
            "(migration queue 0030 calls random(min, max))"
        )
    if not has_pgvector:
        problems.append("lacks the pgvector extension, which the schema needs")
    if problems:
        raise CommandError(
            f"the PostgreSQL server ({version}) {' and '.join(problems)}: use PostgreSQL "
            f"{MIN_SERVER_VERSION} or newer with pgvector (the pgvector/pgvector:pg17 image, "
            "or postgresql-17-pgvector from the PostgreSQL project's apt repository, "
            "apt.postgresql.org, on Debian and Ubuntu), or unset DATABASE_URL to use the "
            "embedded server, which has both"
        )
