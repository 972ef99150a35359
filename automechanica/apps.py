from django.apps import AppConfig
from django.core import checks


class AutomechanicaConfig(AppConfig):
    """The project itself as an app: its commands (``up``, ``embedded_db``) and checks."""

    name = "automechanica"
    verbose_name = "AutoMechanica"

    def ready(self) -> None:
        from .checks import (
            alert_webhook_allowed_networks,
            message_max_deliveries,
            metrics_allowed_networks,
        )

        # Tagged: the commands that skip the URL checks run the checks by tag
        # (task_queue.management.checks).
        checks.register(metrics_allowed_networks, "settings")
        checks.register(alert_webhook_allowed_networks, "settings")
        checks.register(message_max_deliveries, "settings")
