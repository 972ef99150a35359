from django.urls import path

from . import alerts, limits, mailboxes, reports, schedules, views

app_name = "dashboard"

urlpatterns = [
    path("", views.overview, name="overview"),
    *(
        path(
            f"agents/<str:agent_name>/{action}/",
            views.pause_or_resume,
            {"action": action},
            name=f"{action}_agent",
        )
        for action in ("pause", "resume")
    ),
    path("agents/<str:agent_name>/limits/", limits.agent_limits, name="agent_limits"),
    path("dead-letter/", views.dead_letter, name="dead_letter"),
    path("dead-letter/results/", views.dead_letter_results, name="dead_letter_results"),
    path("dead-letter/count/", views.dead_letter_count, name="dead_letter_count"),
    path("dead-letter/confirm/", views.dead_letter_confirm, name="dead_letter_confirm"),
    path("dead-letter/act/", views.dead_letter_act, name="dead_letter_act"),
    path("tasks/<uuid:task_id>/", views.task_detail, name="task"),
    path("tasks/<uuid:task_id>/edit/", views.task_edit, name="task_edit"),
    *(
        path(
            f"tasks/<uuid:task_id>/{action.replace('_', '-')}/",
            views.task_action,
            {"action": action},
            name=f"task_{action}",
        )
        for action in ("revive", "cancel", "run_now")
    ),
    path("workers/", views.workers, name="workers"),
    path("workflows/", views.workflows, name="workflows"),
    path("alerts/", alerts.alerts, name="alerts"),
    path("alerts/new/", alerts.alert_new, name="alert_new"),
    path("alerts/<int:rule_id>/edit/", alerts.alert_edit, name="alert_edit"),
    path("alerts/<int:rule_id>/delete/", alerts.alert_delete, name="alert_delete"),
    path(
        "alerts/<int:rule_id>/<str:action>/",
        alerts.act,
        name="alert_action",
    ),
    path("workflows/<uuid:workflow_id>/", views.workflow_detail, name="workflow"),
    path("workflows/<uuid:workflow_id>/resume/", views.resume_workflow, name="resume_workflow"),
    path("audit/", views.audit, name="audit"),
    path("messages/", mailboxes.mailboxes, name="mailboxes"),
    path("messages/<uuid:message_id>/revive/", mailboxes.revive_message, name="revive_message"),
    path(
        "messages/deliveries/<int:delivery_id>/revive/",
        mailboxes.revive_delivery,
        name="revive_delivery",
    ),
    path("schedules/", schedules.schedules_page, name="schedules"),
    path("schedules/new/", schedules.schedule_new, name="schedule_new"),
    path("schedules/<int:schedule_id>/edit/", schedules.schedule_edit, name="schedule_edit"),
    path("schedules/<int:schedule_id>/delete/", schedules.schedule_delete, name="schedule_delete"),
    *(
        path(
            f"schedules/<int:schedule_id>/{action}/",
            schedules.schedule_action,
            {"action": action},
            name=f"schedule_{action}",
        )
        for action in ("pause", "resume", "run")
    ),
    path("reports/daily/", reports.daily_reports, name="daily_reports"),
    path("reports/daily/run/", reports.run_daily_report, name="run_daily_report"),
    path("reports/daily/<str:day>/", reports.daily_report, name="daily_report"),
    *(
        path(
            f"reports/daily/<str:day>/report.{fmt}",
            reports.daily_report_download,
            {"fmt": fmt},
            name=f"daily_report_{fmt}",
        )
        for fmt in ("json", "csv")
    ),
]
