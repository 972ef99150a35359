"""The reference orchestrator: drives workflow definitions through the HTTP API only.

It imports nothing of the queue: what it knows of tasks and workflows it learns from
``/api/v1``, so it runs anywhere that can reach the server.
"""
