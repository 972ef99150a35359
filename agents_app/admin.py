from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest

from task_queue.admin import AgentFilter, ReadOnlyAdmin

from .models import (
    AgentEvent,
    AgentMessage,
    DailyReport,
    EmbeddingJob,
    Publication,
    Subscription,
)
from .pubsub import with_backlog


@admin.register(AgentEvent)
class AgentEventAdmin(ReadOnlyAdmin):
    list_display = ["id", "agent_name", "event_type", "task_id", "created_at"]
    list_filter = [AgentFilter, "event_type"]
    search_fields = ["content"]
    ordering = ["-created_at"]


@admin.register(EmbeddingJob)
class EmbeddingJobAdmin(ReadOnlyAdmin):
    list_display = ["id", "agent_event_id", "status", "attempts", "available_at", "created_at"]
    list_filter = ["status"]
    ordering = ["-created_at"]


@admin.register(AgentMessage)
class AgentMessageAdmin(ReadOnlyAdmin):
    """Mailboxes: filter by recipient and status to see an agent's backlog."""

    list_display = ["id", "from_agent", "to_agent", "message_type", "priority", "status",
                    "delivery_count", "created_at", "expires_at"]  # fmt: skip
    list_filter = ["status", "message_type"]
    ordering = ["-created_at"]


@admin.register(DailyReport)
class DailyReportAdmin(ReadOnlyAdmin):
    list_display = ["day", "partial", "generated_at", "task_id"]
    ordering = ["-day"]


@admin.register(Subscription)
class SubscriptionAdmin(ReadOnlyAdmin):
    """Who listens to what, and how far behind each subscriber is (its backlog)."""

    list_display = ["subscriber_agent", "name", "event_pattern", "publisher_agent",
                    "active", "backlog"]  # fmt: skip
    list_filter = ["active"]
    ordering = ["subscriber_agent", "name"]

    def get_queryset(self, request: HttpRequest) -> QuerySet[Subscription]:
        return with_backlog(super().get_queryset(request))

    @admin.display(ordering="backlog", description="not acknowledged")
    def backlog(self, subscription: Subscription) -> int:
        return subscription.backlog


@admin.register(Publication)
class PublicationAdmin(ReadOnlyAdmin):
    list_display = ["id", "publisher_agent", "event_name", "publication_type", "created_at",
                    "expires_at"]  # fmt: skip
    ordering = ["-id"]
    show_full_result_count = False
