from django.contrib import admin
from django.urls import include, path

from automechanica.api.main import api
from automechanica.metrics_view import metrics_view

urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/", api.urls),
    path("metrics", metrics_view, name="prometheus_metrics"),
    path("", include("automechanica.dashboard.urls")),
]
