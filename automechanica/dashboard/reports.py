"""The daily report pages: ``/reports/daily/`` (the days) and one day's report, with
its JSON and CSV downloads, and running the AnalyticsAgent on demand."""

from __future__ import annotations

import csv
import io
from datetime import date, timedelta

from django.contrib import messages
from django.contrib.admin.views.decorators import staff_member_required
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_POST

from agents_app.analytics import COUNTS
from agents_app.models import DailyReport
from task_queue import operations
from task_queue.models import Task, TaskStatus
from task_queue.sql import db

from . import charts
from .acting import require

RUN_PERMISSION = "agents_app.run_daily_report"
CSV_COLUMNS = (
    "agent", "created", "completed", "failed", "dead", "retried", "cancelled",
    "success_rate", "failure_rate", "dead_rate", "queue_wait_p50", "queue_wait_p95",
    "run_time_p50", "run_time_p95", "top_error", "anomalies",
)  # fmt: skip


@staff_member_required
@require_GET
def daily_reports(request: HttpRequest) -> HttpResponse:
    today = db.database_clock().date()
    return render(
        request,
        "dashboard/reports.html",
        {
            "reports": DailyReport.objects.all()[:90],
            "today": today,
            "yesterday": today - timedelta(days=1),
            "can_run": request.user.has_perm(RUN_PERMISSION),
        },
    )


@staff_member_required
@require_GET
def daily_report(request: HttpRequest, day: str) -> HttpResponse:
    row = _report(day)
    report = row.report if row else None
    context = {
        "day": day,
        "row": row,
        "report": report,
        "can_run": request.user.has_perm(RUN_PERMISSION),
        # A run asked for and not finished: the page reloads until it is.
        "running": _report_running(day),
    }
    if report:
        context["errors"] = [(a["agent"], e) for a in report["agents"] for e in a["errors"]]
        context["totals"] = [(name, report["totals"][name]) for name in COUNTS]
        hours = report["hours"]
        context["completed_chart"] = charts.bars(
            [(f"{h['hour']:02d}:00", h["completed"]) for h in hours],
            title="completed", css_class="chart-done", span="per hour",
        )  # fmt: skip
        context["failed_chart"] = charts.bars(
            [(f"{h['hour']:02d}:00", h["failed"]) for h in hours],
            title="failed or dead", css_class="chart-failed", span="per hour",
        )  # fmt: skip
    status = 200 if row or _valid_day(day) else 404
    return render(request, "dashboard/report.html", context, status=status)


@staff_member_required
@require_GET
def daily_report_download(request: HttpRequest, day: str, fmt: str) -> HttpResponse:
    row = _report(day)
    if row is None:
        raise Http404("no report for this day")
    filename = f"automechanica-report-{day}.{fmt}"
    if fmt == "json":
        response = JsonResponse(row.report, json_dumps_params={"indent": 2})
    else:
        response = HttpResponse(_csv(row.report), content_type="text/csv; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="{filename}"'
    return response


@staff_member_required
@require_POST
def run_daily_report(request: HttpRequest) -> HttpResponse:
    """Enqueue an AnalyticsAgent task for a day (today's report is partial)."""
    require(request, RUN_PERMISSION, "running the report")
    day = _valid_day(request.POST.get("day", ""))
    if day is None:
        return HttpResponse(
            "day: a date as YYYY-MM-DD", status=400, content_type="text/plain; charset=utf-8"
        )
    task = operations.enqueue("AnalyticsAgent", "daily_report", {"day": day.isoformat()})
    messages.success(request, f"Asked the AnalyticsAgent for this report (task {task.id}).")
    return redirect("dashboard:daily_report", day=day.isoformat())


def _report_running(day: str) -> bool:
    """Whether an AnalyticsAgent task for ``day`` waits or runs: two probes, each
    within a partial index (pending tasks by agent; held tasks), never the table."""
    mine = {"agent_name": "AnalyticsAgent", "payload__day": day}
    pending = Task.objects.filter(status=TaskStatus.PENDING, **mine)
    held = Task.objects.filter(status__in=[TaskStatus.LEASED, TaskStatus.RUNNING], **mine)
    return pending.exists() or held.exists()


def _valid_day(value: str) -> date | None:
    try:
        return date.fromisoformat(value)
    except ValueError:
        return None


def _report(day: str) -> DailyReport | None:
    parsed = _valid_day(day)
    return DailyReport.objects.filter(day=parsed).first() if parsed else None


def _csv(report: dict) -> str:
    """One line per agent: volume, rates, latency, the top error and anomalies."""
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(CSV_COLUMNS)
    for agent in report["agents"]:
        volume, rates, latency = agent["volume"], agent["rates"], agent["latency"]
        top = agent["errors"][0] if agent["errors"] else None
        writer.writerow([
            agent["agent"], *(volume[k] for k in ("created", "completed", "failed", "dead",
                                                  "retried", "cancelled")),
            rates["success"], rates["failure"], rates["dead"],
            latency["queue_wait_p50"], latency["queue_wait_p95"],
            latency["run_time_p50"], latency["run_time_p95"],
            f"{top['error_class']} ({top['count']})" if top else "",
            "; ".join(a["message"] for a in agent["anomalies"]),
        ])  # fmt: skip
    return out.getvalue()
