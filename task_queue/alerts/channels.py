"""Where an alert's notification goes: a webhook (JSON, signed when the channel has a
secret), a Slack incoming webhook, or email through Django's email backend."""

from __future__ import annotations

import hashlib
import hmac
import http.client
import json
import time
import urllib.error
import urllib.request
from typing import Any, NamedTuple
from urllib.parse import urlsplit

from django.core.exceptions import ValidationError
from django.core.mail import send_mail
from django.core.validators import validate_email

from task_queue.storable import text_problem

from . import destinations

TIMEOUT_SECONDS = 5.0
MAX_CHANNELS = 10
MAX_URL_LENGTH = 2000
MAX_SECRET_LENGTH = 500
MAX_RECIPIENTS = 20
SIGNATURE_HEADER = "X-AutoMechanica-Signature"
TIMESTAMP_HEADER = "X-AutoMechanica-Timestamp"
DELIVERY_HEADER = "X-AutoMechanica-Delivery"
TYPES = ("webhook", "slack", "email")


class InvalidChannel(ValueError):
    """A channel that cannot be used: ``field`` names it (``channels[1].url``)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


def check_channels(channels: Any) -> list[dict[str, Any]]:
    """The channels as stored, or :class:`InvalidChannel` for the first bad one."""
    if not isinstance(channels, list):
        raise InvalidChannel("channels", "must be a list")
    if len(channels) > MAX_CHANNELS:
        raise InvalidChannel("channels", f"at most {MAX_CHANNELS}")
    return [_check(f"channels[{i}]", channel) for i, channel in enumerate(channels)]


def _check(where: str, channel: Any) -> dict[str, Any]:
    if not isinstance(channel, dict) or channel.get("type") not in TYPES:
        raise InvalidChannel(f"{where}.type", f"must be one of {', '.join(TYPES)}")
    kind = channel["type"]
    allowed = {"webhook": {"type", "url", "secret"}, "slack": {"type", "url"},
               "email": {"type", "to"}}[kind]  # fmt: skip
    if unknown := sorted(set(channel) - allowed):
        raise InvalidChannel(f"{where}.{unknown[0]}", f"not a field of a {kind} channel")
    if kind == "email":
        to = channel.get("to")
        if not isinstance(to, list) or not 1 <= len(to) <= MAX_RECIPIENTS:
            raise InvalidChannel(f"{where}.to", f"must list 1 to {MAX_RECIPIENTS} addresses")
        for j, address in enumerate(to):
            try:
                if not isinstance(address, str):
                    raise ValidationError("not text")
                validate_email(address)
            except ValidationError:
                raise InvalidChannel(f"{where}.to[{j}]", "not an email address") from None
        return {"type": kind, "to": list(to)}
    url = channel.get("url")
    if not isinstance(url, str) or len(url) > MAX_URL_LENGTH:
        raise InvalidChannel(f"{where}.url", f"must be a URL of at most {MAX_URL_LENGTH} chars")
    if any(c.isspace() or not c.isprintable() for c in url):
        raise InvalidChannel(f"{where}.url", "must not hold spaces or control characters")
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises for a port that is not one
    except ValueError:
        raise InvalidChannel(f"{where}.url", "is not a URL") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise InvalidChannel(f"{where}.url", "must be an http(s) URL with a host")
    if parts.username is not None or parts.password is not None:
        # They would be sent, and could be shown in errors: a receiver authenticates
        # by the signature (``secret``) or a token in the path.
        raise InvalidChannel(f"{where}.url", "must not hold a user name or password")
    if why := destinations.literal_refusal(parts.hostname):
        raise InvalidChannel(f"{where}.url", why)
    checked = {"type": kind, "url": url}
    if "secret" in channel:
        secret = channel["secret"]
        if (
            not isinstance(secret, str)
            or not 1 <= len(secret) <= MAX_SECRET_LENGTH
            or text_problem(secret)
        ):
            raise InvalidChannel(
                f"{where}.secret", f"must be text of 1 to {MAX_SECRET_LENGTH} chars"
            )
        checked["secret"] = secret
    return checked


def shown(channel: dict[str, Any]) -> dict[str, Any]:
    """A channel as pages, the API and logs show it: no secret, and a URL without its
    credentials, path or query (a Slack URL's path is its secret)."""
    if channel["type"] == "email":
        return {"type": "email", "to": channel["to"]}
    parts = urlsplit(channel["url"])
    port = f":{parts.port}" if parts.port else ""
    return {"type": channel["type"], "url": f"{parts.scheme}://{parts.hostname}{port}/…",
            "signed": "secret" in channel}  # fmt: skip


class Sent(NamedTuple):
    ok: bool
    http_status: int | None = None
    error: str = ""


def sign(secret: str, timestamp: str, body: bytes) -> str:
    """The signature header's value: HMAC-SHA256 of ``timestamp.body`` with the secret,
    so a receiver can refuse a replayed body (an old timestamp) as well as a forged one."""
    mac = hmac.new(secret.encode(), timestamp.encode() + b"." + body, hashlib.sha256)
    return f"sha256={mac.hexdigest()}"


def send(channel: dict[str, Any], body: dict[str, Any], delivery_id: int) -> Sent:
    """Send ``body`` to ``channel`` once, within ``TIMEOUT_SECONDS``."""
    if channel["type"] == "email":
        about = body.get("workflow") or body["agent"] or "every agent"
        subject = f"[AutoMechanica] {body['state']}: {body['rule']} ({about})"
        text = f"{body['summary']}\n\n{json.dumps(body['links'], indent=2)}\n"
        try:
            send_mail(subject, text, None, channel["to"])
        except Exception as error:  # any backend's failure is this attempt's
            return Sent(False, error=f"{type(error).__name__}: {error}")
        return Sent(True)
    data = json.dumps(body if channel["type"] == "webhook" else _slack(body)).encode()
    headers = {"Content-Type": "application/json", DELIVERY_HEADER: str(delivery_id)}
    if channel.get("secret"):
        timestamp = str(int(time.time()))
        headers[TIMESTAMP_HEADER] = timestamp
        headers[SIGNATURE_HEADER] = sign(channel["secret"], timestamp, data)
    request = urllib.request.Request(channel["url"], data=data, headers=headers, method="POST")
    try:
        with _OPENER.open(request, timeout=TIMEOUT_SECONDS) as answer:
            return Sent(True, answer.status)
    except urllib.error.HTTPError as error:
        return Sent(False, error.code, f"HTTP {error.code}")
    except (OSError, ValueError, http.client.HTTPException) as error:
        refused = getattr(error, "reason", error)  # inside urllib's URLError, or not
        if isinstance(refused, destinations.RefusedAddress):
            return Sent(False, error=f"not sent: {refused}"[:500])
        # Refused, timed out, not HTTP: the error's words only (not the URL's path).
        return Sent(False, error=f"{type(error).__name__}: {error}"[:500])


def _slack(body: dict[str, Any]) -> dict[str, Any]:
    """Slack's incoming-webhook format: ``text`` (notifications) and a block. The
    summary is escaped as Slack asks (a workflow's name, which any writer of the API
    chooses, must not ping a channel or show a link of its own)."""
    links = " · ".join(f"<{url}|{name.replace('_', ' ')}>" for name, url in body["links"].items())
    icon = ":red_circle:" if body["state"] == "firing" else ":large_green_circle:"
    summary = _slack_escaped(body["summary"])
    return {
        "text": f"{icon} {summary}",
        "blocks": [
            {"type": "section", "text": {"type": "mrkdwn", "text": f"{icon} {summary}"}},
            {"type": "context", "elements": [{"type": "mrkdwn", "text": links or " "}]},
        ],
    }


def _slack_escaped(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    """A redirect is an answer, not followed: a receiver cannot send the alert (and
    its signature) on to an address the rule does not name."""

    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


# Connecting only where webhooks may go (destinations.py), and following no redirect;
# through the proxy the environment names (HTTPS_PROXY), if any.
OPENER_HANDLERS = (_NoRedirects(), destinations.HTTPHandler(), destinations.HTTPSHandler())
_OPENER = urllib.request.build_opener(*OPENER_HANDLERS)
