"""Helpers the tests share; tests/conftest.py holds only fixtures and hooks.

- ``agents``: agents that exist only for the tests (loaded in worker processes too).
- ``api``: the API in-process (:class:`api.Api`), tokens, the smallest task body.
- ``browser``: where Chromium is, and the mark that skips without it.
- ``database``: the test database's URL for other processes; ``count_rows``.
- ``history``: a queue history with chosen timestamps, for rollups and reports.
- ``processes``: ``manage.py`` commands as processes (workers, relays, one-off runs).
- ``queue``: moving tasks through their lifecycle in-process; a task's status.
- ``readers``: processes released together by one NOTIFY.
- ``server``: a real daphne server; one JSON request; a free port.
- ``users``: logged-in staff clients.
- ``waiting``: ``wait_for``, to synchronise on state instead of sleeping.
"""
