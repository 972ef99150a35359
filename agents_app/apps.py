from django.apps import AppConfig


class AgentsConfig(AppConfig):
    name = "agents_app"
    label = "agents_app"
    verbose_name = "Agents"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from task_queue import maintenance

        from . import analytics

        # Run by the queue's maintenance loop, which cannot import this app.
        maintenance.register("daily report", analytics.daily_report_job)
