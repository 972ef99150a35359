from django.apps import AppConfig


class AgentsConfig(AppConfig):
    name = "agents_app"
    label = "agents_app"
    verbose_name = "Agents"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from task_queue import maintenance
        from task_queue.blobs import collection as blob_collection
        from task_queue.maintenance import retention as queue_retention
        from task_queue.schedules import firing as schedule_firing
        from task_queue.sql import outcomes as outcomes_sql

        from . import analytics, messaging, pubsub, retention
        from .sql import blobs as blobs_sql
        from .sql import memory as memory_sql

        # The queue cannot import this app: it runs what the app registers.
        outcomes_sql.add_to_completion("agent memory", memory_sql.EVENTS_OF_COMPLETED_TASKS)
        maintenance.register("message leases", messaging.recover_leases, order=maintenance.LEASES)
        maintenance.register("delivery leases", pubsub.recover_leases, order=maintenance.LEASES)
        # The daily report is a schedule (settings.QUEUE_SCHEDULES) held back until the
        # day it reports on is rolled up.
        schedule_firing.register_guard("AnalyticsAgent", "daily_report", analytics.ready_to_report)
        queue_retention.register("agent events", retention.prune_agent_events)
        queue_retention.register("messages", retention.prune_messages)
        queue_retention.register("publications", retention.prune_publications)
        blob_collection.register("agents", blobs_sql.referenced_by_agents)
