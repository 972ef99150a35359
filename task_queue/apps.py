from django.apps import AppConfig
from django.core import checks
from django.db.models.signals import pre_migrate


class TaskQueueConfig(AppConfig):
    name = "task_queue"
    # The app label other programs and permissions use (`queue.revive_task`). The
    # package is not called `queue`: that would shadow Python's standard module.
    label = "queue"
    verbose_name = "Task queue"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from .checks import metrics_allowed_networks
        from .signals import require_pgvector

        pre_migrate.connect(require_pgvector, sender=self, dispatch_uid="require_pgvector")
        checks.register(metrics_allowed_networks)
