"""What the settings read from the environment to tell a deployment from development.

The zero-configuration default (no ``DATABASE_URL``, no ``DJANGO_SECRET_KEY``) is a
developer's machine: the embedded database, a key generated into ``var/``, plain HTTP
on 127.0.0.1. Giving a database or a key with ``DJANGO_DEBUG`` off is deploying, and
a deployment fails closed: it needs a key of its own and turns HTTPS-only settings on
(each can be turned off in the environment, docs/deployment.md).
``AUTOMECHANICA_DEPLOYMENT`` (on/off) overrides the guess, as the test suite does.
A variable set to the empty string counts as unset (docker-compose.yml passes them so).

This module is read by the settings, so it uses nothing of Django's that needs them.
"""

from __future__ import annotations

import math
import secrets
from collections.abc import Mapping
from pathlib import Path

from django.core.exceptions import ImproperlyConfigured

from automechanica.private_files import create_private_file

# Keys that appear in examples and templates; refused everywhere, development too.
PLACEHOLDER_KEYS = frozenset(
    {
        "change-me",
        "changeme",
        "change_me",
        "change-this",
        "replace-me",
        "please-change-me",
        "secret",
        "secret-key",
        "secretkey",
        "your-secret-key",
        "your_secret_key",
        "insecure",
        "django-insecure",
        "dev",
        "development",
        "test",
    }
)

ONE_YEAR_SECONDS = 365 * 24 * 3600


class SettingsRefused(ImproperlyConfigured):
    """The environment is unsafe or malformed; every command refuses to start, and
    ``manage.py`` prints this one line instead of a traceback."""


def env_bool(env: Mapping[str, str], name: str, default: bool) -> bool:
    """``name`` read as on/off (1, true, yes, on), ``default`` when unset."""
    value = env.get(name)
    if value is None or not value.strip():
        return default
    return value.strip().lower() in {"1", "true", "yes", "on"}


def env_int(env: Mapping[str, str], name: str, default: int) -> int:
    """``name`` read as a whole number, ``default`` when unset."""
    value = env.get(name)
    if value is None or not value.strip():
        return default
    try:
        return int(value)
    except ValueError:
        raise SettingsRefused(f"{name} must be a whole number, not {value!r}") from None


def env_seconds(env: Mapping[str, str], name: str, default: float) -> float:
    """``name`` read as a finite number of seconds above 0, ``default`` when unset."""
    value = env.get(name)
    if value is None or not value.strip():
        return default
    try:
        seconds = float(value)
    except ValueError:
        seconds = math.nan
    if not (0 < seconds < math.inf):
        raise SettingsRefused(f"{name} must be a number of seconds above 0, not {value!r}")
    return seconds


def is_deployment(env: Mapping[str, str], debug: bool) -> bool:
    """A database or a key given with debug off, unless AUTOMECHANICA_DEPLOYMENT says."""
    guessed = not debug and bool(env.get("DATABASE_URL") or env.get("DJANGO_SECRET_KEY"))
    return env_bool(env, "AUTOMECHANICA_DEPLOYMENT", guessed)


def secret_key(env: Mapping[str, str], var_dir: Path, deployment: bool) -> str:
    """``DJANGO_SECRET_KEY``; in development without one, a key kept in ``var/``.

    Raises :class:`SettingsRefused` for a placeholder (anywhere) and for a deployment
    without a key: a generated per-machine key would sign each machine's sessions
    differently and survive nowhere a container is replaced.
    """
    key = env.get("DJANGO_SECRET_KEY")
    if key is not None:
        normalised = key.strip().lower()
        if (
            not normalised
            or normalised in PLACEHOLDER_KEYS
            or normalised.startswith("django-insecure")
        ):
            raise SettingsRefused(
                f"DJANGO_SECRET_KEY is a placeholder ({key!r}): set a long random key, "
                "e.g. python -c 'import secrets; print(secrets.token_urlsafe(50))'"
            )
        return key
    if deployment:
        raise SettingsRefused(
            "DJANGO_SECRET_KEY is unset: a deployment (DATABASE_URL set, DJANGO_DEBUG "
            "off) needs a key of its own, the same on every machine"
        )
    path = var_dir / "secret_key"
    if not path.exists():
        # Processes starting at once (up starts many) agree on the first one written.
        create_private_file(path, secrets.token_urlsafe(50))
    return path.read_text().strip()


def proxy_ssl_header(env: Mapping[str, str], deployment: bool) -> tuple[str, str] | None:
    """The header a TLS-terminating proxy sets (``X-Forwarded-Proto: https``).

    ``DJANGO_SECURE_PROXY_SSL_HEADER`` names it, ``off`` trusts none. Trusting it is
    safe only behind a proxy that sets it on every request (docs/deployment.md).
    """
    value = env.get("DJANGO_SECURE_PROXY_SSL_HEADER", "").strip()
    if not value:
        value = "X-Forwarded-Proto" if deployment else "off"
    if value.lower() in {"off", "false", "no", "0"}:
        return None
    return "HTTP_" + value.upper().replace("-", "_"), "https"


def csrf_trusted_origins(
    env: Mapping[str, str], allowed_hosts: list[str], deployment: bool
) -> list[str]:
    """``DJANGO_CSRF_TRUSTED_ORIGINS`` (comma-separated), else in a deployment the
    HTTPS origin of each allowed host (``.example.com`` becomes ``https://*.example.com``)."""
    if listed := env.get("DJANGO_CSRF_TRUSTED_ORIGINS", "").strip():
        return [o.strip() for o in listed.split(",") if o.strip()]
    if not deployment:
        return []
    origins = []
    for host in (h.strip() for h in allowed_hosts):
        if not host or host == "*":
            continue
        origins.append(f"https://*{host}" if host.startswith(".") else f"https://{host}")
    return origins
