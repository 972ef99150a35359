from django.contrib import admin
from django.http import HttpRequest

from task_queue.models import Task

from .models import Workflow
from .progress import progress_of, status_of


class TaskInline(admin.TabularInline):
    model = Task
    extra = 0
    can_delete = False
    show_change_link = True
    fields = ["id", "agent_name", "task_type", "status", "attempts", "created_at", "finished_at"]
    readonly_fields = fields
    ordering = ["created_at", "id"]

    def has_add_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False


@admin.register(Workflow)
class WorkflowAdmin(admin.ModelAdmin):
    list_display = ["name", "id", "status", "open", "created_at", "cancelled_at"]
    search_fields = ["name"]
    readonly_fields = ["id", "status", "open", "trace_id", "cancelled_at", "created_at",
                       "updated_at"]  # fmt: skip
    inlines = [TaskInline]

    @admin.display(description="status")
    def status(self, workflow: Workflow) -> str:
        return status_of(workflow, progress_of([workflow.id])[workflow.id])

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # workflows are created by an orchestrator, through the API

    def has_change_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False  # its metadata is the orchestrator's state

    def has_delete_permission(self, request: HttpRequest, obj: object = None) -> bool:
        # Deleting a workflow deletes its tasks, running ones included, past the
        # queue's permissions and the audit log: cancel it through the API instead.
        return False
