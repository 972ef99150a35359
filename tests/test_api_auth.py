"""Who may call what: every API route refuses a missing, unknown, revoked or too
small token. The routes come from Django's URL resolver, so a new route is tested
(and fails until its scope is written down here)."""

from __future__ import annotations

import json
import re
import uuid

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver
from django.utils import timezone

from automechanica.api.models import ApiToken
from tests.support.api import Api, token

pytestmark = pytest.mark.django_db

METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE")
SCOPES = ("read", "write", "admin")

# (method, route) -> the smallest scope that may call it.
REQUIRED_SCOPE = {
    ("GET", "api/openapi.json"): "read",
    ("GET", "api/docs"): "read",
    ("POST", "api/v1/tasks"): "write",
    ("GET", "api/v1/tasks"): "read",
    ("GET", "api/v1/dead-letter"): "read",
    ("POST", "api/v1/tasks/revive"): "admin",
    ("GET", "api/v1/tasks/<task_id>"): "read",
    ("GET", "api/v1/tasks/<task_id>/similar"): "read",
    ("GET", "api/v1/memory/similar"): "read",
    ("POST", "api/v1/messages"): "write",
    ("GET", "api/v1/messages"): "read",
    ("POST", "api/v1/messages/receive"): "write",
    ("POST", "api/v1/messages/<message_id>/ack"): "write",
    ("POST", "api/v1/publications"): "write",
    ("POST", "api/v1/publications/subscriptions"): "write",
    ("GET", "api/v1/publications/subscriptions"): "read",
    ("POST", "api/v1/publications/subscriptions/unsubscribe"): "write",
    ("POST", "api/v1/publications/receive"): "write",
    ("POST", "api/v1/publications/deliveries/<delivery_id>/ack"): "write",
    ("PATCH", "api/v1/tasks/<task_id>"): "write",
    ("POST", "api/v1/tasks/<task_id>/cancel"): "write",
    ("POST", "api/v1/tasks/<task_id>/revive"): "write",
    ("POST", "api/v1/workflows"): "write",
    ("GET", "api/v1/workflows"): "read",
    ("GET", "api/v1/workflows/<workflow_id>"): "read",
    ("PATCH", "api/v1/workflows/<workflow_id>"): "write",
    ("POST", "api/v1/workflows/<workflow_id>/cancel"): "write",
    ("GET", "api/v1/agents"): "read",
    ("GET", "api/v1/workers"): "read",
    ("GET", "api/v1/metrics"): "read",
}


def api_routes() -> list[str]:
    """Every URL pattern under api/, as written in the resolver."""

    def walk(patterns, prefix: str):
        for pattern in patterns:
            if isinstance(pattern, URLResolver):
                yield from walk(pattern.url_patterns, prefix + str(pattern.pattern))
            elif isinstance(pattern, URLPattern):
                yield prefix + str(pattern.pattern)

    routes = {r for r in walk(get_resolver().url_patterns, "") if r.startswith("api/")}
    # ninja's root marker (it computes paths from it); it answers 404 to everything.
    routes.discard("api/")
    return sorted(routes)


def url(route: str) -> str:
    return "/" + re.sub(r"<[^>]+>", str(uuid.uuid4()), route)


@pytest.fixture
def operations() -> list[tuple[str, str]]:
    """(method, route) for every method each API route answers (anything but 405)."""
    admin = Api(token("admin", "probe"))
    found = []
    for route in api_routes():
        for method in METHODS:
            if admin.call(method, url(route), {}).status_code != 405:
                found.append((method, route))
    return found


def test_every_route_has_a_declared_scope(operations):
    assert sorted(operations) == sorted(REQUIRED_SCOPE)


def test_every_route_refuses_a_missing_bad_or_revoked_token(operations):
    revoked = token("admin", "revoked")
    ApiToken.objects.filter(name="revoked").update(revoked_at=timezone.now())
    callers = {
        "no token": Api(None),
        "bad token": Api("am_not-a-token"),
        "not bearer": Api(None),
        "revoked": Api(revoked),
    }
    callers["not bearer"].headers = {"Authorization": "Basic dXNlcjpwYXNz"}
    for method, route in operations:
        for who, caller in callers.items():
            response = caller.call(method, url(route), {})
            assert response.status_code == 401, (method, route, who)
            assert response.json()["code"] == "unauthorized"
            assert response["WWW-Authenticate"] == "Bearer"


def test_every_route_refuses_too_small_a_scope_and_admits_its_own(operations):
    callers = {scope: Api(token(scope)) for scope in SCOPES}
    for method, route in operations:
        required = REQUIRED_SCOPE[(method, route)]
        for scope in SCOPES:
            response = callers[scope].call(method, url(route), {})
            if SCOPES.index(scope) < SCOPES.index(required):
                assert response.status_code == 403, (method, route, scope)
                assert response.json()["code"] == "forbidden"
            else:
                assert response.status_code not in (401, 403), (method, route, scope)


def test_too_small_a_scope_is_named_in_the_users_words():
    response = Api(token("read", name="reporting")).post("/api/v1/tasks", {})
    assert response.status_code == 403
    assert response.json()["message"] == (
        "this route needs a token with scope 'write'; token 'reporting' has 'read'"
    )
    assert "Scope." not in response.content.decode()


def _unique_keys(pairs: list[tuple[str, object]]) -> dict:
    """A JSON object hook refusing duplicate keys (Swagger UI's parser refuses them)."""
    keys = [key for key, _ in pairs]
    assert len(keys) == len(set(keys)), f"duplicate keys in {keys}"
    return dict(pairs)


def test_docs_open_for_a_logged_in_staff_user_only():
    staff = User.objects.create_user("ops", password="pw", is_staff=True)
    client = Client()
    client.force_login(staff)
    assert client.get("/api/docs").status_code == 200
    schema = json.loads(client.get("/api/openapi.json").content, object_pairs_hook=_unique_keys)
    assert schema["info"]["title"] == "AutoMechanica API"
    plain = Client()
    plain.force_login(User.objects.create_user("someone", password="pw"))
    assert plain.get("/api/docs").status_code == 401
    assert plain.get("/api/v1/tasks").status_code == 401  # a session is not a token


def test_create_api_token_prints_the_token_last(capsys):
    call_command("create_api_token", "orchestrator", "--scope", "write")
    lines = capsys.readouterr().out.strip().splitlines()
    secret = lines[-1]
    row = ApiToken.objects.get(name="orchestrator")
    assert row.scope == "write" and secret not in row.token_hash and secret.startswith(row.prefix)
    assert Api(secret).get("/api/v1/tasks").status_code == 200


def test_create_api_token_refuses_an_unknown_scope():
    import subprocess
    import sys

    result = subprocess.run(
        [sys.executable, "manage.py", "create_api_token", "x", "--scope", "root"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode != 0
    assert "invalid choice: 'root'" in result.stderr
