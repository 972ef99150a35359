from django.apps import AppConfig
from django.db.models.signals import pre_migrate


class TaskQueueConfig(AppConfig):
    name = "task_queue"
    # The app label other programs and permissions use (`queue.revive_task`). The
    # package is not called `queue`: that would shadow Python's standard module.
    label = "queue"
    verbose_name = "Task queue"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from . import registry
        from .maintenance import jobs as maintenance_jobs
        from .signals import require_a_capable_server
        from .tracing import exporting

        # The agents live in higher layers (agents_app, or a deployment's own modules):
        # settings.AGENT_MODULES names them, and importing them registers them here.
        registry.load_agent_modules()
        maintenance_jobs.register()
        # Once per process: OpenTelemetry's hooks if OTEL_* asks for traces, else none.
        exporting.setup()

        pre_migrate.connect(
            require_a_capable_server, sender=self, dispatch_uid="require_a_capable_server"
        )
