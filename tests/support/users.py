"""Logged-in test clients."""

from __future__ import annotations

from django.contrib.auth.models import Permission, User
from django.test import Client


def grant(user: User, *perms: str) -> None:
    """Give ``user`` these permissions ("app_label.codename")."""
    for perm in perms:
        app_label, codename = perm.split(".")
        user.user_permissions.add(
            Permission.objects.get(content_type__app_label=app_label, codename=codename)
        )


def staff(*perms: str, username: str | None = None) -> Client:
    """A client logged in as a new staff user with ``perms`` ("app_label.codename")."""
    name = username or f"staff{User.objects.count()}"
    user = User.objects.create_user(name, password="pw", is_staff=True)
    grant(user, *perms)
    client = Client()
    client.force_login(user)
    return client
