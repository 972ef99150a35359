"""The ``/schedules/`` page and the schedules' admin: who sees what, Pause, Resume and
Run now behind ``queue.operate_schedule``, and the audit log."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse

from task_queue import schedules
from task_queue.models import OperatorAction, Schedule, Task
from task_queue.schedules import firing as schedule_firing
from tests.support.users import staff

pytestmark = pytest.mark.django_db

OPERATE = "queue.operate_schedule"
ECHO = {"agent_name": "EchoAgent", "task_type": "echo", "payload": {"n": 1}}


def make(name: str = "tick", **values) -> Schedule:
    values = {"interval_seconds": 60, **values}
    return schedules.create({"name": name, **ECHO, **values}, actor="test", source="api")


def test_the_page_shows_next_and_last_run_with_the_tasks_status():
    schedule = make()
    schedule_firing.fire_due(now=schedule.next_run_at)
    schedule.refresh_from_db()
    page = staff().get("/schedules/").content.decode()
    assert 'data-schedule="tick"' in page and "every 60 s" in page
    assert f'href="/tasks/{schedule.last_task_id}/"' in page
    assert "status-pending" in page and page.count("data-run") == 1
    assert 'href="/schedules/"' in page  # in the nav
    assert "data-action" not in page  # no permission, no buttons
    assert Client().get("/schedules/").status_code == 302  # to the login


def test_pause_resume_and_run_now_need_their_permission_and_are_audited():
    schedule = make()
    viewer, operator = staff(), staff(OPERATE)
    for action in ("pause", "resume", "run"):
        assert viewer.post(f"/schedules/{schedule.id}/{action}/").status_code == 403
    assert not OperatorAction.objects.filter(source="dashboard").exists()
    page = operator.get("/schedules/").content.decode()
    assert 'data-action="pause"' in page and 'data-action="run"' in page
    paused = operator.post(f"/schedules/{schedule.id}/pause/").content.decode()
    assert 'data-action="resume"' in paused and 'id="schedules-live"' in paused
    assert Schedule.objects.get(id=schedule.id).enabled is False
    operator.post(f"/schedules/{schedule.id}/resume/")
    ran = operator.post(f"/schedules/{schedule.id}/run/").content.decode()
    task = Task.objects.get()
    assert f'href="/tasks/{task.id}/"' in ran
    actions = OperatorAction.objects.filter(source="dashboard").order_by("id")
    assert [a.action for a in actions] == ["pause_schedule", "resume_schedule", "run_schedule"]
    assert {a.actor for a in actions} == {"user:staff1"}
    assert operator.post("/schedules/999/run/").status_code == 404
    audit = operator.get("/audit/").content.decode()
    assert "Pause schedule" in audit and 'schedule <a href="/schedules/">tick</a>' in audit
    assert "interval_seconds: <code>60</code>" in audit  # the definition it was created with


def test_the_admin_adds_checks_and_operates_schedules():
    admin = User.objects.create_superuser("root", "", "pw")
    client = Client()
    client.force_login(admin)
    add = reverse("admin:queue_schedule_add")
    form = {"name": "nightly", "cron": "0 3 * * *", "timezone": "UTC", "agent_name": "EchoAgent",
            "task_type": "echo", "payload": "{}", "priority": "2", "missed": "run_once",
            "enabled": "on", "runs-TOTAL_FORMS": "0", "runs-INITIAL_FORMS": "0"}  # fmt: skip
    refused = client.post(add, {**form, "timezone": "Nowhere/Land"})
    assert refused.status_code == 200 and "unknown time zone" in refused.content.decode()
    assert not Schedule.objects.exists()
    assert client.post(add, form).status_code == 302
    nightly = Schedule.objects.get(name="nightly")
    assert nightly.source == "admin" and nightly.next_run_at is not None
    assert OperatorAction.objects.get().action == "create_schedule"
    changelist = reverse("admin:queue_schedule_changelist")
    client.post(changelist, {"action": "pause", "_selected_action": [nightly.id]})
    assert Schedule.objects.get(id=nightly.id).enabled is False
    assert client.get(reverse("admin:queue_schedule_change", args=[nightly.id])).status_code == 200


def test_run_now_of_a_schedule_whose_agent_is_gone_is_refused_plainly():
    schedule = make()
    Schedule.objects.filter(id=schedule.id).update(agent_name="GoneAgent")
    response = staff(OPERATE).post(f"/schedules/{schedule.id}/run/")
    assert response.status_code == 400 and "GoneAgent" in response.content.decode()
    assert not Task.objects.exists()


# ---------------------------------------------------------------- creating, changing, deleting

ADD, CHANGE, DELETE = "queue.add_schedule", "queue.change_schedule", "queue.delete_schedule"
FORM = {"name": "nightly", "cron": "0 3 * * *", "timezone": "Europe/Paris",
        "interval_seconds": "", "agent_name": "EchoAgent", "task_type": "echo",
        "payload": '{"n": 2}', "priority": "1", "max_attempts": "", "missed": "skip",
        "enabled": "on"}  # fmt: skip


def test_a_schedule_is_created_from_the_page_and_audited():
    client = staff(ADD)
    page = client.get("/schedules/").content.decode()
    assert 'data-form="new-schedule"' in page and 'name="csrfmiddlewaretoken"' in page
    assert '<option value="EchoAgent">EchoAgent</option>' in page  # the registered agents
    response = client.post("/schedules/new/", FORM)
    assert response.status_code == 302 and response["Location"] == "/schedules/"
    nightly = Schedule.objects.get(name="nightly")
    timing = (nightly.cron, nightly.timezone, nightly.interval_seconds)
    assert timing == ("0 3 * * *", "Europe/Paris", None)
    assert (nightly.payload, nightly.priority, nightly.max_attempts) == ({"n": 2}, 1, None)
    assert nightly.missed == "skip" and nightly.enabled and nightly.next_run_at is not None
    assert nightly.source == "dashboard"
    action = OperatorAction.objects.get()
    who = (action.action, action.source, action.actor)
    assert who == ("create_schedule", "dashboard", "user:staff0")
    listed = client.get("/schedules/").content.decode()
    assert 'data-schedule="nightly"' in listed and "created" in listed  # and the message
    # An interval, a blank time zone (UTC) and payload (an empty object), paused.
    every = {**FORM, "name": "often", "cron": "", "timezone": "", "interval_seconds": "90",
             "payload": "", "enabled": ""}  # fmt: skip
    assert client.post("/schedules/new/", every).status_code == 302
    often = Schedule.objects.get(name="often")
    assert (often.interval_seconds, often.timezone, often.payload) == (90, "UTC", {})
    assert often.enabled is False


@pytest.mark.parametrize(
    ("changes", "field", "says"),
    [
        ({"cron": "every day"}, "cron", "is not a cron expression"),
        ({"timezone": "Nowhere/Land"}, "timezone", "unknown time zone"),
        ({"interval_seconds": "60"}, "cron", "not both"),
        ({"cron": ""}, "cron", "give cron (with timezone) or interval_seconds"),
        ({"interval_seconds": "sixty", "cron": ""}, "interval_seconds", "whole number"),
        ({"payload": '{"n": '}, "payload", "Not valid JSON"),
        ({"payload": '{"n": ' + "9" * 5000 + "}"}, "payload", "Not valid JSON"),
        ({"payload": "[1, 2]"}, "payload", "must be a JSON object"),
        ({"agent_name": "GhostAgent"}, "agent_name", "unknown agent &#x27;GhostAgent&#x27;"),
        ({"task_type": "juggle"}, "task_type", "EchoAgent handles"),
        ({"priority": "42"}, "priority", "must be an integer from 0 to 9"),
        ({"max_attempts": "0"}, "max_attempts", "must be an integer from 1"),
        ({"missed": "sometimes"}, "missed", "must be one of run_once, skip"),
        ({"name": ""}, "name", "must be text of 1 to 100 characters"),
        ({"name": "tick"}, "name", "a schedule named &#x27;tick&#x27; exists"),
    ],
)
def test_a_refused_schedule_comes_back_with_its_fields_error_and_nothing_written(
    changes, field, says
):
    make()  # "tick", for the duplicate name
    before = set(Schedule.objects.values_list("id", flat=True))
    response = staff(ADD).post("/schedules/new/", {**FORM, **changes})
    page = response.content.decode()
    assert response.status_code == 400
    error = page.split(f'data-error="{field}">', 1)[1].split("</span>", 1)[0]
    assert says in error
    assert '<details class="new-form" id="new-schedule" open>' in page
    assert f'value="{FORM["task_type"]}"' in page  # what was typed stays
    assert set(Schedule.objects.values_list("id", flat=True)) == before
    assert not OperatorAction.objects.exclude(actor="test").exists()


def test_a_schedule_is_changed_from_its_edit_page_and_audited():
    schedule = make()
    client = staff(CHANGE)
    assert f'href="/schedules/{schedule.id}/edit/"' in client.get("/schedules/").content.decode()
    form = client.get(f"/schedules/{schedule.id}/edit/").content.decode()
    assert 'value="tick"' in form and 'value="60"' in form and "&quot;n&quot;: 1" in form
    assert 'data-action="delete"' not in form  # no delete permission
    changed = {**FORM, "name": "tock", "cron": "*/5 * * * *", "timezone": "UTC"}
    refused = client.post(f"/schedules/{schedule.id}/edit/", {**changed, "cron": "61 * * * *"})
    assert refused.status_code == 400 and 'data-error="cron"' in refused.content.decode()
    assert Schedule.objects.get(id=schedule.id).name == "tick"
    assert client.post(f"/schedules/{schedule.id}/edit/", changed).status_code == 302
    schedule.refresh_from_db()
    timing = (schedule.name, schedule.cron, schedule.interval_seconds)
    assert timing == ("tock", "*/5 * * * *", None)
    action = OperatorAction.objects.filter(source="dashboard").get()
    assert action.action == "update_schedule" and action.changes["cron"]["to"] == "*/5 * * * *"


def test_a_schedule_declared_in_settings_is_not_edited_or_deleted_here():
    schedule = make()
    Schedule.objects.filter(id=schedule.id).update(source="code")
    client = staff(CHANGE, DELETE, OPERATE)
    page = client.get("/schedules/").content.decode()
    assert 'data-action="pause"' in page and 'data-action="edit"' not in page
    assert client.get(f"/schedules/{schedule.id}/edit/").status_code == 409
    assert client.post(f"/schedules/{schedule.id}/edit/", FORM).status_code == 409
    assert client.post(f"/schedules/{schedule.id}/delete/").status_code == 409
    assert Schedule.objects.get(id=schedule.id).name == "tick"
    assert not OperatorAction.objects.filter(source="dashboard").exists()


def test_a_schedule_is_deleted_and_audited_its_tasks_stay():
    schedule = make()
    run = schedules.run_now(schedule.id, actor="test", source="api")
    client = staff(CHANGE, DELETE)
    edit = client.get(f"/schedules/{schedule.id}/edit/").content.decode()
    assert 'data-action="delete"' in edit and "hx-confirm" in edit
    response = client.post(f"/schedules/{schedule.id}/delete/", HTTP_HX_REQUEST="true")
    assert response["HX-Redirect"] == "/schedules/"
    assert not Schedule.objects.exists() and Task.objects.filter(id=run).exists()
    action = OperatorAction.objects.filter(source="dashboard").get()
    assert action.action == "delete_schedule" and action.changes["schedule"] == "tick"
    assert client.post(f"/schedules/{schedule.id}/delete/").status_code == 404


def test_creating_changing_and_deleting_need_their_permissions():
    schedule = make()
    viewer = staff(OPERATE, username="viewer")  # may pause, not change
    page = viewer.get("/schedules/").content.decode()
    assert 'data-form="new-schedule"' not in page and 'data-action="edit"' not in page
    assert viewer.post("/schedules/new/", {**FORM, "name": "sneaky"}).status_code == 403
    assert viewer.get(f"/schedules/{schedule.id}/edit/").status_code == 403
    assert viewer.post(f"/schedules/{schedule.id}/edit/", FORM).status_code == 403
    assert viewer.post(f"/schedules/{schedule.id}/delete/").status_code == 403
    assert list(Schedule.objects.values_list("name", flat=True)) == ["tick"]
    assert not OperatorAction.objects.exclude(actor="test").exists()
    assert Client().post("/schedules/new/", FORM).status_code == 302  # to the login
    staff(ADD, username="adder")
    csrf = Client(enforce_csrf_checks=True)
    csrf.force_login(User.objects.get(username="adder"))
    assert csrf.post("/schedules/new/", FORM).status_code == 403  # no CSRF token
    assert not Schedule.objects.filter(name="nightly").exists()
