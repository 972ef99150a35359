"""The ``/schedules/`` page and the schedules' admin: who sees what, Pause, Resume and
Run now behind ``queue.operate_schedule``, and the audit log."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse

from task_queue import schedule_firing, schedules
from task_queue.models import OperatorAction, Schedule, Task
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
