from django.urls import path

from .consumers import LiveConsumer

websocket_urlpatterns = [
    path("ws/overview/", LiveConsumer.as_asgi(), {"page": "overview"}),
    path("ws/workers/", LiveConsumer.as_asgi(), {"page": "workers"}),
    path("ws/dead-letter/", LiveConsumer.as_asgi(), {"page": "dead_letter"}),
    path("ws/workflows/", LiveConsumer.as_asgi(), {"page": "workflows"}),
    path("ws/schedules/", LiveConsumer.as_asgi(), {"page": "schedules"}),
    path("ws/tasks/<uuid:object_id>/", LiveConsumer.as_asgi(), {"page": "task"}),
    path("ws/workflows/<uuid:object_id>/", LiveConsumer.as_asgi(), {"page": "workflow"}),
]
