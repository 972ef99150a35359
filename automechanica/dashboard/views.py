"""The dashboard's pages and the operator actions they post.

Every page needs a logged-in staff user (``staff_member_required`` sends others to
the login page); every action also needs its own permission and answers 403
without it, whatever the page showed.
"""

from __future__ import annotations

import contextlib
import json
from datetime import datetime
from uuid import UUID

from django.contrib import messages
from django.contrib.admin.views.decorators import staff_member_required
from django.core.paginator import Paginator
from django.db.models import QuerySet
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseBadRequest, QueryDict
from django.shortcuts import get_object_or_404, redirect, render
from django.utils import timezone
from django.utils.dateparse import parse_datetime
from django.views.decorators.http import require_GET, require_POST

from agents_app.memory import similar_events, task_text
from task_queue import blobs, escalation, operations, registry
from task_queue.models import DeadLetterEntry, OperatorAction, Task, TaskStatus, Workflow
from task_queue.sql import db

from . import fragments
from .acting import require, who
from .deadletter import DeadLetterFilter, DeadLetterRows
from .limits import LIMIT_PERMISSION
from .overview import take_snapshot
from .traces import trace_context

PAGE_SIZE = 50
# Which permission each action needs.
SIMILAR_TASKS = 5

PERMISSIONS = {
    "revive": "queue.revive_task",
    "edit": "queue.revive_task",
    "run_now": "queue.revive_task",
    "cancel": "queue.cancel_task",
    "pause": "queue.pause_agent",
    "resume": "queue.pause_agent",
    "resume_workflow": fragments.RESUME_PERMISSION,
}


def _require(request: HttpRequest, action: str) -> None:
    require(request, PERMISSIONS[action], action)


# ---------------------------------------------------------------- overview


@staff_member_required
@require_GET
def overview(request: HttpRequest) -> HttpResponse:
    can_pause = request.user.has_perm(PERMISSIONS["pause"])
    can_limit = request.user.has_perm(LIMIT_PERMISSION)
    context = fragments.overview_context(take_snapshot(), can_pause=can_pause, can_limit=can_limit)
    return render(request, "dashboard/overview.html", context)


@staff_member_required
@require_POST
def pause_or_resume(request: HttpRequest, agent_name: str, action: str) -> HttpResponse:
    """Pause or resume an agent's queue; answers with the refreshed overview fragment."""
    _require(request, action)
    if agent_name not in registry.names():
        return _bad_request(f"unknown agent {agent_name!r}")
    change = operations.pause_agent if action == "pause" else operations.resume_agent
    change(agent_name, **who(request))
    can_limit = request.user.has_perm(LIMIT_PERMISSION)
    return HttpResponse(
        fragments.render_overview(take_snapshot(), can_pause=True, can_limit=can_limit)
    )


# ---------------------------------------------------------------- dead letter


@staff_member_required
@require_GET
def dead_letter(request: HttpRequest) -> HttpResponse:
    """The page; its filter form asks for it again and keeps only the results
    (``hx-select``), so that the address it pushes is this page's."""
    form = DeadLetterFilter(request.GET or None)
    context = _dead_letter_context(request, form, request.GET.get("page"))
    return render(request, "dashboard/dead_letter.html", context)


@staff_member_required
@require_GET
def dead_letter_results(request: HttpRequest) -> HttpResponse:
    """The results alone, as filtered and paged by the query: live.js reloads them
    when tasks left the dead letter beyond what its notification named."""
    form = DeadLetterFilter(request.GET or None)
    context = _dead_letter_context(request, form, request.GET.get("page"))
    return render(request, "dashboard/_dead_letter_results.html", context)


@staff_member_required
@require_GET
def dead_letter_count(request: HttpRequest) -> HttpResponse:
    """How many tasks the query's filter matches: live.js refreshes the count with it
    after rows left or arrived."""
    return HttpResponse(str(DeadLetterFilter(request.GET or None).entries().count()))


def _dead_letter_context(
    request: HttpRequest, form: DeadLetterFilter, page_number: str | int | None
) -> dict:
    page = Paginator(DeadLetterRows(form.entries(), page_size=PAGE_SIZE), PAGE_SIZE).get_page(
        page_number
    )
    query = QueryDict(mutable=True)
    query.update(form.as_record())
    return {
        "form": form,
        "page": page,
        "filter_query": query.urlencode(),
        "filter_values": form.as_record(),
        "can_revive": request.user.has_perm(PERMISSIONS["revive"]),
        "can_cancel": request.user.has_perm(PERMISSIONS["cancel"]),
    }


@staff_member_required
@require_GET
def dead_letter_confirm(request: HttpRequest) -> HttpResponse:
    """The confirmation of an action on every task the filter matches, with the count.

    The confirmation binds: it carries the count and the database's time it was
    counted at, and the action takes only matching tasks that were dead by then, and
    no more of them than were counted (a task dying meanwhile is left alone; one
    revived elsewhere meanwhile is simply not there any more).
    """
    action = request.GET.get("action")
    if action not in ("revive", "cancel"):
        return _bad_request("action must be revive or cancel")
    _require(request, action)
    form = DeadLetterFilter(request.GET)
    confirmed_at = db.database_clock()
    context = {
        "action": action,
        "count": _dead_by(form, confirmed_at).count(),
        "confirmed_at": confirmed_at.isoformat(),
        "filter_values": form.as_record(),
    }
    return render(request, "dashboard/_dead_letter_confirm.html", context)


def _dead_by(form: DeadLetterFilter, confirmed_at: datetime) -> QuerySet[DeadLetterEntry]:
    return form.entries().filter(finished_at__lte=confirmed_at)


@staff_member_required
@require_POST
def dead_letter_act(request: HttpRequest) -> HttpResponse:
    """Revive or cancel the selected tasks (``ids``) or every one the filter matched
    when the operator confirmed (``scope=all`` with ``confirmed_at`` and
    ``confirmed_count``); answers with the refreshed results."""
    action = request.POST.get("action")
    if action not in ("revive", "cancel"):
        return _bad_request("action must be revive or cancel")
    _require(request, action)
    form = DeadLetterFilter(request.POST)
    if not form.is_valid():
        return _bad_request(f"invalid filter: {form.errors.as_text()}")
    matched_filter = None
    if request.POST.get("scope") == "all":
        confirmed_at, confirmed_count = _confirmation(request.POST)
        if confirmed_at is None or confirmed_count is None:
            return _bad_request(
                "confirmed_at, confirmed_count: the confirmation's time and count are required"
            )
        ids = list(_dead_by(form, confirmed_at).values_list("id", flat=True))
        if len(ids) > confirmed_count:  # possible only within a commit's latency
            messages.error(request, "More tasks match than you confirmed: confirm again.")
            return _dead_letter_results(request, form)
        matched_filter = form.as_record() | {"confirmed_at": confirmed_at.isoformat()}
    else:
        try:
            ids = [UUID(value) for value in request.POST.getlist("ids")]
        except ValueError:
            return _bad_request("ids must be task ids")
    common = {**who(request), "matched_filter": matched_filter}
    if action == "revive":
        done = len(operations.revive(ids, **common))
        messages.success(request, f"Revived {done} task(s).")
    else:
        done = len(operations.cancel(ids, **common))
        messages.success(request, f"Cancelled {done} task(s).")
    return _dead_letter_results(request, form)


def _confirmation(data: QueryDict) -> tuple[datetime | None, int | None]:
    """The confirmation's time (timezone-aware) and count, or None for a bad one."""
    try:
        confirmed_at = parse_datetime(data.get("confirmed_at", ""))
        confirmed_count = int(data.get("confirmed_count", ""))
    except ValueError:  # parse_datetime: well formed but impossible
        return None, None
    if confirmed_at is None or timezone.is_naive(confirmed_at) or confirmed_count < 0:
        return None, None
    return confirmed_at, confirmed_count


def _dead_letter_results(request: HttpRequest, form: DeadLetterFilter) -> HttpResponse:
    """The first page of results after an action. Its outcome goes to the layout's
    message area, outside the results, so that a reload of them (live.js) keeps it."""
    context = _dead_letter_context(request, form, page_number=1) | {"acted": True}
    return render(request, "dashboard/_dead_letter_results.html", context)


# ---------------------------------------------------------------- tasks


@staff_member_required
@require_GET
def task_detail(request: HttpRequest, task_id: UUID) -> HttpResponse:
    task = fragments.load_task(task_id)
    if task is None:
        return render(request, "dashboard/not_found.html", {"what": "task"}, status=404)
    context = fragments.task_context(task, request.user)
    context.update(trace_context(task))
    context["similar"] = similar_events(
        task_text(task), agent=task.agent_name, k=SIMILAR_TASKS, exclude_task=task.id
    )
    return render(request, "dashboard/task.html", context)


@staff_member_required
@require_POST
def task_action(request: HttpRequest, task_id: UUID, action: str) -> HttpResponse:
    """Revive, run now or cancel one task; answers with the refreshed task fragment."""
    _require(request, action)
    task = get_object_or_404(Task, id=task_id)
    actor = who(request)
    if action == "revive":
        operations.revive([task.id], **actor)
    elif action == "cancel":
        operations.cancel([task.id], **actor)
    else:
        # If it started meanwhile, the fragment shows what it is now.
        with contextlib.suppress(operations.TaskNotPending):
            operations.run_now(task.id, **actor)
    if not request.htmx:
        return redirect("dashboard:task", task_id=task.id)
    return HttpResponse(fragments.render_task(fragments.load_task(task.id), request.user))


@staff_member_required
def task_edit(request: HttpRequest, task_id: UUID) -> HttpResponse:
    """Edit a dead or failed task's payload and revive it, or a pending task's payload."""
    _require(request, "edit")
    task = get_object_or_404(Task, id=task_id)
    editable = task.status in (TaskStatus.DEAD, TaskStatus.FAILED, TaskStatus.PENDING)
    error, status = None, 200
    try:
        current = blobs.payload_of(task.payload, task.payload_ref)
    except blobs.PayloadBlobError as missing:
        current, error = {}, f"{missing}: write the payload anew"
    text = json.dumps(current, indent=2, ensure_ascii=False)
    if request.method == "POST" and editable:
        text = request.POST.get("payload", "")
        # The form comes back with the reason: 400 for a payload that cannot be
        # saved, 409 when the task changed state under the operator's feet.
        status = 400
        try:
            payload = json.loads(text)
            actor = who(request)
            if task.status == TaskStatus.PENDING:
                operations.update_pending(task.id, payload=payload, **actor)
            elif not operations.revive([task.id], payload=payload, **actor):
                status = 409
                raise ValueError("the task is no longer dead or failed")
        except json.JSONDecodeError as bad:
            error = f"Not valid JSON: {bad.msg} (line {bad.lineno}, column {bad.colno})"
        except RecursionError:
            error = "The payload is nested too deeply."
        except operations.TaskNotPending as bad:
            error, status = getattr(bad, "message", None) or str(bad), 409
        except (operations.InvalidTask, ValueError) as bad:
            error = getattr(bad, "message", None) or str(bad)
        else:
            revived = task.status != TaskStatus.PENDING
            messages.success(request, "Payload saved" + (" and task revived" if revived else ""))
            return redirect("dashboard:task", task_id=task.id)
    return render(
        request,
        "dashboard/task_edit.html",
        {"task": task, "text": text, "error": error, "editable": editable},
        status=status if error else 200,
    )


# ---------------------------------------------------------------- workers, workflows, audit


@staff_member_required
@require_GET
def workers(request: HttpRequest) -> HttpResponse:
    return render(request, "dashboard/workers.html", fragments.workers_context())


@staff_member_required
@require_GET
def workflows(request: HttpRequest) -> HttpResponse:
    context = fragments.workflows_context(request.GET.get("page"))
    return render(request, "dashboard/workflows.html", context)


@staff_member_required
@require_GET
def workflow_detail(request: HttpRequest, workflow_id: UUID) -> HttpResponse:
    workflow = get_object_or_404(Workflow, id=workflow_id)
    context = fragments.workflow_context(workflow)
    context["can_resume"] = request.user.has_perm(PERMISSIONS["resume_workflow"])
    return render(request, "dashboard/workflow.html", context)


@staff_member_required
@require_POST
def resume_workflow(request: HttpRequest, workflow_id: UUID) -> HttpResponse:
    """Resume an escalated workflow; answers with the refreshed workflow fragment."""
    _require(request, "resume_workflow")
    get_object_or_404(Workflow, id=workflow_id)
    if not escalation.resume(workflow_id, **who(request)):
        return HttpResponse(
            "This workflow is not escalated (any more).",
            status=409,
            content_type="text/plain; charset=utf-8",
        )
    variants = fragments.render_workflow_variants(workflow_id, rights=(True,))
    if variants is None:  # deleted meanwhile
        raise Http404("no such workflow")
    return HttpResponse(variants[fragments.workflow_variant(True)])


@staff_member_required
@require_GET
def audit(request: HttpRequest) -> HttpResponse:
    page = Paginator(OperatorAction.objects.all(), PAGE_SIZE).get_page(request.GET.get("page"))
    return render(request, "dashboard/audit.html", {"page": page})


def _bad_request(reason: str) -> HttpResponseBadRequest:
    """A 400 that states its reason as plain text: it may quote what the client sent,
    which must not be read as HTML."""
    return HttpResponseBadRequest(reason, content_type="text/plain; charset=utf-8")
