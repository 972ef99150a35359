"""Django settings for AutoMechanica, read from the environment.

``DATABASE_URL`` selects the database; unset, every process uses the embedded
PostgreSQL under ``var/pgdata`` (see ``automechanica.embedded_postgres``).
"""

import os
import sys
from pathlib import Path

import dj_database_url
import psycopg.conninfo

from automechanica.deployment import (
    ONE_YEAR_SECONDS,
    SettingsRefused,
    csrf_trusted_origins,
    env_bool,
    env_int,
    env_seconds,
    is_deployment,
    proxy_ssl_header,
    secret_key,
)
from automechanica.log_config import logging_settings

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(os.environ.get("AUTOMECHANICA_VAR_DIR", BASE_DIR / "var"))

DEBUG = env_bool(os.environ, "DJANGO_DEBUG", False)
# Development or a deployment (automechanica.deployment): a deployment needs its own
# DJANGO_SECRET_KEY and is HTTPS-only unless told otherwise.
DEPLOYMENT = is_deployment(os.environ, DEBUG)
SECRET_KEY = secret_key(os.environ, VAR_DIR, DEPLOYMENT)
ALLOWED_HOSTS = os.environ.get("DJANGO_ALLOWED_HOSTS", "localhost,127.0.0.1,[::1]").split(",")

# HTTPS-only in a deployment, each switch read from the environment (off: "false").
# The proxy in front terminates TLS and sets X-Forwarded-Proto (docs/deployment.md).
SECURE_SSL_REDIRECT = env_bool(os.environ, "DJANGO_SECURE_SSL_REDIRECT", DEPLOYMENT)
SESSION_COOKIE_SECURE = env_bool(os.environ, "DJANGO_SESSION_COOKIE_SECURE", DEPLOYMENT)
CSRF_COOKIE_SECURE = env_bool(os.environ, "DJANGO_CSRF_COOKIE_SECURE", DEPLOYMENT)
SECURE_HSTS_SECONDS = env_int(
    os.environ, "DJANGO_SECURE_HSTS_SECONDS", ONE_YEAR_SECONDS if DEPLOYMENT else 0
)
# Subdomains and the preload list are the domain owner's choice: off unless asked.
SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool(
    os.environ, "DJANGO_SECURE_HSTS_INCLUDE_SUBDOMAINS", False
)
SECURE_HSTS_PRELOAD = env_bool(os.environ, "DJANGO_SECURE_HSTS_PRELOAD", False)
SECURE_PROXY_SSL_HEADER = proxy_ssl_header(os.environ, DEPLOYMENT)
CSRF_TRUSTED_ORIGINS = csrf_trusted_origins(os.environ, ALLOWED_HOSTS, DEPLOYMENT)

# task_queue comes first: Django gives a command name to the first app that defines
# it, and Channels ships a `runworker` of its own.
INSTALLED_APPS = [
    "task_queue",
    "workflows",
    "agents_app",
    "automechanica",
    "automechanica.api",
    "automechanica.dashboard",
    "django_htmx",
    "channels",
    # Serves the Swagger UI of /api/docs from our own static files, not a CDN.
    "ninja",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
]
# daphne's app gives `runserver` ASGI, and so WebSockets, but installs Twisted's reactor
# as it loads: 0.6 s added to every other command (workers, `enqueue`) and process that
# loads the settings. It is installed only for `runserver`, ahead of staticfiles so its
# `runserver` wins over Django's (`up` and production run daphne itself).
if sys.argv[1:2] == ["runserver"]:
    INSTALLED_APPS.insert(INSTALLED_APPS.index("channels"), "daphne")

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    # Last: it runs the API's GET views and the dashboard's pages under a time limit.
    "automechanica.read_timeout.ReadTimeoutMiddleware",
]

ROOT_URLCONF = "automechanica.urls"
ASGI_APPLICATION = "automechanica.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

EMBEDDED_PGDATA = Path(os.environ.get("AUTOMECHANICA_PGDATA", VAR_DIR / "pgdata"))

if os.environ.get("DATABASE_URL"):
    DATABASES = {"default": dj_database_url.parse(os.environ["DATABASE_URL"])}
else:
    DATABASES = {
        "default": {
            "ENGINE": "automechanica.embedded_postgres",
            "NAME": os.environ.get("AUTOMECHANICA_DB_NAME", "automechanica"),
        }
    }

# Whether DATABASE_URL's server sessions are shared with other clients (a pooler in
# transaction mode): "auto" asks the server once per process (task_queue.sql.
# connections); "shared" or "own" says so where the check cannot tell.
DATABASE_SESSIONS = os.environ.get("DATABASE_SESSIONS", "").strip().lower() or "auto"
if DATABASE_SESSIONS not in {"auto", "shared", "own"}:
    raise SettingsRefused(
        f"DATABASE_SESSIONS must be auto, shared or own, not {os.environ['DATABASE_SESSIONS']!r}"
    )
# Where DATABASE_URL reaches a pooler in transaction mode, LISTEN cannot work through
# it: DATABASE_LISTEN_URL, the same database reached directly, is used for LISTEN
# alone (task_queue.listen), so that workers, waiting claims and the dashboard are
# woken as usual. Unset, LISTEN goes where DATABASE_URL does.
DATABASE_LISTEN_URL = os.environ.get("DATABASE_LISTEN_URL", "").strip() or None
if DATABASE_LISTEN_URL:
    try:
        psycopg.conninfo.conninfo_to_dict(DATABASE_LISTEN_URL)
    except psycopg.ProgrammingError as error:
        raise SettingsRefused(f"DATABASE_LISTEN_URL is not a PostgreSQL URL: {error}") from None

# The web server's connections come from a pool (automechanica.web_db_pool), per
# daphne process: kept open from 2 up to WEB_DB_POOL_MAX_SIZE (10; 0: no pool, a
# connection per request), a request waiting at most WEB_DB_POOL_TIMEOUT_SECONDS (30)
# for one when all are in use. Other processes connect as before.
WEB_DB_POOL_MAX_SIZE = env_int(os.environ, "WEB_DB_POOL_MAX_SIZE", 10)
if WEB_DB_POOL_MAX_SIZE < 0:
    raise SettingsRefused(f"WEB_DB_POOL_MAX_SIZE must be 0 or more, not {WEB_DB_POOL_MAX_SIZE}")
WEB_DATABASE_POOL = WEB_DB_POOL_MAX_SIZE and {
    "min_size": min(2, WEB_DB_POOL_MAX_SIZE),
    "max_size": WEB_DB_POOL_MAX_SIZE,
    "timeout": env_seconds(os.environ, "WEB_DB_POOL_TIMEOUT_SECONDS", 30),
}

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
# Pages send users who are not logged in as staff to the admin's login form.
LOGIN_URL = "admin:login"
STATIC_ROOT = VAR_DIR / "static"

CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}

# The task queue. Each value can be overridden per worker on the command line.
QUEUE_LEASE_SECONDS = float(os.environ.get("QUEUE_LEASE_SECONDS", 30))
QUEUE_POLL_SECONDS = float(os.environ.get("QUEUE_POLL_SECONDS", 5))
QUEUE_REAPER_SECONDS = float(os.environ.get("QUEUE_REAPER_SECONDS", 5))
QUEUE_SHUTDOWN_GRACE_SECONDS = float(os.environ.get("QUEUE_SHUTDOWN_GRACE_SECONDS", 10))
# A worker that has not heartbeaten this long is forgotten by the reaper (its leases
# expire on their own, after a lease's length).
QUEUE_STALE_WORKER_SECONDS = float(
    os.environ.get("QUEUE_STALE_WORKER_SECONDS", 3 * QUEUE_LEASE_SECONDS)
)
# A worker's claim and completion, and every enqueue's insert, are prepared statements
# (task_queue.sql.db.fetch_bound, fetch_bound_each). "auto" turns them off in a process
# whose server sessions are shared with other clients (a pooler in transaction mode,
# found by task_queue.sql.connections); on or off (1/0) decides without asking.
QUEUE_PREPARED_STATEMENTS: str | bool = (
    "auto"
    if os.environ.get("QUEUE_PREPARED_STATEMENTS", "").strip().lower() in {"", "auto"}
    else env_bool(os.environ, "QUEUE_PREPARED_STATEMENTS", True)
)
# relay_events --dispatch publishes again, a batch at a time, the commands of tasks due
# and still unclaimed this long (a command a broker lost; task_queue.relay.dispatcher).
QUEUE_DISPATCH_REPUBLISH_SECONDS = float(os.environ.get("QUEUE_DISPATCH_REPUBLISH_SECONDS", 60))
# Metric rollups (task_queue.metrics): a bucket is computed once it ended this long
# ago (outcomes committing late still land in it), and a first run looks this far back.
QUEUE_METRICS_GRACE_SECONDS = float(os.environ.get("QUEUE_METRICS_GRACE_SECONDS", 30))
QUEUE_METRICS_BACKFILL_DAYS = float(os.environ.get("QUEUE_METRICS_BACKFILL_DAYS", 7))
# The maintenance loop evaluates the alert rules at most this often (task_queue.alerts).
QUEUE_ALERTS_EVALUATE_SECONDS = float(os.environ.get("QUEUE_ALERTS_EVALUATE_SECONDS", 10))
# An alert's email waits at most this long for the mail server (Django's default: for
# ever, which would hold one of the alert senders).
EMAIL_TIMEOUT = env_seconds(os.environ, "EMAIL_TIMEOUT", 10)
# Alert notifications link to the dashboard at this address (the one people reach it
# at, such as https://queue.example.com); empty: links are paths.
ALERTS_BASE_URL = os.environ.get("ALERTS_BASE_URL", "")
# Retention (task_queue.maintenance.retention): completed and cancelled tasks and their history
# go this long after they finished; agent events (the agents' memory) after theirs.
QUEUE_RETENTION_DAYS = float(os.environ.get("QUEUE_RETENTION_DAYS", 7))
AGENT_EVENT_RETENTION_DAYS = float(os.environ.get("AGENT_EVENT_RETENTION_DAYS", 90))
# Recurring schedules (task_queue.schedules.firing), fired by the maintenance loop.
# Declared here: synced when a maintenance loop starts and marked as code (paused,
# resumed or run now at run time, changed only here). Each entry: "cron" (read in
# "timezone", default UTC) or "interval_seconds"; "agent_name", "task_type",
# "payload"; optional "priority", "max_attempts", "missed" (run_once | skip), "enabled".
QUEUE_SCHEDULES = {
    # Yesterday's report, asked for once the day is rolled up (a guard the agents app
    # registers holds the midnight slot until then).
    "analytics daily report": {
        "cron": "0 0 * * *",
        "agent_name": "AnalyticsAgent",
        "task_type": "daily_report",
        "payload": {},
        "missed": "run_once",
    },
}
# Alert rules declared here (task_queue.alerts.declared), by name: synced when a
# maintenance loop starts, changed or removed only here. Each entry as the API takes
# one (docs/api.md, alert rules): "kind", "threshold"; optional "agent",
# "window_seconds", "min_count", "repeat_seconds", "channels", "enabled".
QUEUE_ALERT_RULES: dict[str, dict] = {}
# A schedule's slot older than this when a maintenance pass sees it counts as missed
# (a "skip" schedule does not fire it).
QUEUE_SCHEDULE_GRACE_SECONDS = float(os.environ.get("QUEUE_SCHEDULE_GRACE_SECONDS", 60))
# Agent messaging (agents_app.messaging, agents_app.pubsub): a message or publication
# delivery whose lease ran out this many times without an acknowledgement is failed
# (a poison message): delivered no more until an operator revives it.
MESSAGE_MAX_DELIVERIES = int(os.environ.get("MESSAGE_MAX_DELIVERIES", 5))
# Agent memory (agents_app.embeddings): "hashing" (local, the default) or
# "sentence-transformers" (all-MiniLM-L6-v2; the optional "embeddings" extra).
AGENT_MEMORY_EMBEDDER = os.environ.get("AGENT_MEMORY_EMBEDDER", "hashing")
# GET /metrics (Prometheus) answers these networks without a token (comma-separated,
# e.g. "127.0.0.1/32,10.0.0.0/8"); others need an API token or a staff session.
METRICS_ALLOWED_NETWORKS = [
    n.strip() for n in os.environ.get("METRICS_ALLOWED_NETWORKS", "").split(",") if n.strip()
]
# Alert webhooks go to public addresses only, and to these networks (comma-separated
# CIDRs, e.g. "10.20.0.0/16" for a receiver on the internal network;
# task_queue.alerts.destinations says why).
ALERT_WEBHOOK_ALLOWED_NETWORKS = [
    n.strip() for n in os.environ.get("ALERT_WEBHOOK_ALLOWED_NETWORKS", "").split(",") if n.strip()
]
# The largest task or message payload accepted, as JSON (the API answers 413 beyond it).
QUEUE_MAX_PAYLOAD_BYTES = int(os.environ.get("QUEUE_MAX_PAYLOAD_BYTES", 16 * 1024 * 1024))
# Payloads larger than this are stored content-addressed in the "payloads" storage
# (task_queue.blobs); the row keeps the reference.
PAYLOAD_BLOB_THRESHOLD_BYTES = int(os.environ.get("PAYLOAD_BLOB_THRESHOLD_BYTES", 64 * 1024))
# A blob no row references is deleted (task_queue.blobs.collection) once it is older
# than this: never one written in the last hour.
PAYLOAD_BLOB_GRACE_SECONDS = float(os.environ.get("PAYLOAD_BLOB_GRACE_SECONDS", 3600))
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
    # Any Django storage works (an S3 one, say); this one writes each blob atomically.
    "payloads": {
        "BACKEND": "task_queue.blobs.AtomicFileSystemStorage",
        "OPTIONS": {"location": os.environ.get("PAYLOAD_BLOB_DIR", str(VAR_DIR / "blobs"))},
    },
}

# The largest request body the web server takes (a batch of up to 1,000 tasks fits):
# daphne answers 413 to a larger one as it arrives, unread (automechanica.body_limit);
# Django's own limit is the same, for any other server.
API_MAX_REQUEST_BYTES = int(os.environ.get("API_MAX_REQUEST_BYTES", 32 * 1024 * 1024))
DATA_UPLOAD_MAX_MEMORY_SIZE = API_MAX_REQUEST_BYTES

# The longest a worker protocol claim waits for a task (its wait_seconds is cut to it):
# keep it under the read timeout of a proxy in front (nginx: 60 s); 0: claims never wait.
API_CLAIM_MAX_WAIT_SECONDS = env_int(os.environ, "API_CLAIM_MAX_WAIT_SECONDS", 60)
if API_CLAIM_MAX_WAIT_SECONDS < 0:
    raise SettingsRefused(
        f"API_CLAIM_MAX_WAIT_SECONDS must be 0 or more, not {API_CLAIM_MAX_WAIT_SECONDS}"
    )

# The API's GET routes and the dashboard's pages read under this statement timeout
# (automechanica.read_timeout): 503 past it; 0 turns it off.
READ_STATEMENT_TIMEOUT_SECONDS = float(os.environ.get("READ_STATEMENT_TIMEOUT_SECONDS", 5))

# LOG_LEVEL (INFO) and LOG_FORMAT (text, or json: a JSON object per line).
LOGGING = logging_settings(os.environ)

# Modules whose import registers agents (task_queue.registry). Extra modules, such as
# a deployment's own agents or the test suite's, come from the environment.
AGENT_MODULES = [
    "agents_app.agents.echo",
    "agents_app.agents.fitment",
    "agents_app.agents.supplier",
    "agents_app.agents.pricing",
    "agents_app.agents.seo",
    "agents_app.agents.analytics",
    *filter(None, os.environ.get("AUTOMECHANICA_AGENT_MODULES", "").split(",")),
]
