"""Checks wired to Django signals in ``TaskQueueConfig.ready``."""

from typing import Any

from django.core.management.base import CommandError
from django.db import connections

# The oldest PostgreSQL the schema is tested on. The ids of queue 0030 and 0041 take
# 52 random bits from random(), which PostgreSQL 14 gives only 48 of.
MIN_SERVER_VERSION_NUM, MIN_SERVER_VERSION = 150000, "15"

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
            f"is older than PostgreSQL {MIN_SERVER_VERSION}, the oldest the schema is "
            "tested on (its ids take 52 random bits from random())"
        )
    if not has_pgvector:
        problems.append("lacks the pgvector extension, which the schema needs")
    if problems:
        raise CommandError(
            f"the PostgreSQL server ({version}) {' and '.join(problems)}: use PostgreSQL "
            f"{MIN_SERVER_VERSION} or newer with pgvector (a pgvector/pgvector image, or "
            f"postgresql-{max(number // 10000, 15)}-pgvector from the PostgreSQL project's apt "
            "repository, apt.postgresql.org, on Debian and Ubuntu), or unset DATABASE_URL "
            "to use the embedded server, which has both"
        )
