"""``/api/v1/schedules``: recurring schedules (``task_queue.schedules``) with the same
token scopes as tasks: reading needs ``read``, changing ``write``."""

from __future__ import annotations

from django.http import HttpRequest
from ninja import Router, Status

from task_queue import schedules
from task_queue.models import Schedule

from ..agents import own, require_agent
from ..auth import READ, WRITE
from ..errors import ERROR_RESPONSES, ApiError
from ..schedule_schemas import ScheduleCreate, ScheduleOut, ScheduleRunNowOut, ScheduleUpdate

router = Router(tags=["schedules"])

# Recent runs shown per schedule.
RUNS_SHOWN = 5
# Nullable fields a PATCH may clear (giving the other of cron and interval_seconds).
CLEARABLE = {"cron", "interval_seconds", "max_attempts"}


def _out(schedule: Schedule) -> Schedule:
    schedule.recent_runs = list(schedule.runs.all()[:RUNS_SHOWN])
    return schedule


def _own(request: HttpRequest, schedule_id: int) -> None:
    """A bound token changes and runs only its agents' schedules (others are 404)."""
    if not own(request, Schedule.objects.filter(id=schedule_id), "agent_name").exists():
        raise ApiError.not_found("schedule")


def _declared(error: schedules.DeclaredInCode) -> ApiError:
    return ApiError(
        409,
        "declared_in_settings",
        f"{error}: change it there; here it can only be paused, resumed or run now",
    )


@router.post("/schedules", auth=WRITE, response={201: ScheduleOut, **ERROR_RESPONSES})
def create_schedule(request: HttpRequest, body: ScheduleCreate):
    """A new schedule; its first slot is the next one from now. Give ``cron`` (read in
    ``timezone``) or ``interval_seconds``, not both."""
    require_agent(request, "agent_name", body.agent_name)
    schedule = schedules.create(body.model_dump(), actor=request.auth.actor, source="api")
    return Status(201, _out(schedule))


@router.get("/schedules", auth=READ, response={200: list[ScheduleOut], **ERROR_RESPONSES})
def list_schedules(request: HttpRequest):
    """Every schedule by name, with its next and last run and its recent runs."""
    return [_out(s) for s in own(request, Schedule.objects.prefetch_related("runs"), "agent_name")]


@router.patch(
    "/schedules/{schedule_id}", auth=WRITE, response={200: ScheduleOut, **ERROR_RESPONSES}
)
def update_schedule(request: HttpRequest, schedule_id: int, body: ScheduleUpdate):
    """Change a schedule: ``{"enabled": false}`` pauses it, ``true`` resumes it at its
    next slot from now. A schedule declared in settings takes only ``enabled`` (409)."""
    changes = body.model_dump(exclude_unset=True)
    nulls = [name for name, value in changes.items() if value is None and name not in CLEARABLE]
    if not changes or nulls:
        raise ApiError(
            422,
            "validation_error",
            "give at least one field to change; only cron, interval_seconds and "
            "max_attempts may be null",
            field_errors=[(name, "must not be null") for name in nulls]
            or [("body", "give at least one field")],
        )
    _own(request, schedule_id)
    if "agent_name" in changes:
        require_agent(request, "agent_name", changes["agent_name"])
    try:
        schedule = schedules.update(schedule_id, changes, actor=request.auth.actor, source="api")
    except schedules.ScheduleNotFound:
        raise ApiError.not_found("schedule") from None
    except schedules.DeclaredInCode as error:
        raise _declared(error) from None
    return _out(schedule)


@router.post(
    "/schedules/{schedule_id}/run",
    auth=WRITE,
    response={201: ScheduleRunNowOut, **ERROR_RESPONSES},
)
def run_schedule(request: HttpRequest, schedule_id: int):
    """Enqueue the schedule's task now (paused or not); its slots go on as before."""
    _own(request, schedule_id)
    try:
        task_id = schedules.run_now(schedule_id, actor=request.auth.actor, source="api")
    except schedules.ScheduleNotFound:
        raise ApiError.not_found("schedule") from None
    return Status(201, {"task_id": task_id})


@router.delete("/schedules/{schedule_id}", auth=WRITE, response={204: None, **ERROR_RESPONSES})
def delete_schedule(request: HttpRequest, schedule_id: int):
    """Remove a schedule (its tasks stay). One declared in settings is removed there."""
    _own(request, schedule_id)
    try:
        schedules.delete(schedule_id, actor=request.auth.actor, source="api")
    except schedules.ScheduleNotFound:
        raise ApiError.not_found("schedule") from None
    except schedules.DeclaredInCode as error:
        raise _declared(error) from None
    return Status(204, None)
