"""``/api/v1/schedules``: create, list, change (pause and resume), run now and delete;
what is refused, naming the field; what is written to the audit log."""

from __future__ import annotations

import pytest

from task_queue.models import OperatorAction, Priority, Schedule, Task
from task_queue.schedules import firing as schedule_firing
from tests.support.api import Api, field_names, token

pytestmark = pytest.mark.django_db

BODY = {
    "name": "refresh",
    "cron": "*/5 * * * *",
    "timezone": "Europe/Paris",
    "agent_name": "EchoAgent",
    "task_type": "echo",
    "payload": {"n": 1},
}


def test_a_schedule_is_created_listed_paused_run_and_deleted(api):
    created = api.post("/api/v1/schedules", BODY)
    assert created.status_code == 201, created.json()
    body = created.json()
    schedule_id = body["id"]
    assert body["source"] == "api" and body["enabled"] is True and body["missed"] == "run_once"
    assert body["next_run_at"] is not None and body["priority"] == Priority.MEDIUM
    (listed,) = api.get("/api/v1/schedules").json()
    assert listed["name"] == "refresh" and listed["timezone"] == "Europe/Paris"

    paused = api.patch(f"/api/v1/schedules/{schedule_id}", {"enabled": False})
    assert paused.status_code == 200 and paused.json()["enabled"] is False
    changed = api.patch(f"/api/v1/schedules/{schedule_id}", {"cron": None, "interval_seconds": 30})
    assert changed.status_code == 200, changed.json()
    assert (changed.json()["cron"], changed.json()["interval_seconds"]) == (None, 30)

    run = api.post(f"/api/v1/schedules/{schedule_id}/run")
    assert run.status_code == 201
    task = Task.objects.get(id=run.json()["task_id"])
    assert (task.agent_name, task.payload) == ("EchoAgent", {"n": 1})
    shown = api.get("/api/v1/schedules").json()[0]
    assert shown["last_task_id"] == str(task.id)
    assert shown["recent_runs"][0]["manual"] is True

    assert api.delete(f"/api/v1/schedules/{schedule_id}").status_code == 204
    assert not Schedule.objects.exists()
    assert Task.objects.filter(id=task.id).exists()  # its tasks stay
    actions = list(OperatorAction.objects.order_by("id").values_list("action", "source"))
    assert actions == [
        ("create_schedule", "api"),
        ("pause_schedule", "api"),
        ("update_schedule", "api"),
        ("run_schedule", "api"),
        ("delete_schedule", "api"),
    ]
    assert OperatorAction.objects.get(action="update_schedule").changes == {
        "schedule": "refresh",
        "cron": {"from": "*/5 * * * *", "to": None},
        "interval_seconds": {"from": None, "to": 30},
    }


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"interval_seconds": 60}, "cron"),  # both
        ({"cron": None}, "cron"),  # neither
        ({"cron": "every monday"}, "cron"),
        ({"timezone": "Europe/Atlantis"}, "timezone"),
        ({"cron": None, "interval_seconds": 10**8}, "interval_seconds"),
        ({"agent_name": "NoSuchAgent"}, "agent_name"),
        ({"task_type": "shout"}, "task_type"),
        ({"priority": 42}, "priority"),
        ({"missed": "always"}, "missed"),
        ({"payload": []}, "payload"),
        ({"surprise": 1}, "surprise"),
    ],
)
def test_bad_input_is_refused_naming_the_field(api, change, field):
    body = {k: v for k, v in {**BODY, **change}.items() if v is not None}
    response = api.post("/api/v1/schedules", body)
    assert response.status_code == 422, response.json()
    assert field_names(response) == [field]
    assert not Schedule.objects.exists()


def test_a_taken_name_an_unknown_schedule_and_an_empty_change_are_refused(api):
    assert api.post("/api/v1/schedules", BODY).status_code == 201
    again = api.post("/api/v1/schedules", BODY)
    assert again.status_code == 422 and field_names(again) == ["name"]
    for call in (
        lambda: api.patch("/api/v1/schedules/999", {"enabled": False}),
        lambda: api.post("/api/v1/schedules/999/run"),
        lambda: api.delete("/api/v1/schedules/999"),
    ):
        assert call().status_code == 404
    schedule_id = Schedule.objects.get().id
    empty = api.patch(f"/api/v1/schedules/{schedule_id}", {})
    assert empty.status_code == 422 and field_names(empty) == ["body"]
    null = api.patch(f"/api/v1/schedules/{schedule_id}", {"enabled": None})
    assert null.status_code == 422 and field_names(null) == ["enabled"]


def test_a_schedule_declared_in_settings_is_only_paused_resumed_or_run(api, settings):
    settings.QUEUE_SCHEDULES = {"declared": {"interval_seconds": 60, **BODY, "cron": None}}
    del settings.QUEUE_SCHEDULES["declared"]["cron"]
    del settings.QUEUE_SCHEDULES["declared"]["name"]
    schedule_firing.sync_declared()
    schedule_id = Schedule.objects.get(name="declared").id
    url = f"/api/v1/schedules/{schedule_id}"
    assert api.patch(url, {"enabled": False}).status_code == 200
    refused = api.patch(url, {"interval_seconds": 10})
    assert refused.status_code == 409 and refused.json()["code"] == "declared_in_settings"
    assert api.delete(url).status_code == 409
    assert api.post(f"{url}/run").status_code == 201


def test_reading_needs_a_read_token_and_changing_a_write_token():
    reader = Api(token("read"))
    assert reader.get("/api/v1/schedules").status_code == 200
    assert reader.post("/api/v1/schedules", BODY).status_code == 403
