"""The queue in the Django admin.

Tasks are read here and changed only through actions (revive, cancel) that go
through ``task_queue.operations``, so each change is fenced like the workers' and
written to the audit log; the dashboard edits payloads the same way. Lists stay
fast on a large table: newest first through ``tasks_created_idx``, filters offered
from the agent registry rather than read with SELECT DISTINCT, and the row count of
an unfiltered list from the running totals (``task_queue.stats``). Schedules have
their own module (``task_queue.schedules.admin``).
"""

from __future__ import annotations

from uuid import UUID

from django import forms
from django.contrib import admin, messages
from django.core.paginator import Paginator
from django.db.models import F, Max, Min, Q, QuerySet
from django.db.models.functions import Greatest
from django.http import HttpRequest
from django.urls import reverse
from django.utils.functional import cached_property
from django.utils.html import format_html

from . import audit, ids, limits, operations, registry, stats
from .models import (
    PRIORITY_MAX,
    PRIORITY_MIN,
    REVIVABLE_STATUSES,
    AgentLimits,
    DeadLetterTask,
    EventRelayCursor,
    OperatorAction,
    OutboxEvent,
    PausedAgent,
    Task,
    TaskHistory,
    TaskQueueMetric,
    Worker,
    payload_text,
)
from .schedules import admin as schedule_admin  # noqa: F401 - registers the schedules' admin


class ReadOnlyAdmin(admin.ModelAdmin):
    """Rows written by the queue itself: viewable, never edited by hand."""

    def has_add_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False


class TotalCountPaginator(Paginator):
    """An unfiltered list of tasks counted from the running totals, not the table."""

    @cached_property
    def count(self) -> int:
        if not self.object_list.query.where:
            return sum(n for _, _, n in stats.task_counts())
        return super().count


class AgentFilter(admin.SimpleListFilter):
    title = "agent"
    parameter_name = "agent"

    def lookups(self, request: HttpRequest, model_admin: admin.ModelAdmin) -> list:
        return [(name, name) for name in registry.names()]

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet:
        return queryset.filter(agent_name=self.value()) if self.value() else queryset


class TaskTypeFilter(admin.SimpleListFilter):
    title = "task type"
    parameter_name = "task_type"

    def lookups(self, request: HttpRequest, model_admin: admin.ModelAdmin) -> list:
        types = {t for agent in registry.all_agents() for t in agent.task_types}
        return [(t, t) for t in sorted(types)]

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet:
        return queryset.filter(task_type=self.value()) if self.value() else queryset


class PriorityFilter(admin.SimpleListFilter):
    title = "priority"
    parameter_name = "priority"

    def lookups(self, request: HttpRequest, model_admin: admin.ModelAdmin) -> list:
        return [(str(p), str(p)) for p in range(PRIORITY_MIN, PRIORITY_MAX + 1)]

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet:
        valid = {str(p) for p in range(PRIORITY_MIN, PRIORITY_MAX + 1)}
        return queryset.filter(priority=int(self.value())) if self.value() in valid else queryset


class TaskHistoryInline(admin.TabularInline):
    model = TaskHistory
    extra = 0
    can_delete = False
    fields = ["occurred_at", "event", "from_status", "to_status", "attempt", "actor", "error"]
    readonly_fields = fields

    def has_add_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False


MAIN_FIELDS = ["id", "agent_name", "task_type", "status", "priority", "workflow", "payload",
               "payload_ref", "result", "result_ref", "error_info"]  # fmt: skip
LEASE_FIELDS = ["attempts", "max_attempts", "available_at", "lease_owner", "lease_token",
                "lease_expires_at", "cancel_requested_at", "progress", "progress_message",
                "progress_at"]  # fmt: skip
TIME_FIELDS = ["idempotency_key", "trace_id", "created_at", "started_at", "finished_at",
               "updated_at"]  # fmt: skip


@admin.register(Task)
class TaskAdmin(ReadOnlyAdmin):
    list_display = ["short_id", "agent_name", "task_type", "status", "priority", "attempts",
                    "created_at", "finished_at", "dashboard_link"]  # fmt: skip
    list_filter = ["status", AgentFilter, TaskTypeFilter, PriorityFilter]
    search_help_text = "A task id, a task type, or text in the payload."
    search_fields = ["task_type"]  # see get_search_results
    ordering = ["-created_at", "-id"]
    paginator = TotalCountPaginator
    show_full_result_count = False
    inlines = [TaskHistoryInline]
    actions = ["revive", "cancel"]
    # Every field is read-only; the lease fields in particular are the workers' alone.
    fieldsets = [
        (None, {"fields": MAIN_FIELDS}),
        ("Attempts and lease", {"fields": LEASE_FIELDS}),
        ("Identity and times", {"fields": TIME_FIELDS}),
    ]

    def get_queryset(self, request: HttpRequest) -> QuerySet:
        # The list shows neither payload nor result (up to 64 KiB each in the row);
        # one task's page reads them when it shows them.
        return super().get_queryset(request).defer("payload", "result")

    @admin.display(description="id")
    def short_id(self, task: Task) -> str:
        return ids.short_id(task.id)

    @admin.display(description="dashboard")
    def dashboard_link(self, task: Task) -> str:
        return format_html('<a href="{}">open</a>', reverse("dashboard:task", args=[task.id]))

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet, search_term: str
    ) -> tuple[QuerySet, bool]:
        term = search_term.strip()
        if not term:
            return queryset, False
        try:
            return queryset.filter(id=UUID(term)), False
        except ValueError:
            pass
        matches = queryset.alias(payload_text=payload_text()).filter(
            Q(task_type__icontains=term) | Q(payload_text__icontains=term)
        )
        return matches, False

    def has_revive_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("queue.revive_task")

    def has_cancel_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("queue.cancel_task")

    @admin.action(description="Revive the selected dead or failed tasks", permissions=["revive"])
    def revive(self, request: HttpRequest, queryset: QuerySet[Task]) -> None:
        ids = list(queryset.filter(status__in=REVIVABLE_STATUSES).values_list("id", flat=True))
        done = operations.revive(ids, actor=audit.user_actor(request.user), source="admin")
        self.message_user(request, f"Revived {len(done)} task(s).", messages.SUCCESS)

    @admin.action(description="Cancel the selected tasks", permissions=["cancel"])
    def cancel(self, request: HttpRequest, queryset: QuerySet[Task]) -> None:
        ids = list(queryset.values_list("id", flat=True))
        outcome = operations.cancel(ids, actor=audit.user_actor(request.user), source="admin")
        self.message_user(request, f"Cancelled {len(outcome)} task(s).", messages.SUCCESS)


@admin.register(DeadLetterTask)
class DeadLetterTaskAdmin(TaskAdmin):
    list_display = ["short_id", "agent_name", "task_type", "status", "error_type", "attempts",
                    "finished_at", "dashboard_link"]  # fmt: skip
    list_filter = ["status", AgentFilter, TaskTypeFilter]
    ordering = ["-finished_at", "-id"]

    def get_queryset(self, request: HttpRequest) -> QuerySet:
        return super().get_queryset(request).filter(status__in=REVIVABLE_STATUSES)

    @admin.display(description="error")
    def error_type(self, task: Task) -> str:
        return (task.error_info or {}).get("type", "")


@admin.register(Worker)
class WorkerAdmin(ReadOnlyAdmin):
    list_display = ["worker_id", "hostname", "pid", "agents", "state", "concurrency",
                    "in_flight", "memory_bytes", "last_heartbeat_at"]  # fmt: skip


@admin.register(TaskQueueMetric)
class TaskQueueMetricAdmin(ReadOnlyAdmin):
    list_display = ["bucket_start", "bucket_seconds", "agent_name", "tasks_created",
                    "tasks_completed", "tasks_failed", "tasks_dead", "tasks_retried",
                    "queue_wait_p50", "run_time_p50", "worker_heartbeat_delay"]  # fmt: skip
    list_filter = [AgentFilter, "bucket_seconds"]
    ordering = ["-bucket_start"]


@admin.register(OperatorAction)
class OperatorActionAdmin(ReadOnlyAdmin):
    list_display = ["occurred_at", "actor", "action", "source", "agent_name", "task_count"]
    list_filter = ["action", "source"]
    search_fields = ["actor"]

    @admin.display(description="tasks")
    def task_count(self, action: OperatorAction) -> int:
        return len(action.task_ids)


@admin.register(PausedAgent)
class PausedAgentAdmin(ReadOnlyAdmin):
    """Paused agents are listed here; pausing and resuming is on the dashboard's overview."""

    list_display = ["agent_name", "paused_by", "paused_at"]


class AgentLimitsForm(forms.ModelForm):
    agent_name = forms.ChoiceField(choices=lambda: [(name, name) for name in registry.names()])

    class Meta:
        model = AgentLimits
        fields = ["agent_name", "concurrency_limit", "rate_count", "rate_period_seconds"]

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        # The agent of an existing row stays (it is the row's key).
        self.fields["agent_name"].disabled = not self.instance._state.adding

    def clean(self) -> dict:
        data = super().clean()
        count, period = data.get("rate_count"), data.get("rate_period_seconds")
        if (count is None) != (period is None):
            raise forms.ValidationError("Give the rate limit's count and period, or neither.")
        if data.get("concurrency_limit") is None and count is None:
            raise forms.ValidationError("Give a limit (delete the row for none).")
        return data


@admin.register(AgentLimits)
class AgentLimitsAdmin(admin.ModelAdmin):
    """Agents' cluster-wide limits. Saving and deleting go through ``task_queue.limits``
    (validated, audit-logged, the agent's workers woken); the model's own permissions
    (``change_agentlimits``...) apply."""

    list_display = [
        "agent_name", "concurrency_limit", "rate_count", "rate_period_seconds", "updated_by",
        "updated_at",
    ]  # fmt: skip
    form = AgentLimitsForm

    def save_model(self, request: HttpRequest, obj: AgentLimits, form, change: bool) -> None:
        rate = obj.rate_count and limits.RateLimit(obj.rate_count, obj.rate_period_seconds)
        limits.set_limits(
            obj.agent_name,
            concurrency_limit=obj.concurrency_limit,
            rate_limit=rate or None,
            actor=audit.user_actor(request.user),
            source="admin",
        )

    def delete_model(self, request: HttpRequest, obj: AgentLimits) -> None:
        limits.set_limits(
            obj.agent_name,
            concurrency_limit=None,
            rate_limit=None,
            actor=audit.user_actor(request.user),
            source="admin",
        )

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[AgentLimits]) -> None:
        for obj in queryset:
            self.delete_model(request, obj)


class SeqRangePaginator(Paginator):
    """The stream's length from its first and last seq (two index probes), not a
    COUNT(*) over a large table: an upper bound, off by the rolled-back inserts."""

    @cached_property
    def count(self) -> int:
        bounds = OutboxEvent.objects.aggregate(first=Min("seq"), last=Max("seq"))
        return 0 if bounds["first"] is None else bounds["last"] - bounds["first"] + 1


@admin.register(OutboxEvent)
class OutboxEventAdmin(ReadOnlyAdmin):
    """The event stream, newest first (``export_events`` reads it in order)."""

    list_display = ["position", "kind", "subject_id", "trace_id", "emitted_at"]
    ordering = ["-seq"]
    paginator = SeqRangePaginator
    show_full_result_count = False


@admin.register(EventRelayCursor)
class EventRelayCursorAdmin(ReadOnlyAdmin):
    """Where each relay_events destination is; deleting the cursor of a destination no
    longer used lets retention prune the events it held back."""

    list_display = ["destination", "position", "behind", "relayed", "updated_at"]

    def get_queryset(self, request: HttpRequest) -> QuerySet[EventRelayCursor]:
        head = OutboxEvent.objects.aggregate(head=Max("position"))["head"] or 0
        return super().get_queryset(request).annotate(behind=Greatest(head - F("position"), 0))

    @admin.display(description="events behind", ordering="behind")
    def behind(self, cursor: EventRelayCursor) -> int:
        return cursor.behind

    def has_delete_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return request.user.has_perm("queue.delete_eventrelaycursor")
