"""``/schedules/``: every recurring schedule with its next run, its last run and its
task's status, its recent runs, and Pause, Resume and Run now (each needs
``queue.operate_schedule``); a form for a new schedule (``queue.add_schedule``), and
for changing (``queue.change_schedule``) or deleting (``queue.delete_schedule``) one
not declared in settings, the model permissions the admin asks for too. Every change
goes through ``task_queue.schedules``, which checks it as for the API and writes it to
the audit log. The table is re-rendered live by the hub (``live.py``), in one variant
per pair of the permissions that change its buttons."""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.contrib.admin.views.decorators import staff_member_required
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseBadRequest
from django.shortcuts import get_object_or_404, redirect, render
from django.template.loader import render_to_string
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_GET, require_http_methods, require_POST
from django_htmx.http import HttpResponseClientRedirect

from task_queue import schedules
from task_queue.models import Schedule, ScheduleRun, Task
from task_queue.operations import InvalidTask

from .acting import require, who
from .form_inputs import saved
from .schedule_form import ScheduleForm

OPERATE = "queue.operate_schedule"
ADD, CHANGE, DELETE = "queue.add_schedule", "queue.change_schedule", "queue.delete_schedule"
LIVE = "dashboard/_schedules_live.html"
EDIT = "dashboard/schedule_edit.html"
RUNS_SHOWN = 5


def rows() -> dict[str, Any]:
    """Each schedule with its recent runs, and the status of every task they name
    (one query for the runs, one for the tasks)."""
    schedule_rows = list(Schedule.objects.all())
    runs: dict[int, list[ScheduleRun]] = {row.id: [] for row in schedule_rows}
    for run in ScheduleRun.objects.filter(schedule_id__in=runs).order_by("schedule_id", "-slot"):
        if len(runs[run.schedule_id]) < RUNS_SHOWN:
            runs[run.schedule_id].append(run)
    task_ids = {row.last_task_id for row in schedule_rows} | {
        run.task_id for shown in runs.values() for run in shown
    }
    statuses = dict(Task.objects.filter(id__in=task_ids - {None}).values_list("id", "status"))
    lines = [
        {
            "schedule": row,
            "last_status": statuses.get(row.last_task_id),
            "runs": [(run, statuses.get(run.task_id)) for run in runs[row.id]],
        }
        for row in schedule_rows
    ]
    return {"lines": lines, "now": timezone.now()}


def variant(*, can_operate: bool, can_change: bool) -> str:
    """The name of the table's variant for these permissions."""
    return f"operate{int(can_operate)}_change{int(can_change)}"


def user_variant(user: Any) -> str:
    return variant(**_perms(user))


def render_variants() -> dict[str, str]:
    """The live table in every variant, from one reading of the schedules."""
    shown = rows()
    return {
        variant(can_operate=operate, can_change=change): render_to_string(
            LIVE, {**shown, "can_operate": operate, "can_change": change}
        )
        for operate in (True, False)
        for change in (True, False)
    }


def _perms(user: Any) -> dict[str, bool]:
    return {"can_operate": user.has_perm(OPERATE), "can_change": user.has_perm(CHANGE)}


def _live(user: Any) -> str:
    return render_to_string(LIVE, {**rows(), **_perms(user)})


def _page(
    request: HttpRequest, form: ScheduleForm | None = None, status: int = 200
) -> HttpResponse:
    context = {**rows(), **_perms(request.user)}
    if request.user.has_perm(ADD):
        context.update(form=form or ScheduleForm(), **_suggestions())
    return render(request, "dashboard/schedules.html", context, status=status)


@staff_member_required
@require_GET
def schedules_page(request: HttpRequest) -> HttpResponse:
    return _page(request)


@staff_member_required
@require_POST
def schedule_action(request: HttpRequest, schedule_id: int, action: str) -> HttpResponse:
    """Pause, resume or run now; answers with the refreshed table."""
    require(request, OPERATE, action)
    try:
        if action == "run":
            schedules.run_now(schedule_id, **who(request))
        else:
            schedules.set_enabled(schedule_id, action == "resume", **who(request))
    except schedules.ScheduleNotFound:
        raise Http404("no such schedule") from None
    except InvalidTask as refused:  # its agent is no longer registered, say
        return HttpResponseBadRequest(str(refused), content_type="text/plain; charset=utf-8")
    return HttpResponse(_live(request.user))


@staff_member_required
@require_POST
def schedule_new(request: HttpRequest) -> HttpResponse:
    """Create a schedule; a refused one comes back (400) with the reason on its field,
    and nothing written."""
    require(request, ADD, "creating a schedule")
    form = ScheduleForm(request.POST)
    created = saved(
        form, lambda: schedules.create(form.definition(), **who(request)), schedules.InvalidSchedule
    )
    if created is None:
        return _page(request, form, status=400)
    messages.success(request, f"Schedule {created.name!r} created.")
    return redirect("dashboard:schedules")


@staff_member_required
@require_http_methods(["GET", "POST"])
def schedule_edit(request: HttpRequest, schedule_id: int) -> HttpResponse:
    """Change a schedule not declared in settings (one declared there answers 409: it
    is changed there). A refused change comes back (400) with the reason on its field."""
    require(request, CHANGE, "changing a schedule")
    schedule = get_object_or_404(Schedule, id=schedule_id)
    context = {"schedule": schedule, "can_delete": request.user.has_perm(DELETE)}
    if schedule.source == Schedule.Source.CODE:
        return render(request, EDIT, {**context, "declared": True}, status=409)
    if request.method == "GET":
        form = ScheduleForm.of(schedule)
        return render(request, EDIT, {**context, "form": form, **_suggestions()})
    form = ScheduleForm(request.POST)
    try:
        changed = saved(
            form,
            lambda: schedules.update(schedule.id, form.definition(), **who(request)),
            schedules.InvalidSchedule,
        )
    except schedules.ScheduleNotFound:
        raise Http404("no such schedule") from None
    except schedules.DeclaredInCode:  # settings took its name meanwhile
        return render(request, EDIT, {**context, "declared": True}, status=409)
    if changed is None:
        return render(request, EDIT, {**context, "form": form, **_suggestions()}, status=400)
    messages.success(request, f"Schedule {changed.name!r} saved.")
    return redirect("dashboard:schedules")


@staff_member_required
@require_POST
def schedule_delete(request: HttpRequest, schedule_id: int) -> HttpResponse:
    """Delete a schedule not declared in settings (its tasks stay), then back to the list."""
    require(request, DELETE, "deleting a schedule")
    try:
        schedules.delete(schedule_id, **who(request))
    except schedules.ScheduleNotFound:
        raise Http404("no such schedule") from None
    except schedules.DeclaredInCode as declared:
        return HttpResponse(str(declared), status=409, content_type="text/plain; charset=utf-8")
    messages.success(request, "Schedule deleted.")
    if request.htmx:
        return HttpResponseClientRedirect(reverse("dashboard:schedules"))
    return redirect("dashboard:schedules")


def _suggestions() -> dict[str, Any]:
    return {"task_types": ScheduleForm.task_types()}
