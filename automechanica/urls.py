from django.contrib import admin
from django.urls import include, path

from automechanica.api.main import api

urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/", api.urls),
    path("", include("automechanica.dashboard.urls")),
]
