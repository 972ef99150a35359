from django.contrib import admin

from task_queue.admin import AgentFilter, ReadOnlyAdmin

from .models import AgentEvent, AgentMessage, DailyReport, EmbeddingJob


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
