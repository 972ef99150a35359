from django.urls import path

from .consumers import LiveConsumer

websocket_urlpatterns = [
    path("ws/overview/", LiveConsumer.as_asgi(), {"page": "overview"}),
    path("ws/workers/", LiveConsumer.as_asgi(), {"page": "workers"}),
    path("ws/dead-letter/", LiveConsumer.as_asgi(), {"page": "dead_letter"}),
    path("ws/tasks/<uuid:task_id>/", LiveConsumer.as_asgi(), {"page": "task"}),
]
