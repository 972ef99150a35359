"""ASGI entry point, served by daphne: HTTP through Django, WebSockets through Channels."""

import gc
import os
import sys
from importlib import import_module

from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler
from django.core.asgi import get_asgi_application

from automechanica import web_db_pool
from automechanica.deployment import SettingsRefused

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "automechanica.settings")
# Django must be set up before anything imports models; the connection pool is set
# before Django connects.
try:
    web_db_pool.install()
    django_asgi_app = get_asgi_application()
except SettingsRefused as refused:  # the web server refuses in one line, as manage.py does
    sys.exit(f"automechanica.asgi: {refused}")

from channels.auth import AuthMiddlewareStack
from channels.routing import ProtocolTypeRouter, URLRouter
from channels.security.websocket import AllowedHostsOriginValidator
from django.conf import settings
from django.urls import re_path

from automechanica import body_limit
from automechanica.api.long_poll import long_polling
from automechanica.api.protocol_handler import serve_worker_protocol
from automechanica.api.routing import websocket_urlpatterns as api_sockets
from automechanica.dashboard.routing import websocket_urlpatterns as dashboard_sockets

# The URL configuration (the API, the dashboard) now rather than at the first request,
# so that what follows covers it.
import_module(settings.ROOT_URLCONF)
# Everything loaded by now lives as long as the server: kept out of the garbage
# collector's full passes, which would otherwise walk all of it every few requests
# (about 6 ms of each 1,000-task POST /api/v1/tasks).
gc.freeze()

# daphne reads a whole body before it calls the application: refuse one over
# API_MAX_REQUEST_BYTES as it arrives instead.
body_limit.install()

application = ProtocolTypeRouter(
    {
        # The server serves its own static files (the API docs' Swagger UI, the admin's
        # styles) from the apps' static folders: no collectstatic step, no second server.
        # A claim's long poll waits outside Django (automechanica.api.long_poll), and
        # the worker protocol's requests run in one thread each (.protocol_handler).
        "http": long_polling(serve_worker_protocol(ASGIStaticFilesHandler(django_asgi_app))),
        "websocket": URLRouter(
            [
                # API clients: a bearer token, which no browser sends by itself to
                # another site's socket, so any Origin (or none, as programs send).
                *api_sockets,
                # Dashboards: Origin must be one of ALLOWED_HOSTS (no cross-site
                # sockets riding on the session cookie); the consumer then requires a
                # staff session.
                re_path(
                    r"",
                    AllowedHostsOriginValidator(AuthMiddlewareStack(URLRouter(dashboard_sockets))),
                ),
            ]
        ),
    }
)
