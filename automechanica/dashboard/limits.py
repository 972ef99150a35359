"""An agent's cluster-wide limits, set from the overview's agent row: a small page
with a form (not inline in the row, which the live updates replace while one types),
behind the ``queue.limit_agent`` permission; each change is audit-logged by
``task_queue.limits``."""

from __future__ import annotations

from django import forms
from django.contrib import messages
from django.contrib.admin.views.decorators import staff_member_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_http_methods

from task_queue import limits, registry
from task_queue.models import (
    MAX_CONCURRENCY_LIMIT,
    MAX_RATE_COUNT,
    MAX_RATE_PERIOD_SECONDS,
    AgentLimits,
)

from .acting import require, who

LIMIT_PERMISSION = "queue.limit_agent"


class AgentLimitsForm(forms.Form):
    concurrency_limit = forms.IntegerField(
        required=False,
        min_value=1,
        max_value=MAX_CONCURRENCY_LIMIT,
        help_text="At most this many tasks leased or running across all workers; empty: none.",
    )
    rate_count = forms.IntegerField(
        required=False,
        min_value=1,
        max_value=MAX_RATE_COUNT,
        label="Rate limit: starts",
        help_text="At most this many task starts in any window of the period; empty: none.",
    )
    rate_period_seconds = forms.IntegerField(
        required=False,
        min_value=1,
        max_value=MAX_RATE_PERIOD_SECONDS,
        label="per seconds",
    )

    def clean(self) -> dict:
        data = super().clean()
        count, period = data.get("rate_count"), data.get("rate_period_seconds")
        if (count is None) != (period is None) and not self.errors:
            missing = "rate_period_seconds" if period is None else "rate_count"
            self.add_error(missing, "Give both the number of starts and the period, or neither.")
        return data


@staff_member_required
@require_http_methods(["GET", "POST"])
def agent_limits(request: HttpRequest, agent_name: str) -> HttpResponse:
    require(request, LIMIT_PERMISSION, "setting limits")
    if agent_name not in registry.names():
        raise Http404(f"no agent {agent_name!r}")
    current = AgentLimits.objects.filter(agent_name=agent_name).first()
    if request.method == "POST":
        form = AgentLimitsForm(request.POST)
        if form.is_valid():
            data = form.cleaned_data
            rate = data["rate_count"] and limits.RateLimit(
                data["rate_count"], data["rate_period_seconds"]
            )
            limits.set_limits(
                agent_name,
                concurrency_limit=data["concurrency_limit"],
                rate_limit=rate or None,
                **who(request),
            )
            messages.success(request, f"Limits of {agent_name} saved")
            return redirect("dashboard:overview")
    else:
        form = AgentLimitsForm(
            initial=current
            and {
                "concurrency_limit": current.concurrency_limit,
                "rate_count": current.rate_count,
                "rate_period_seconds": current.rate_period_seconds,
            }
        )
    return render(
        request,
        "dashboard/agent_limits.html",
        {"agent_name": agent_name, "form": form},
        status=400 if form.errors else 200,
    )
