"""``/schedules/``: every recurring schedule with its next run, its last run and its
task's status, its recent runs, and Pause, Resume and Run now (each needs
``queue.operate_schedule`` and is written to the audit log by
``task_queue.schedules``). The table is re-rendered live by the hub (``live.py``)."""

from __future__ import annotations

from typing import Any

from django.contrib.admin.views.decorators import staff_member_required
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseBadRequest
from django.shortcuts import render
from django.template.loader import render_to_string
from django.utils import timezone
from django.views.decorators.http import require_GET, require_POST

from task_queue import schedules
from task_queue.audit import user_actor
from task_queue.models import Schedule, ScheduleRun, Task
from task_queue.operations import InvalidTask

OPERATE = "queue.operate_schedule"
LIVE = "dashboard/_schedules_live.html"
RUNS_SHOWN = 5


def context(*, can_operate: bool) -> dict[str, Any]:
    """Each schedule with its recent runs, and the status of every task they name
    (one query for the runs, one for the tasks)."""
    rows = list(Schedule.objects.all())
    runs: dict[int, list[ScheduleRun]] = {row.id: [] for row in rows}
    for run in ScheduleRun.objects.filter(schedule_id__in=runs).order_by("schedule_id", "-slot"):
        if len(runs[run.schedule_id]) < RUNS_SHOWN:
            runs[run.schedule_id].append(run)
    task_ids = {row.last_task_id for row in rows} | {
        run.task_id for shown in runs.values() for run in shown
    }
    statuses = dict(Task.objects.filter(id__in=task_ids - {None}).values_list("id", "status"))
    lines = [
        {
            "schedule": row,
            "last_status": statuses.get(row.last_task_id),
            "runs": [(run, statuses.get(run.task_id)) for run in runs[row.id]],
        }
        for row in rows
    ]
    return {"lines": lines, "can_operate": can_operate, "now": timezone.now()}


def render_live(*, can_operate: bool) -> str:
    return render_to_string(LIVE, context(can_operate=can_operate))


@staff_member_required
@require_GET
def schedules_page(request: HttpRequest) -> HttpResponse:
    can_operate = request.user.has_perm(OPERATE)
    return render(request, "dashboard/schedules.html", context(can_operate=can_operate))


@staff_member_required
@require_POST
def schedule_action(request: HttpRequest, schedule_id: int, action: str) -> HttpResponse:
    """Pause, resume or run now; answers with the refreshed table."""
    if not request.user.has_perm(OPERATE):
        raise PermissionDenied(f"{action} needs the {OPERATE} permission")
    who = {"actor": user_actor(request.user), "source": "dashboard"}
    try:
        if action == "run":
            schedules.run_now(schedule_id, **who)
        else:
            schedules.set_enabled(schedule_id, action == "resume", **who)
    except schedules.ScheduleNotFound:
        raise Http404("no such schedule") from None
    except InvalidTask as refused:  # its agent is no longer registered, say
        return HttpResponseBadRequest(str(refused), content_type="text/plain; charset=utf-8")
    return HttpResponse(render_live(can_operate=True))
