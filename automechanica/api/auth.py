"""Bearer-token authentication with scopes, for every API route and the API docs."""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import Any

from django.http import HttpRequest, HttpResponse, HttpResponseNotAllowed, JsonResponse
from ninja.errors import AuthorizationError
from ninja.security import HttpBearer

from .errors import body
from .models import ApiToken, Scope, scope_allows
from .tokens import find_active_token


class TokenAuth(HttpBearer):
    """``Authorization: Bearer <token>`` whose scope includes ``scope``.

    No token or an unknown or revoked one answers 401 (ninja calls the API's
    AuthenticationError handler when this returns None); a valid token with too
    small a scope answers 403.
    """

    def __init__(self, scope: Scope) -> None:
        super().__init__()
        self.scope = Scope(scope)

    def authenticate(self, request: HttpRequest, token: str) -> ApiToken | None:
        row = find_active_token(token)
        if row is None:
            return None
        if not scope_allows(row.scope, self.scope):
            raise AuthorizationError(
                # The scopes' values, the words a user types (--scope write), not
                # the enum's repr (<Scope.WRITE: 'write'>).
                message=f"this route needs a token with scope '{self.scope.value}'; "
                f"token {row.name!r} has '{Scope(row.scope).value}'"
            )
        return row


def token_of_header(authorization: str, scope: Scope) -> ApiToken | None:
    """The active token of an ``Authorization: Bearer <token>`` value whose scope
    includes ``scope``, or None: for the live stream, a WebSocket that ninja does not
    route (the same check as ``TokenAuth``)."""
    kind, _, token = authorization.partition(" ")
    if kind.lower() != "bearer" or not token.strip():
        return None
    row = find_active_token(token.strip())
    if row is None or not scope_allows(row.scope, scope):
        return None
    return row


READ = TokenAuth(Scope.READ)
WRITE = TokenAuth(Scope.WRITE)
ADMIN = TokenAuth(Scope.ADMIN)


def token_or_staff(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    """For the OpenAPI schema and docs: a staff session (a browser) or any valid token."""

    @wraps(view)
    def guarded(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        if request.method not in ("GET", "HEAD"):
            return HttpResponseNotAllowed(["GET", "HEAD"])
        user = getattr(request, "user", None)
        if user is not None and user.is_active and user.is_staff:
            return view(request, *args, **kwargs)
        if READ(request) is not None:
            return view(request, *args, **kwargs)
        response = JsonResponse(
            body(
                "unauthorized",
                "log in as a staff user (/admin/) or send Authorization: Bearer <token>",
            ),
            status=401,
        )
        response["WWW-Authenticate"] = "Bearer"
        return response

    return guarded
