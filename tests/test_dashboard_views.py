"""The dashboard's pages and actions through Django's test client, on the real database:
who may see and do what, what each action changes, and what the audit log keeps."""

from __future__ import annotations

import json
import re
from uuid import UUID

import pytest
from django.contrib.auth.models import Permission, User
from django.contrib.staticfiles import finders
from django.http import HttpResponse
from django.test import Client
from django.urls import reverse

from task_queue import operations
from task_queue.ids import short_id
from task_queue.models import OperatorAction, PausedAgent, Task, TaskHistory, TaskStatus
from tests.support.queue import complete_pending, fail_pending, make_failed
from tests.support.users import staff as new_staff

pytestmark = pytest.mark.django_db

PAGES = ["/", "/dead-letter/", "/dead-letter/results/", "/dead-letter/count/", "/workers/",
         "/workflows/", "/audit/", "/messages/", "/reports/daily/"]  # fmt: skip


def staff(*perms: str, username: str = "ops") -> Client:
    return new_staff(*perms, username=username)


OPERATOR = ("queue.revive_task", "queue.cancel_task", "queue.pause_agent")


def dead_task(payload: dict | None = None) -> UUID:
    (task_id,) = make_failed([payload or {"n": 1}])
    assert Task.objects.get(id=task_id).status == TaskStatus.FAILED
    return task_id


@pytest.mark.parametrize("path", PAGES)
def test_pages_need_a_staff_session(path):
    assert Client().get(path).status_code == 302  # to the login page
    User.objects.create_user("user", password="pw", is_staff=False)
    client = Client()
    client.login(username="user", password="pw")
    response = client.get(path)
    assert response.status_code == 302 and "/admin/login/" in response["Location"]
    assert staff().get(path).status_code == 200


def test_task_page_shows_attempts_errors_and_workflow():
    task_id = dead_task()
    page = staff().get(f"/tasks/{task_id}/").content.decode()
    assert "failed" in page and "Boom" in page and "Traceback" in page
    assert staff(username="other").get(f"/tasks/{UUID(int=1)}/").status_code == 404


def test_task_page_counts_the_attempt_that_completed_or_runs():
    # `attempts` counts the attempts that failed; the one that completed, or runs, is
    # one more (the page said "0 of 3" for a task completed at its first try).
    (completed,) = [operations.enqueue("EchoAgent", "echo", {}).id]
    complete_pending("EchoAgent")
    failed = dead_task()
    client = staff()

    def attempts(task_id):
        page = client.get(f"/tasks/{task_id}/").content.decode()
        return re.search(r"<dd data-attempts>([^<]*)</dd>", page).group(1)

    assert attempts(completed) == "1 of 3"
    assert attempts(failed) == "1 of 3"


def test_overview_shows_counts_throughput_and_workers():
    operations.enqueue("EchoAgent", "echo", {})
    operations.enqueue("EchoAgent", "echo", {})
    complete_pending("EchoAgent")
    dead_task()
    page = staff().get("/").content.decode()
    row = page[page.index('data-agent="EchoAgent"') :]
    row = row[: row.index("</tr>")]
    assert '<td data-count="completed">2</td>' in row
    assert ">1</a>" in row  # the dead-letter count links to the filtered dead letter
    assert "33.3 %" in row  # 1 of 3 finished tasks failed


def test_a_staff_user_without_permissions_sees_no_action_and_a_forged_post_is_refused():
    task_id = dead_task()
    viewer = staff()
    page = viewer.get("/dead-letter/").content.decode()
    assert str(task_id) in page
    assert 'data-action="revive"' not in page and 'data-action="cancel"' not in page
    assert 'data-action="revive"' not in viewer.get(f"/tasks/{task_id}/").content.decode()
    assert "Pause</button>" not in viewer.get("/").content.decode()

    forged = [
        ("/dead-letter/act/", {"action": "revive", "ids": [str(task_id)]}),
        ("/dead-letter/act/", {"action": "cancel", "ids": [str(task_id)]}),
        ("/dead-letter/act/", {"action": "revive", "scope": "all"}),
        (f"/tasks/{task_id}/revive/", {}),
        (f"/tasks/{task_id}/cancel/", {}),
        (f"/tasks/{task_id}/run-now/", {}),
        (f"/tasks/{task_id}/edit/", {"payload": "{}"}),
        ("/agents/EchoAgent/pause/", {}),
        ("/agents/EchoAgent/resume/", {}),
    ]
    for path, data in forged:
        assert viewer.post(path, data).status_code == 403, path
    assert viewer.get(f"/tasks/{task_id}/edit/").status_code == 403
    assert Task.objects.get(id=task_id).status == TaskStatus.FAILED
    assert not OperatorAction.objects.exists() and not PausedAgent.objects.exists()


def test_each_permission_allows_only_its_own_actions():
    task_id = dead_task()
    reviver = staff("queue.revive_task")
    assert reviver.post(f"/tasks/{task_id}/cancel/").status_code == 403
    assert reviver.post("/agents/EchoAgent/pause/").status_code == 403
    assert reviver.post(f"/tasks/{task_id}/revive/").status_code == 302
    assert Task.objects.get(id=task_id).status == TaskStatus.PENDING


def test_revive_from_the_dead_letter_is_audited():
    first, second, untouched = dead_task(), dead_task(), dead_task()
    client = staff(*OPERATOR)
    response = client.post(
        "/dead-letter/act/", {"action": "revive", "ids": [str(first), str(second)]}
    )
    assert response.status_code == 200
    assert "Revived 2 task(s)." in response.content.decode()
    statuses = dict(Task.objects.values_list("id", "status"))
    assert (statuses[first], statuses[second], statuses[untouched]) == (
        "pending", "pending", "failed",
    )  # fmt: skip
    action = OperatorAction.objects.get()
    assert (action.actor, action.action, action.source) == ("user:ops", "revive", "dashboard")
    assert sorted(action.task_ids) == sorted([first, second])
    page = client.get(f"/tasks/{first}/").content.decode()
    assert "user:ops" in page and "Revive" in page
    assert "user:ops" in client.get("/audit/").content.decode()


def confirmation(response: HttpResponse) -> dict[str, str]:
    """The confirmation's hidden fields that bind the action to what it counted."""
    fields = re.findall(r'name="(confirmed_\w+)" value="([^"]+)"', response.content.decode())
    assert {name for name, _ in fields} == {"confirmed_at", "confirmed_count"}
    return dict(fields)


def test_revive_all_matching_confirms_the_count_and_records_the_filter():
    marked = [dead_task({"supplier": "acme", "i": i}) for i in range(3)]
    other = dead_task({"supplier": "globex"})
    client = staff(*OPERATOR)
    confirm = client.get("/dead-letter/confirm/", {"action": "revive", "q": "acme"})
    assert b"data-confirm-count>3<" in confirm.content
    confirmed = confirmation(confirm)
    response = client.post(
        "/dead-letter/act/", {"action": "revive", "scope": "all", "q": "acme", **confirmed}
    )
    assert "Revived 3 task(s)." in response.content.decode()
    assert set(Task.objects.filter(status="pending").values_list("id", flat=True)) == set(marked)
    assert Task.objects.get(id=other).status == TaskStatus.FAILED
    action = OperatorAction.objects.get()
    assert action.matched_filter == {"q": "acme", "confirmed_at": confirmed["confirmed_at"]}
    assert len(action.task_ids) == 3


@pytest.mark.django_db(transaction=True)  # now() per statement, as in production
def test_all_matching_acts_only_on_the_tasks_the_confirmation_counted():
    counted = [dead_task({"supplier": "acme"}) for _ in range(2)]
    client = staff(*OPERATOR)
    confirm = client.get("/dead-letter/confirm/", {"action": "cancel", "q": "acme"})
    assert b"data-confirm-count>2<" in confirm.content
    late = dead_task({"supplier": "acme"})  # dies while the operator reads the count
    form = {"action": "cancel", "scope": "all", "q": "acme"}
    assert client.post("/dead-letter/act/", form).status_code == 400  # no confirmation
    confirmed = confirmation(confirm)
    for bad in [{"confirmed_at": "2026-13-40T00:00:00+00:00"}, {"confirmed_count": "many"}]:
        assert client.post("/dead-letter/act/", form | confirmed | bad).status_code == 400
    # More match by the confirmation's time than it counted: nothing is done.
    response = client.post("/dead-letter/act/", form | confirmed | {"confirmed_count": "1"})
    assert "More tasks match than you confirmed" in response.content.decode()
    assert not OperatorAction.objects.exists()
    response = client.post("/dead-letter/act/", form | confirmed)
    assert "Cancelled 2 task(s)." in response.content.decode()
    statuses = dict(Task.objects.values_list("id", "status"))
    assert [statuses[i] for i in counted] == ["cancelled", "cancelled"]
    assert statuses[late] == TaskStatus.FAILED


def test_dead_letter_filters():
    echo = dead_task({"colour": "teal"})
    fail_pending("EchoAgent", retryable=False)
    client = staff()

    def shown(**query) -> bool:
        return str(echo) in client.get("/dead-letter/", query).content.decode()

    assert shown() and shown(agent="EchoAgent") and shown(task_type="echo")
    assert shown(error_class="Boom") and shown(q="teal")
    assert not shown(agent="FitmentAgent") and not shown(error_class="KeyError")
    assert not shown(q="magenta") and not shown(since="2999-01-01T00:00")
    assert shown(until="2999-01-01T00:00")


def test_the_dead_letter_results_and_count_have_urls_of_their_own():
    teal, other = dead_task({"colour": "teal"}), dead_task({"colour": "grey"})
    client = staff()
    results = client.get("/dead-letter/results/", {"q": "teal"}).content.decode()
    assert results.startswith('<div id="dead-letter-results"') and "<html" not in results
    assert str(teal) in results and str(other) not in results
    assert client.get("/dead-letter/count/", {"q": "teal"}).content == b"1"
    assert client.get("/dead-letter/count/").content == b"2"
    assert client.get("/dead-letter/count/", {"since": "not a date"}).content == b"0"
    # The page is the page, whatever element an htmx request says it targets.
    for target in ["dead-letter-results", "dead-letter-count"]:
        response = client.get("/dead-letter/", HTTP_HX_REQUEST="true", HTTP_HX_TARGET=target)
        page = response.content.decode()
        assert "<html" in page and 'id="dead-letter-results"' in page and str(other) in page


def test_pages_load_the_htmx_django_htmx_ships_then_live_js():
    page = staff().get("/").content.decode()
    scripts = re.findall(r'<script src="/static/([^"]+)"', page)
    assert scripts == ["django_htmx/htmx-2.min.js", "django_htmx/ext/hx-ws-2.min.js",
                       "dashboard/live.js"]  # fmt: skip
    assert all(finders.find(path) for path in scripts)
    assert 'hx-ext="ws,live"' in page


def test_edit_payload_and_revive_records_a_diff():
    task_id = dead_task({"sku": "rtr-1", "position": "middle"})
    client = staff(*OPERATOR)
    bad = client.post(f"/tasks/{task_id}/edit/", {"payload": '{"sku": '})
    assert bad.status_code == 400 and b"Not valid JSON" in bad.content
    not_object = client.post(f"/tasks/{task_id}/edit/", {"payload": "[1, 2]"})
    assert not_object.status_code == 400 and b"must be a JSON object" in not_object.content
    assert Task.objects.get(id=task_id).status == TaskStatus.FAILED  # nothing half-done

    fixed = json.dumps({"sku": "rtr-1", "position": "front"})
    assert client.post(f"/tasks/{task_id}/edit/", {"payload": fixed}).status_code == 302
    task = Task.objects.get(id=task_id)
    assert (task.status, task.payload) == ("pending", {"sku": "rtr-1", "position": "front"})
    action = OperatorAction.objects.get()
    assert action.action == "edit_and_revive"
    diff = action.changes["payload"]["diff"][str(task_id)]
    assert '-  "position": "middle",' in diff and '+  "position": "front",' in diff
    assert "position" in client.get("/audit/").content.decode()


def test_run_now_and_cancel_a_pending_task():
    task_id = operations.enqueue("EchoAgent", "echo", {}, delay_seconds=3600).id
    client = staff(*OPERATOR)
    assert b'data-action="run_now"' in client.get(f"/tasks/{task_id}/").content
    response = client.post(f"/tasks/{task_id}/run-now/", HTTP_HX_REQUEST="true")
    assert response.status_code == 200 and b'data-action="run_now"' not in response.content
    assert complete_pending("EchoAgent") == [task_id]  # due now

    waiting = operations.enqueue("EchoAgent", "echo", {}).id
    client.post(f"/tasks/{waiting}/cancel/")
    assert Task.objects.get(id=waiting).status == TaskStatus.CANCELLED
    assert list(OperatorAction.objects.order_by("id").values_list("action", flat=True)) == [
        "run_now", "cancel",
    ]  # fmt: skip


def test_cancel_a_dead_task_takes_it_out_of_the_dead_letter():
    task_id = dead_task()
    staff(*OPERATOR).post("/dead-letter/act/", {"action": "cancel", "ids": [str(task_id)]})
    assert Task.objects.get(id=task_id).status == TaskStatus.CANCELLED
    history = TaskHistory.objects.filter(task_id=task_id).order_by("id").last()
    assert (history.event, history.from_status, history.actor) == (
        "cancelled",
        "failed",
        "user:ops",
    )


def test_pause_and_resume_are_audited_and_shown():
    client = staff(*OPERATOR)
    response = client.post("/agents/EchoAgent/pause/", HTTP_HX_REQUEST="true")
    assert response.status_code == 200 and b"Resume</button>" in response.content
    assert PausedAgent.objects.get().paused_by == "user:ops"
    assert client.post("/agents/NoSuchAgent/pause/").status_code == 400
    client.post("/agents/EchoAgent/resume/")
    assert not PausedAgent.objects.exists()
    assert list(OperatorAction.objects.order_by("id").values_list("action", "agent_name")) == [
        ("pause", "EchoAgent"), ("resume", "EchoAgent"),
    ]  # fmt: skip


def test_api_actions_are_audited_too():
    task_id = dead_task()
    operations.revive([task_id], actor="token:orchestrator", source="api")
    action = OperatorAction.objects.get()
    assert (action.actor, action.source, action.task_ids) == (
        "token:orchestrator",
        "api",
        [task_id],
    )


def test_the_dead_letter_tells_a_batchs_tasks_apart_by_their_short_ids():
    # UUIDv7: one batch's ids share their first digits (the time) and count up in
    # their last; the page showed the first 8, one string for every row.
    specs = [operations.TaskSpec("EchoAgent", "echo", {"n": n}) for n in range(3)]
    ids = [task.id for task in operations.enqueue_many(specs)]
    fail_pending("EchoAgent", retryable=False)

    page = staff().get(reverse("dashboard:dead_letter")).content.decode()

    shown = set(re.findall(r"<code>([0-9a-f]{8})</code>", page))
    assert len({short_id(task_id) for task_id in ids}) == 3
    assert {short_id(task_id) for task_id in ids} <= shown


def test_admin_lists_and_actions():
    task_id = dead_task()
    admin = User.objects.create_superuser("root", "", "pw")
    client = Client()
    client.force_login(admin)
    for model in ["task", "deadlettertask", "worker", "taskqueuemetric", "operatoraction",
                  "pausedagent"]:  # fmt: skip
        assert client.get(reverse(f"admin:queue_{model}_changelist")).status_code == 200, model
    others = ["workflows_workflow", "agents_app_agentevent", "agents_app_embeddingjob",
              "agents_app_agentmessage", "agents_app_subscription", "agents_app_publication",
              "agents_app_dailyreport", "api_apitoken"]  # fmt: skip
    for path in [f"admin:{name}_changelist" for name in others]:
        assert client.get(reverse(path)).status_code == 200, path
    assert client.get(reverse("admin:queue_task_change", args=[task_id])).status_code == 200
    search = client.get(reverse("admin:queue_task_changelist"), {"q": str(task_id)})
    assert short_id(task_id) in search.content.decode()
    response = client.post(
        reverse("admin:queue_deadlettertask_changelist"),
        {"action": "revive", "_selected_action": [str(task_id)]},
        follow=True,
    )
    assert "Revived 1 task(s)." in response.content.decode()
    assert OperatorAction.objects.get().source == "admin"


def test_admin_offers_no_revive_action_without_the_permission():
    task_id = dead_task()
    user = User.objects.create_user("viewer", password="pw", is_staff=True)
    user.user_permissions.add(Permission.objects.get(codename="view_deadlettertask"))
    client = Client()
    client.force_login(user)
    page = client.get(reverse("admin:queue_deadlettertask_changelist")).content.decode()
    assert short_id(task_id) in page and 'value="revive"' not in page
    client.post(
        reverse("admin:queue_deadlettertask_changelist"),
        {"action": "revive", "_selected_action": [str(task_id)]},
    )
    assert Task.objects.get(id=task_id).status == TaskStatus.FAILED


def test_an_invalid_filter_matches_nothing_and_acts_on_nothing():
    task_id = dead_task()
    client = staff(*OPERATOR)
    page = client.get("/dead-letter/", {"since": "not a date"}).content.decode()
    assert "data-filter-errors" in page and str(task_id) not in page
    assert "the filter is not valid" in page and "Nothing in the dead letter" not in page
    response = client.post("/dead-letter/act/", {"action": "revive", "scope": "all", "since": "x"})
    assert response.status_code == 400
    assert Task.objects.get(id=task_id).status == TaskStatus.FAILED
    admin = Client()
    admin.force_login(User.objects.create_superuser("root", "", "pw"))
    assert admin.get("/admin/queue/task/", {"priority": "x"}).status_code in (200, 302)


def test_a_deeply_nested_payload_in_the_edit_form_is_refused_not_a_500():
    """Issue 14, finding 12."""
    task_id = dead_task()
    response = staff(*OPERATOR).post(f"/tasks/{task_id}/edit/", {"payload": "[" * 100_000})
    assert response.status_code == 400 and b"nested too deeply" in response.content
    assert Task.objects.get(id=task_id).status == TaskStatus.FAILED


def test_a_bad_request_quotes_its_input_as_plain_text():
    response = staff(*OPERATOR).post("/agents/<b>Nobody/pause/")
    assert response.status_code == 400
    assert response["Content-Type"].startswith("text/plain")


def test_revive_all_matching_changes_the_tasks_a_chunk_per_statement(monkeypatch):
    """A filter may match any number of tasks: each statement takes a chunk of them."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from task_queue.sql import operator

    monkeypatch.setattr(operator, "CHUNK", 3)
    marked = make_failed([{"supplier": "acme", "i": i} for i in range(8)])
    client = staff(*OPERATOR)
    confirmed = confirmation(client.get("/dead-letter/confirm/", {"action": "revive", "q": "acme"}))
    with CaptureQueriesContext(connection) as queries:
        response = client.post(
            "/dead-letter/act/", {"action": "revive", "scope": "all", "q": "acme", **confirmed}
        )
    assert "Revived 8 task(s)." in response.content.decode()
    assert set(Task.objects.filter(status="pending").values_list("id", flat=True)) == set(marked)
    revives = [q for q in queries.captured_queries if "revived AS (" in q["sql"]]
    assert len(revives) == 3  # 3 + 3 + 2
    assert len(OperatorAction.objects.get().task_ids) == 8  # one audit row for the action
