"""Who may read /metrics, decided by the service itself (with or without nginx in front): a client address
in METRICS_ALLOW_IPS or the METRICS_TOKEN bearer; and the delivery process's own /metrics on
WORKER_METRICS_PORT, under the same rule."""

from __future__ import annotations

import pytest
import requests

from tests.conftest import https_client
from tests.outgoing.receivers import DeliveryProcess
from tests.servers import free_port, wait_until

TOKEN = "scrape-" + "t" * 40


def scrape(client, address: str, **headers):
    return client.get("/metrics", environ_base={"REMOTE_ADDR": address}, headers=headers)


@pytest.mark.parametrize(
    "address, allowed",
    [
        ("127.0.0.1", True),
        ("::1", True),
        ("::ffff:127.0.0.1", True),  # IPv4-mapped counts as its IPv4 address
        ("203.0.113.7", False),
        ("10.1.2.3", False),
        ("2001:db8::7", False),
    ],
)
def test_by_default_only_loopback_reads_the_metrics(client, address, allowed):
    answer = scrape(client, address)
    assert answer.status_code == (200 if allowed else 404), address
    if allowed:
        assert "http_request_duration_seconds" in answer.get_data(as_text=True)
    else:
        assert answer.get_json()["error"]["code"] == "not_found"


def test_allowed_ranges_and_the_token(make_app):
    client = https_client(make_app(METRICS_ALLOW_IPS="10.0.0.0/8", METRICS_TOKEN=TOKEN))
    assert scrape(client, "10.9.8.7").status_code == 200
    assert scrape(client, "127.0.0.1").status_code == 404  # the list replaces the default
    assert scrape(client, "203.0.113.7", Authorization=f"Bearer {TOKEN}").status_code == 200
    for wrong in (f"Bearer {TOKEN}x", "Bearer ", f"Basic {TOKEN}", TOKEN):
        assert scrape(client, "203.0.113.7", Authorization=wrong).status_code == 404, wrong


def test_a_client_behind_the_trusted_proxy_is_judged_by_its_own_address(client):
    """The proxy (loopback) is allowed; the client it forwards is not: as on a PaaS, where the router is."""
    answer = client.get(
        "/metrics", environ_base={"REMOTE_ADDR": "127.0.0.1"}, headers={"X-Forwarded-For": "198.51.100.20"}
    )
    assert answer.status_code == 404


def test_the_delivery_process_serves_its_own_metrics_under_the_same_rule(base_env, rdb, tmp_path):
    port = free_port()
    worker = DeliveryProcess(
        {**base_env, "WORKER_METRICS_PORT": str(port), "METRICS_TOKEN": TOKEN, "METRICS_ALLOW_IPS": "10.0.0.0/8"},
        tmp_path / "worker.log",
    ).start()
    try:
        url = f"http://127.0.0.1:{port}/metrics"
        wait_until(lambda: requests.get(url, timeout=5).status_code == 404, message="the worker's metrics port")
        answer = requests.get(url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=5)
        assert answer.status_code == 200 and "rt_webhook_feed_backlog" in answer.text  # read from Redis
        assert requests.get(f"http://127.0.0.1:{port}/healthz", timeout=5).status_code == 404  # metrics only
    finally:
        worker.stop()
