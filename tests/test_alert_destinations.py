"""Alert webhooks go to public addresses and to the allowed networks only
(task_queue.alerts.destinations): refused when a rule names another address, and
not connected to when a name resolves to one."""

from __future__ import annotations

import urllib.request

import pytest

from task_queue.alerts import channels, rules
from task_queue.alerts.channels import InvalidChannel, check_channels
from tests.support.receiver import webhook_receiver

pytestmark = pytest.mark.django_db

NOT_PUBLIC = [
    "http://127.0.0.1:8000/hook",
    "http://[::1]/hook",
    "http://[::ffff:127.0.0.1]/hook",
    "https://169.254.169.254/latest/meta-data/",
    "http://10.1.2.3/",
    "http://192.168.0.10/",
    "http://100.64.0.1/",
    "http://0.0.0.0:5432/",
    "http://224.0.0.1/",
    "http://[fe80::1]/",
    # IPv4 in other spellings: the resolver reads each as 127.0.0.1.
    "http://2130706433/",
    "http://0x7f.1/",
    "http://127.1/",
    # IPv6 that carries an internal IPv4 one: NAT64, 6to4, IPv4-compatible.
    "http://[64:ff9b::a00:5]/",
    "http://[2002:7f00:1::]/",
    "http://[::7f00:1]/",
    "http://[fec0::1]/",
]


@pytest.mark.parametrize("url", NOT_PUBLIC)
def test_a_rule_naming_an_address_that_is_not_public_is_refused(settings, url):
    settings.ALERT_WEBHOOK_ALLOWED_NETWORKS = []
    with pytest.raises(InvalidChannel) as refused:
        check_channels([{"type": "slack", "url": "https://hooks.example.com/x"},
                        {"type": "webhook", "url": url}])  # fmt: skip
    assert refused.value.field == "channels[1].url"
    assert "is not a public address (ALERT_WEBHOOK_ALLOWED_NETWORKS" in refused.value.message


def test_an_allowed_network_and_a_public_address_are_taken(settings):
    settings.ALERT_WEBHOOK_ALLOWED_NETWORKS = ["10.0.0.0/8", "fd00::/8"]
    urls = ["http://10.1.2.3/", "http://[fd00::5]:8080/", "https://8.8.8.8/hook",
            "https://hooks.example.com/x", "http://[64:ff9b::808:808]/"]  # fmt: skip
    checked = check_channels([{"type": "webhook", "url": url} for url in urls])
    assert [channel["url"] for channel in checked] == urls


def test_a_name_that_resolves_to_loopback_is_not_connected_to(settings):
    body = {"rule": "r", "state": "test"}
    with webhook_receiver() as receiver:
        by_name = {"type": "webhook", "url": receiver.url.replace("127.0.0.1", "localhost")}
        settings.ALERT_WEBHOOK_ALLOWED_NETWORKS = []
        check_channels([by_name])  # a name: checked once resolved, as it is sent

        refused = channels.send(by_name, body, 1)
        assert not refused.ok and refused.http_status is None
        assert refused.error.startswith(
            "not sent: localhost resolves to an address webhooks may not go to"
        )
        assert "127.0.0.1" not in refused.error  # a rule's writer learns no internal address
        assert receiver.requests == []

        settings.ALERT_WEBHOOK_ALLOWED_NETWORKS = ["127.0.0.0/8"]
        assert channels.send(by_name, body, 2) == channels.Sent(True, 200)
        assert len(receiver.requests) == 1


def test_a_bad_allowed_network_is_refused_at_startup_and_allows_nothing(settings):
    from automechanica.checks import alert_webhook_allowed_networks

    assert alert_webhook_allowed_networks() == []
    settings.ALERT_WEBHOOK_ALLOWED_NETWORKS = ["10.0.0.0/33"]
    (error,) = alert_webhook_allowed_networks()
    assert error.id == "queue.E003" and "'10.0.0.0/33' is not a network" in error.msg
    with pytest.raises(InvalidChannel):
        check_channels([{"type": "webhook", "url": "http://10.0.0.1/"}])


def test_through_a_proxy_the_target_is_checked_too(settings, monkeypatch):
    # The proxy (here the receiver, on an allowed address) would fetch any target: a
    # target that is not public is refused before the proxy is asked.
    settings.ALERT_WEBHOOK_ALLOWED_NETWORKS = ["127.0.0.1/32"]
    with webhook_receiver() as proxy:
        through_proxy = urllib.request.build_opener(
            urllib.request.ProxyHandler({"http": proxy.url.removesuffix("/hook")}),
            *channels.OPENER_HANDLERS,
        )
        monkeypatch.setattr(channels, "_OPENER", through_proxy)
        body = {"rule": "r", "state": "test"}
        for url in ("http://10.255.0.1/hook", "http://2130706434/hook"):  # 127.0.0.2
            refused = channels.send({"type": "webhook", "url": url}, body, 1)
            assert refused.error.startswith("not sent: ") and proxy.requests == []
        # A public target goes to the proxy.
        assert channels.send({"type": "webhook", "url": "http://8.8.8.8/hook"}, body, 2).ok
        assert len(proxy.requests) == 1


def test_a_stored_rule_refused_by_a_newer_check_can_still_be_disabled(settings):
    settings.ALERT_WEBHOOK_ALLOWED_NETWORKS = ["10.0.0.0/8"]
    internal = [{"type": "webhook", "url": "http://10.1.2.3/hook"}]
    values = {"name": "r", "kind": "dead_letter", "agent": None, "threshold": 1}
    rule = rules.create({**values, "channels": internal}, actor="test", source="api")
    settings.ALERT_WEBHOOK_ALLOWED_NETWORKS = []  # the deployment no longer allows it

    assert not rules.update(rule.id, {"enabled": False}, actor="test", source="api").enabled
    with pytest.raises(rules.InvalidRule) as refused:  # naming it again is refused
        rules.update(rule.id, {"channels": [*internal, *internal]}, actor="test", source="api")
    assert refused.value.field == "channels[0].url"
