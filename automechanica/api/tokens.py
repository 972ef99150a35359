"""Creating and checking API tokens."""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Collection, Sequence
from datetime import timedelta

from django.db import connection
from django.utils import timezone

from agents_app.messaging import check_text
from task_queue.sql.db import fetch_bound

from .models import ApiToken, Scope

TOKEN_PREFIX = "am_"
# last_used_at is written at most this often per token, not on every request.
LAST_USED_RESOLUTION = timedelta(minutes=1)


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def create_token(name: str, scope: str, agents: Sequence[str] = ()) -> tuple[ApiToken, str]:
    """A new token for ``name``, bound to ``agents`` if any (it may then send and read
    agent messages only as them); returns the row and the token, which is not stored."""
    if not name.strip():
        raise ValueError("the token needs a name")
    if scope not in Scope.values:
        raise ValueError(f"scope must be one of {', '.join(Scope.values)}, not {scope!r}")
    for agent in agents:
        check_text("agent", agent, required=True)  # InvalidMessage is a ValueError
    agents = sorted(set(agents))
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    row = ApiToken.objects.create(
        name=name.strip(),
        scope=scope,
        prefix=token[:10],
        token_hash=hash_token(token),
        agents=agents,
    )
    return row, token


# Every API request reads its token: one prepared statement, rather than the ORM's
# query, which took 1.2 ms of CPU to this 0.2 ms (the 2-core machine of
# docs/performance.md); prepared, PostgreSQL no longer parses and plans it each time
# (206 µs a request in its log during a remote drain).
# Every column, in the model's order (Model.from_db takes a full row by position).
TOKEN_FIELDS = [field.attname for field in ApiToken._meta.concrete_fields]
ACTIVE_TOKEN = f"""
SELECT {", ".join(field.column for field in ApiToken._meta.concrete_fields)} FROM api_tokens
WHERE token_hash = %(token_hash)s AND revoked_at IS NULL
"""


def find_active_token(token: str) -> ApiToken | None:
    """The unrevoked token row for ``token``, or None."""
    if not token.startswith(TOKEN_PREFIX) or "\x00" in token:
        return None
    found = fetch_bound(ACTIVE_TOKEN, {"token_hash": hash_token(token)}, prepared=True)
    row = None if not found else ApiToken.from_db(connection.alias, TOKEN_FIELDS, found[0])
    if row is not None:
        now = timezone.now()
        if row.last_used_at is None or now - row.last_used_at > LAST_USED_RESOLUTION:
            ApiToken.objects.filter(pk=row.pk).update(last_used_at=now)
    return row


def active_token_ids(ids: Collection[int]) -> set[int]:
    """Those of ``ids`` whose tokens still exist and are not revoked."""
    return set(ApiToken.objects.filter(pk__in=ids, revoked_at=None).values_list("pk", flat=True))
