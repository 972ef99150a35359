from django.apps import AppConfig


class DashboardConfig(AppConfig):
    name = "automechanica.dashboard"
    label = "dashboard"
    verbose_name = "Operations dashboard"
