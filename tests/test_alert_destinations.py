"""Alert webhooks go to public addresses and to the allowed networks only
(task_queue.alerts.destinations): refused when a rule names another address, and
not connected to when a name resolves to one."""

from __future__ import annotations

import pytest

from task_queue.alerts import channels
from task_queue.alerts.channels import InvalidChannel, check_channels
from tests.support.receiver import webhook_receiver

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
            "https://hooks.example.com/x"]  # fmt: skip
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
        assert refused.error.startswith("not sent: localhost: ")
        assert "127.0.0.1 is not a public address" in refused.error
        assert receiver.requests == []

        settings.ALERT_WEBHOOK_ALLOWED_NETWORKS = ["127.0.0.0/8"]
        assert channels.send(by_name, body, 2) == channels.Sent(True, 200)
        assert len(receiver.requests) == 1


def test_a_bad_allowed_network_is_refused_at_startup_and_allows_nothing(settings):
    from automechanica.checks import alert_webhook_allowed_networks

    assert alert_webhook_allowed_networks() == []
    settings.ALERT_WEBHOOK_ALLOWED_NETWORKS = ["10.0.0.0/8", "10.0.0.0/33"]
    (error,) = alert_webhook_allowed_networks()
    assert error.id == "queue.E003" and "'10.0.0.0/33' is not a network" in error.msg
    with pytest.raises(InvalidChannel):
        check_channels([{"type": "webhook", "url": "http://[fd00::1]/"}])
    assert check_channels([{"type": "webhook", "url": "http://10.9.9.9/"}])
