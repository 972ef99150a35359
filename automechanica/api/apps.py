from django.apps import AppConfig


class ApiConfig(AppConfig):
    name = "automechanica.api"
    label = "api"
    verbose_name = "HTTP API"
