from django.apps import AppConfig


class ApiConfig(AppConfig):
    name = "automechanica.api"
    label = "api"
    verbose_name = "HTTP API"

    def ready(self) -> None:
        from task_queue import bench

        from .bench_remote import remote_workers

        # queue_bench --remote drains through this API (the queue cannot import it).
        bench.register_remote_workers(remote_workers)
