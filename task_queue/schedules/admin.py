"""Recurring schedules in the Django admin: added, changed and deleted through
``task_queue.schedules``, so each is checked as the API checks it (the error shown on
its field) and written to the audit log. A schedule declared in settings is only
paused or resumed here (its other fields are read-only)."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest

from task_queue import audit, schedules
from task_queue.models import Schedule, ScheduleRun

# What the form edits (the admin's own form class has its read-only fields too).
EDITED = ["name", *schedules.DEFINITION, "enabled"]


class ScheduleForm(forms.ModelForm):
    class Meta:
        model = Schedule
        fields = EDITED

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean()
        if self.instance.pk and self.instance.source == Schedule.Source.CODE:
            return cleaned
        values = {name: cleaned.get(name) for name in EDITED}
        for blank in ("cron",):  # an empty text box means none
            values[blank] = values[blank] or None
        try:
            self.checked = schedules.validated(values)
        except schedules.InvalidSchedule as error:
            field = error.field if error.field in self.fields else None
            self.add_error(field, error.message)
        return cleaned


class ScheduleRunInline(admin.TabularInline):
    model = ScheduleRun
    fields = ["slot", "task_id", "manual", "fired_at"]
    readonly_fields = fields
    extra = 0
    can_delete = False

    def has_add_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False


@admin.register(Schedule)
class ScheduleAdmin(admin.ModelAdmin):
    form = ScheduleForm
    list_display = ["name", "every", "agent_name", "task_type", "enabled", "next_run_at",
                    "last_run_at", "source"]  # fmt: skip
    list_filter = ["enabled", "source", "agent_name"]
    search_fields = ["name"]
    inlines = [ScheduleRunInline]
    actions = ["pause", "resume", "run_now"]

    def get_readonly_fields(self, request: HttpRequest, obj: Schedule | None = None) -> list[str]:
        shown = ["source", "next_run_at", "last_run_at", "last_task_id", "last_error"]
        if obj is not None and obj.source == Schedule.Source.CODE:
            return ["name", *schedules.DEFINITION, *shown]
        return shown

    def save_model(self, request: HttpRequest, obj: Schedule, form: Any, change: bool) -> None:
        who = {"actor": audit.user_actor(request.user), "source": "admin"}
        if not change:
            created = schedules.create(form.checked, **who)
            obj.pk = created.pk
        elif obj.source == Schedule.Source.CODE:
            schedules.set_enabled(obj.pk, form.cleaned_data["enabled"], **who)
        else:
            schedules.update(obj.pk, form.checked, **who)
        obj.refresh_from_db()

    def has_delete_permission(self, request: HttpRequest, obj: Schedule | None = None) -> bool:
        declared = obj is not None and obj.source == Schedule.Source.CODE
        return not declared and super().has_delete_permission(request, obj)

    def delete_model(self, request: HttpRequest, obj: Schedule) -> None:
        schedules.delete(obj.pk, actor=audit.user_actor(request.user), source="admin")

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet) -> None:
        for schedule in queryset.exclude(source=Schedule.Source.CODE):
            self.delete_model(request, schedule)

    def _each(self, request: HttpRequest, queryset: QuerySet, act: Any, done: str) -> None:
        if not request.user.has_perm("queue.operate_schedule"):
            self.message_user(request, "needs the queue.operate_schedule permission",
                              messages.ERROR)  # fmt: skip
            return
        who = {"actor": audit.user_actor(request.user), "source": "admin"}
        for schedule in queryset:
            act(schedule.pk, **who)
        self.message_user(request, f"{done} {queryset.count()} schedule(s).")

    @admin.action(description="Pause the selected schedules")
    def pause(self, request: HttpRequest, queryset: QuerySet) -> None:
        self._each(request, queryset, lambda pk, **who: schedules.set_enabled(pk, False, **who),
                   "Paused")  # fmt: skip

    @admin.action(description="Resume the selected schedules")
    def resume(self, request: HttpRequest, queryset: QuerySet) -> None:
        self._each(request, queryset, lambda pk, **who: schedules.set_enabled(pk, True, **who),
                   "Resumed")  # fmt: skip

    @admin.action(description="Run the selected schedules now")
    def run_now(self, request: HttpRequest, queryset: QuerySet) -> None:
        self._each(request, queryset, schedules.run_now, "Ran")
