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
from django.core.management.base import CommandError
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver
from django.utils import timezone

from agents_app import messaging, pubsub
from agents_app.models import AgentMessage, Publication, PublicationDelivery, Subscription
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
    ("POST", "api/v1/messages/<message_id>/revive"): "write",
    ("POST", "api/v1/publications"): "write",
    ("POST", "api/v1/publications/subscriptions"): "write",
    ("GET", "api/v1/publications/subscriptions"): "read",
    ("POST", "api/v1/publications/subscriptions/unsubscribe"): "write",
    ("POST", "api/v1/publications/receive"): "write",
    ("POST", "api/v1/publications/deliveries/<delivery_id>/ack"): "write",
    ("GET", "api/v1/publications/deliveries"): "read",
    ("POST", "api/v1/publications/deliveries/<delivery_id>/revive"): "write",
    ("PATCH", "api/v1/tasks/<task_id>"): "write",
    ("POST", "api/v1/tasks/<task_id>/cancel"): "write",
    ("POST", "api/v1/tasks/<task_id>/revive"): "write",
    ("POST", "api/v1/workflows"): "write",
    ("GET", "api/v1/workflows"): "read",
    ("GET", "api/v1/workflows/<workflow_id>"): "read",
    ("PATCH", "api/v1/workflows/<workflow_id>"): "write",
    ("POST", "api/v1/workflows/<workflow_id>/cancel"): "write",
    ("POST", "api/v1/workflows/<workflow_id>/resume"): "write",
    ("POST", "api/v1/schedules"): "write",
    ("GET", "api/v1/schedules"): "read",
    ("PATCH", "api/v1/schedules/<schedule_id>"): "write",
    ("DELETE", "api/v1/schedules/<schedule_id>"): "write",
    ("POST", "api/v1/schedules/<schedule_id>/run"): "write",
    ("GET", "api/v1/agents"): "read",
    ("PATCH", "api/v1/agents/<name>"): "admin",
    ("GET", "api/v1/workers"): "read",
    ("GET", "api/v1/metrics"): "read",
    ("POST", "api/v1/agents/<name>/claim"): "write",
    ("POST", "api/v1/tasks/<task_id>/claim"): "write",
    ("POST", "api/v1/tasks/<task_id>/heartbeat"): "write",
    ("POST", "api/v1/tasks/<task_id>/complete"): "write",
    ("POST", "api/v1/tasks/<task_id>/fail"): "write",
    ("POST", "api/v1/outcomes"): "write",
    ("POST", "api/v1/alert-rules"): "admin",
    ("GET", "api/v1/alert-rules"): "read",
    ("PATCH", "api/v1/alert-rules/<rule_id>"): "admin",
    ("DELETE", "api/v1/alert-rules/<rule_id>"): "admin",
    ("POST", "api/v1/alert-rules/<rule_id>/silence"): "admin",
    ("POST", "api/v1/alert-rules/<rule_id>/test"): "admin",
    ("GET", "api/v1/alerts"): "read",
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


# ------------------------------------------------------------ tokens bound to agents

BOUND, OTHER = "FitmentAgent", "PricingAgent"
MESSAGING = ("api/v1/messages", "api/v1/publications")


def agent_calls(agent: str) -> dict[tuple[str, str], tuple[str, dict | None, str]]:
    """(method, route) -> (path, body, the field a bound token is refused on) for every
    messaging operation, acting as ``agent`` (on its message and delivery)."""
    message = AgentMessage.objects.filter(to_agent=agent).values_list("id", flat=True)[0]
    delivery = PublicationDelivery.objects.filter(subscription__subscriber_agent=agent)[0].id
    receipt = {"receipt": str(uuid.uuid4())}
    subscription = {"subscriber_agent": agent, "name": "states"}
    return {
        ("POST", "api/v1/messages"): (
            "/api/v1/messages",
            {"from_agent": agent, "to_agent": "SEOAgent", "message_type": "notification"},
            "from_agent",
        ),
        ("GET", "api/v1/messages"): (f"/api/v1/messages?agent={agent}", None, "agent"),
        ("POST", "api/v1/messages/receive"): ("/api/v1/messages/receive", {"agent": agent},
                                              "agent"),
        ("POST", "api/v1/messages/<message_id>/ack"): (
            f"/api/v1/messages/{message}/ack", receipt, "message_id"
        ),
        ("POST", "api/v1/messages/<message_id>/revive"): (
            f"/api/v1/messages/{message}/revive", None, "message_id"
        ),
        ("POST", "api/v1/publications"): (
            "/api/v1/publications", {"publisher_agent": agent, "event_name": "x.y"},
            "publisher_agent",
        ),
        ("POST", "api/v1/publications/subscriptions"): (
            "/api/v1/publications/subscriptions", subscription, "subscriber_agent"
        ),
        ("GET", "api/v1/publications/subscriptions"): (
            f"/api/v1/publications/subscriptions?subscriber_agent={agent}", None,
            "subscriber_agent",
        ),
        ("POST", "api/v1/publications/subscriptions/unsubscribe"): (
            "/api/v1/publications/subscriptions/unsubscribe", subscription, "subscriber_agent"
        ),
        ("POST", "api/v1/publications/receive"): (
            "/api/v1/publications/receive", {"subscriber_agent": agent}, "subscriber_agent"
        ),
        ("GET", "api/v1/publications/deliveries"): (
            f"/api/v1/publications/deliveries?subscriber_agent={agent}", None,
            "subscriber_agent",
        ),
        ("POST", "api/v1/publications/deliveries/<delivery_id>/ack"): (
            f"/api/v1/publications/deliveries/{delivery}/ack", receipt, "delivery_id"
        ),
        ("POST", "api/v1/publications/deliveries/<delivery_id>/revive"): (
            f"/api/v1/publications/deliveries/{delivery}/revive", None, "delivery_id"
        ),
    }  # fmt: skip


@pytest.fixture
def two_agents() -> None:
    """A message to, and a delivery for, each of BOUND and OTHER."""
    for agent in (BOUND, OTHER):
        messaging.send("SEOAgent", agent, "notification")
        pubsub.subscribe(agent, "states", "state.*")
    pubsub.publish("SEOAgent", "state.changed")


def test_every_messaging_route_says_which_agent_field_binds_a_token(operations, two_agents):
    messaging_routes = {op for op in operations if op[1].startswith(MESSAGING)}
    assert messaging_routes == set(agent_calls(BOUND))


def test_a_bound_token_acts_only_as_its_agents_and_an_unbound_one_as_any(two_agents):
    bound = Api(token("admin", name="fitment", agents=(BOUND, "SEOAgent")))
    for (method, route), (path, body, field) in agent_calls(OTHER).items():
        refused = bound.call(method, path, body)
        assert refused.status_code == 403, (method, route, refused.content)
        answer = refused.json()
        assert answer["code"] == "agent_not_allowed", (method, route)
        assert [e["field"] for e in answer["field_errors"]] == [field], (method, route)
        assert answer["details"] == {"agent": OTHER, "token_agents": [BOUND, "SEOAgent"]}
    # Nothing was done as OTHER, nor to its mailbox or subscription.
    assert not AgentMessage.objects.filter(from_agent=OTHER).exists()
    assert AgentMessage.objects.get(to_agent=OTHER).status == "pending"
    assert not Publication.objects.filter(publisher_agent=OTHER).exists()
    assert PublicationDelivery.objects.get(subscription__subscriber_agent=OTHER).status == "pending"
    assert Subscription.objects.get(subscriber_agent=OTHER).active
    for (method, route), (path, body, _) in agent_calls(BOUND).items():
        assert bound.call(method, path, body).status_code not in (401, 403), (method, route)
    unbound = Api(token("write", name="anyone"))
    for (method, route), (path, body, _) in agent_calls(OTHER).items():
        assert unbound.call(method, path, body).status_code not in (401, 403), (method, route)


def test_a_bound_tokens_listings_show_only_its_agents(two_agents):
    bound = Api(token("read", name="fitment-reader", agents=(BOUND,)))
    assert {m["to_agent"] for m in bound.get("/api/v1/messages").json()} == {BOUND}
    subscriptions = bound.get("/api/v1/publications/subscriptions").json()
    assert {s["subscriber_agent"] for s in subscriptions} == {BOUND}
    deliveries = bound.get("/api/v1/publications/deliveries").json()
    assert {d["subscriber_agent"] for d in deliveries} == {BOUND}
    everyone = Api(token("read", name="reader"))
    assert {m["to_agent"] for m in everyone.get("/api/v1/messages").json()} == {BOUND, OTHER}
    refused = bound.post("/api/v1/messages/receive", {"agent": OTHER})
    assert refused.status_code == 403  # read scope: the scope is checked first
    assert refused.json()["code"] == "forbidden"


def test_a_refused_agent_is_named_in_the_users_words():
    fitment = Api(token("write", name="fitment", agents=(BOUND,)))
    refused = fitment.post("/api/v1/messages", {
        "from_agent": OTHER, "to_agent": BOUND, "message_type": "notification"})  # fmt: skip
    assert refused.json()["message"] == (
        "from_agent: is not one of this token's agents (token 'fitment' acts only as FitmentAgent)"
    )
    assert not AgentMessage.objects.exists()


def test_create_api_token_binds_the_token_to_agents(capsys):
    call_command("create_api_token", "fitment", "--scope", "write",
                 "--agent", BOUND, "--agent", "SEOAgent")  # fmt: skip
    lines = capsys.readouterr().out.strip().splitlines()
    assert "bound to FitmentAgent, SEOAgent" in lines[0]
    assert ApiToken.objects.get(name="fitment").agents == [BOUND, "SEOAgent"]
    api = Api(lines[-1])
    as_seo = {"from_agent": "SEOAgent", "to_agent": OTHER, "message_type": "notification"}
    assert api.post("/api/v1/messages", as_seo).status_code == 201
    assert api.post("/api/v1/messages", as_seo | {"from_agent": OTHER}).status_code == 403
    with pytest.raises(CommandError, match="agent: must be a non-empty string"):
        call_command("create_api_token", "blank", "--scope", "write", "--agent", " ")
    assert not ApiToken.objects.filter(name="blank").exists()
