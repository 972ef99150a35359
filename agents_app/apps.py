from django.apps import AppConfig


class AgentsConfig(AppConfig):
    name = "agents_app"
    label = "agents_app"
    verbose_name = "Agents"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from . import registry

        registry.load_agent_modules()
