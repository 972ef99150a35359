"""A deployment fails closed; the zero-configuration default stays plain HTTP.

Each case runs a real ``manage.py`` (or a Python that loads the settings) in an
environment made from nothing but what the case names, as an operator's would be.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import subprocess
import sys

import pytest

from tests.support.processes import REPO

KEY = secrets.token_urlsafe(50)
SERVER = "postgresql://automechanica@db.example.com:5432/automechanica"
# The documented production environment (docs/deployment.md), with nothing tuned.
PRODUCTION = {
    "DATABASE_URL": SERVER,
    "DJANGO_SECRET_KEY": KEY,
    "DJANGO_ALLOWED_HOSTS": "automechanica.example.com",
}


def operator_env(**variables: str) -> dict[str, str]:
    """A shell's environment with only ``variables`` of ours set."""
    env = {name: os.environ[name] for name in ("PATH", "HOME", "LANG") if name in os.environ}
    env["DJANGO_SETTINGS_MODULE"] = "automechanica.settings"
    return {**env, **variables}


def manage(*args: str, **variables: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=REPO,
        env=operator_env(**variables),
        capture_output=True,
        text=True,
        timeout=60,
    )


def loaded_settings(**variables: str) -> dict:
    """The security settings a process started in this environment runs with."""
    code = (
        "import json, django; from django.conf import settings as s; django.setup(); "
        "print(json.dumps({n: getattr(s, n) for n in ("
        "'SECURE_SSL_REDIRECT', 'SESSION_COOKIE_SECURE', 'CSRF_COOKIE_SECURE', "
        "'SECURE_HSTS_SECONDS', 'SECURE_PROXY_SSL_HEADER', 'CSRF_TRUSTED_ORIGINS')}))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        env=operator_env(**variables),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.mark.parametrize(
    "command", [["check"], ["migrate"], ["up"], ["runworker", "EchoAgent"], ["runmaintenance"]]
)
def test_a_deployment_without_a_key_refuses_every_command_in_one_line(command):
    done = manage(*command, DATABASE_URL=SERVER)
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [
        "manage.py: DJANGO_SECRET_KEY is unset: a deployment (DATABASE_URL set, "
        "DJANGO_DEBUG off) needs a key of its own, the same on every machine"
    ]


def test_the_web_server_refuses_in_one_line_too():
    # daphne imports the application before it listens: the refusal comes first.
    done = subprocess.run(
        [sys.executable, "-m", "daphne", "-p", "0", "automechanica.asgi:application"],
        cwd=REPO,
        env=operator_env(DATABASE_URL=SERVER),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [
        "automechanica.asgi: DJANGO_SECRET_KEY is unset: a deployment (DATABASE_URL set, "
        "DJANGO_DEBUG off) needs a key of its own, the same on every machine"
    ]


@pytest.mark.parametrize("placeholder", ["change-me", "CHANGEME", "django-insecure-abc", " "])
@pytest.mark.parametrize("database", [{}, {"DATABASE_URL": SERVER}, {"DJANGO_DEBUG": "1"}])
def test_a_placeholder_key_is_refused_everywhere(placeholder, database):
    done = manage("check", DJANGO_SECRET_KEY=placeholder, **database)
    assert done.returncode == 1
    [line] = done.stderr.strip().splitlines()
    assert line.startswith("manage.py: DJANGO_SECRET_KEY is a placeholder")


def test_a_malformed_number_is_refused_in_one_line():
    done = manage("check", DJANGO_SECURE_HSTS_SECONDS="a year", **PRODUCTION)
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [
        "manage.py: DJANGO_SECURE_HSTS_SECONDS must be a whole number, not 'a year'"
    ]


@pytest.mark.parametrize("value", ["soon", "-1", "0", "nan", "inf"])
def test_a_pool_wait_that_is_not_a_positive_number_is_refused_in_one_line(value):
    done = manage("check", WEB_DB_POOL_TIMEOUT_SECONDS=value)
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [
        f"manage.py: WEB_DB_POOL_TIMEOUT_SECONDS must be a number of seconds above 0, not {value!r}"
    ]


def test_database_sessions_other_than_auto_shared_or_own_is_refused_in_one_line():
    done = manage("check", DATABASE_SESSIONS="pooled")
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [
        "manage.py: DATABASE_SESSIONS must be auto, shared or own, not 'pooled'"
    ]


@pytest.mark.parametrize("value", ["not a url", "postgresql://h/db?nope=1", "host=x bad"])
def test_a_listen_url_that_is_not_a_postgresql_url_is_refused_in_one_line(value):
    done = manage("check", DATABASE_LISTEN_URL=value)
    assert done.returncode == 1
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("manage.py: DATABASE_LISTEN_URL is not a PostgreSQL URL: ")


@pytest.mark.parametrize(
    "environment",
    [
        {"DJANGO_SECRET_KEY": KEY, "DJANGO_ALLOWED_HOSTS": "automechanica.example.com"},
        PRODUCTION,
    ],
    ids=["key-and-hosts-only", "documented-production"],
)
def test_check_deploy_leaves_only_the_domain_owners_choices(environment):
    done = manage("check", "--deploy", **environment)
    assert done.returncode == 0, done.stderr
    warnings = set(re.findall(r"\((\w+\.[WE]\d+)\)", done.stdout + done.stderr))
    # HSTS for subdomains (W005) and preloading (W021) are the domain owner's choice.
    assert warnings == {"security.W005", "security.W021"}


def test_a_deployment_is_https_only_by_default():
    assert loaded_settings(**PRODUCTION) == {
        "SECURE_SSL_REDIRECT": True,
        "SESSION_COOKIE_SECURE": True,
        "CSRF_COOKIE_SECURE": True,
        "SECURE_HSTS_SECONDS": 365 * 24 * 3600,
        "SECURE_PROXY_SSL_HEADER": ["HTTP_X_FORWARDED_PROTO", "https"],
        "CSRF_TRUSTED_ORIGINS": ["https://automechanica.example.com"],
    }


@pytest.mark.parametrize(
    ("variable", "value", "setting", "expected"),
    [
        ("DJANGO_SECURE_SSL_REDIRECT", "false", "SECURE_SSL_REDIRECT", False),
        ("DJANGO_SESSION_COOKIE_SECURE", "off", "SESSION_COOKIE_SECURE", False),
        ("DJANGO_CSRF_COOKIE_SECURE", "0", "CSRF_COOKIE_SECURE", False),
        ("DJANGO_SECURE_HSTS_SECONDS", "0", "SECURE_HSTS_SECONDS", 0),
        ("DJANGO_SECURE_PROXY_SSL_HEADER", "off", "SECURE_PROXY_SSL_HEADER", None),
        (
            "DJANGO_SECURE_PROXY_SSL_HEADER",
            "X-Forwarded-Scheme",
            "SECURE_PROXY_SSL_HEADER",
            ["HTTP_X_FORWARDED_SCHEME", "https"],
        ),
        (
            "DJANGO_CSRF_TRUSTED_ORIGINS",
            "https://ops.example.com, https://*.example.org",
            "CSRF_TRUSTED_ORIGINS",
            ["https://ops.example.com", "https://*.example.org"],
        ),
    ],
)
def test_each_secure_setting_can_be_changed_in_the_environment(variable, value, setting, expected):
    loaded = loaded_settings(**PRODUCTION, **{variable: value})
    assert loaded[setting] == expected
    others = loaded_settings(**PRODUCTION)
    assert {n: v for n, v in loaded.items() if n != setting} == {
        n: v for n, v in others.items() if n != setting
    }


def test_the_zero_configuration_default_is_plain_http(tmp_path):
    # No DATABASE_URL, no key: the embedded database and a generated development key.
    assert loaded_settings(AUTOMECHANICA_VAR_DIR=str(tmp_path)) == {
        "SECURE_SSL_REDIRECT": False,
        "SESSION_COOKIE_SECURE": False,
        "CSRF_COOKIE_SECURE": False,
        "SECURE_HSTS_SECONDS": 0,
        "SECURE_PROXY_SSL_HEADER": None,
        "CSRF_TRUSTED_ORIGINS": [],
    }
    assert (tmp_path / "secret_key").stat().st_mode & 0o777 == 0o600


def test_empty_switches_keep_the_secure_defaults():
    # docker-compose.yml passes every switch through, empty where the operator set none.
    empty = {
        name: ""
        for name in (
            "DJANGO_SECURE_SSL_REDIRECT",
            "DJANGO_SESSION_COOKIE_SECURE",
            "DJANGO_CSRF_COOKIE_SECURE",
            "DJANGO_SECURE_HSTS_SECONDS",
            "DJANGO_SECURE_PROXY_SSL_HEADER",
            "DJANGO_CSRF_TRUSTED_ORIGINS",
        )
    }
    assert loaded_settings(**PRODUCTION, **empty) == loaded_settings(**PRODUCTION)


def test_docker_compose_defaults_no_secret_key():
    compose = (REPO / "docker-compose.yml").read_text()
    substitutions = re.findall(r"\$\{DJANGO_SECRET_KEY([^}]*)\}", compose)
    assert substitutions, "docker-compose.yml passes DJANGO_SECRET_KEY"
    # ${VAR:?message} makes compose refuse to start without it; ${VAR:-x} would default.
    assert all(s.startswith(":?") for s in substitutions), substitutions
