from django.urls import path

from .stream import StreamConsumer

websocket_urlpatterns = [
    path("api/v1/stream", StreamConsumer.as_asgi()),
]
