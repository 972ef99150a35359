from django.contrib import admin

from task_queue.admin import AgentFilter, ReadOnlyAdmin

from .models import AgentEvent, EmbeddingJob


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
