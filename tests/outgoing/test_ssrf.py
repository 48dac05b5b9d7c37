"""SSRF: outgoing webhooks reach public https URLs only, checked when an endpoint is saved (422) and again on
the resolved address at every attempt. No packet leaves this machine: refused addresses are never
contacted, and public ones are only judged by the check, never saved as an endpoint."""

from __future__ import annotations

import ipaddress
import re

import pytest

from app.auth.users import create_user
from app.outgoing.ssrf import TargetRefused, check_url, numeric_host, refusal
from tests.conftest import https_client
from tests.outgoing.conftest import channel, not_on_cluster
from tests.outgoing.receivers import DeliveryProcess
from tests.utils import DEFAULT_PASSWORD, AuthActions, bearer, random_email

# Where a parametrised session Redis would run this on a cluster too.
pytestmark = not_on_cluster("address checks; the store's part is the endpoint record tested elsewhere")

BASE = "/admin/webhook-endpoints"

FORBIDDEN_HOSTS = [
    "127.0.0.1",
    "127.8.9.10",
    "localhost",  # a name: refused for what it resolves to
    "10.0.0.1",
    "172.16.5.4",
    "192.168.1.1",
    "169.254.169.254",  # cloud metadata
    "0.0.0.0",
    "0",
    "100.64.0.1",  # shared address space (carrier-grade NAT)
    "192.0.2.1",  # documentation
    "198.18.0.1",  # benchmarking
    "224.0.0.1",
    "239.255.255.250",
    "240.0.0.1",
    "255.255.255.255",
    "2130706433",  # 127.0.0.1 as one decimal number
    "0177.0.0.1",  # octal
    "0x7f.0.0.1",  # hexadecimal
    "0x7f000001",
    "017700000001",
    "127.1",  # short form
    "10.1",
    "[::1]",
    "[::]",
    "[fe80::1]",
    "[fc00::1]",
    "[fd12:3456::1]",
    "[ff02::1]",
    "[::ffff:127.0.0.1]",  # IPv4-mapped
    "[::ffff:7f00:1]",
    "[::ffff:10.0.0.1]",
    "[::ffff:169.254.169.254]",
    "[2002:7f00:1::1]",  # 6to4 around 127.0.0.1
    "[64:ff9b::a9fe:a9fe]",  # NAT64 around 169.254.169.254
    "[2001:db8::1]",  # documentation
    # Ranges Python's own tables (3.11) take for global: the rules are written out in ssrf.py.
    "192.0.0.8",  # IETF protocol assignments: only .9 and .10 of 192.0.0.0/24 are global
    "192.0.0.1",
    "[fec0::1]",  # site-local (deprecated, outside 2000::/3)
    "[fec0:12::34]",
    "[3fff::1]",  # the newer IPv6 documentation range
    "[5f00::1]",  # SRv6 segment identifiers
    "[64:ff9b:1::808:808]",  # local-use NAT64: outside 2000::/3
    "[2001::1]",  # Teredo
    "１２７．０．０．１",  # full-width digits and dots: 127.0.0.1 once mapped (UTS #46)
    "ｌｏｃａｌｈｏｓｔ",  # full-width letters: localhost
]


@pytest.fixture
def admin_for(make_app):
    def make(**settings) -> tuple:
        app = make_app(**{"WEBHOOK_OUT_ALLOW_HTTP": "true", **settings})
        email = random_email()
        with app.app_context():
            create_user(email, DEFAULT_PASSWORD, role="admin")
        client = https_client(app)
        return client, bearer(AuthActions(client).login_body(email)["access_token"])

    return make


def test_every_forbidden_address_is_refused_when_saved_and_nothing_is_stored(admin_for, rdb):
    client, admin = admin_for()
    for host in FORBIDDEN_HOSTS:
        for scheme in ("http", "https"):
            response = client.post(BASE, json={"url": f"{scheme}://{host}/hook", "channels": ["o"]}, headers=admin)
            assert response.status_code == 422, (host, response.get_json())
            message = response.get_json()["error"]["message"]
            assert "forbidden address" in message and "WEBHOOK_OUT_ALLOW_PRIVATE=true" in message, host
    assert client.get(BASE, headers=admin).get_json() == {"endpoints": []}


def test_a_refused_name_does_not_say_what_it_resolves_to(admin_for, rdb):
    """What a name resolves to is the operator's internal DNS: the 422 says only that it is not public.
    A literal address may be named back: the caller wrote it."""
    client, admin = admin_for()
    for url in ("https://localhost/hook", "https://LocalHost.:8443/hook", "https://ｌｏｃａｌｈｏｓｔ/"):
        response = client.post(BASE, json={"url": url, "channels": ["o"]}, headers=admin)
        assert response.status_code == 422, url
        message = response.get_json()["error"]["message"]
        assert "resolves to a forbidden address" in message and "WEBHOOK_OUT_ALLOW_PRIVATE=true" in message, url
        for leak in ("127.0.0.1", "::1", "loopback"):
            assert leak not in message, (url, message)
    literal = client.post(BASE, json={"url": "https://127.0.0.2/", "channels": ["o"]}, headers=admin)
    assert "127.0.0.2 is a loopback address" in literal.get_json()["error"]["message"]
    site_local = client.post(BASE, json={"url": "https://[fec0::1]/", "channels": ["o"]}, headers=admin)
    assert "fec0::1 is a site-local address" in site_local.get_json()["error"]["message"]


@pytest.mark.parametrize(
    "address",
    ["192.0.0.8", "192.0.0.0", "192.0.0.255", "fec0::1", "fef0::1", "3fff:fff::1", "5f00::1", "2001:2::1",
     "64:ff9b:1::1:2", "::ffff:192.0.0.8", "2002:c000:8::1", "::8.8.8.8", "100::1", "4000::1"],
)  # fmt: skip
def test_only_globally_routable_unicast_addresses_pass(address):
    """IPv6 within 2000::/3 (never site-local fec0::/10), IPv4 outside 192.0.0.0/24 but for .9 and .10,
    whatever Python's `is_global` says; judged on the literal only, nothing is sent."""
    assert refusal(ipaddress.ip_address(address)) is not None
    with pytest.raises(TargetRefused, match="forbidden address"):
        check_url(f"https://[{address}]/" if ":" in address else f"https://{address}/", True, False)


def test_the_same_addresses_are_accepted_when_private_targets_are_allowed(admin_for, rdb):
    client, admin = admin_for(WEBHOOK_OUT_ALLOW_PRIVATE="true")
    for host in ("127.0.0.1", "localhost", "2130706433", "[::1]", "10.0.0.1", "[::ffff:127.0.0.1]"):
        response = client.post(BASE, json={"url": f"http://{host}:9/hook", "channels": ["o"]}, headers=admin)
        assert response.status_code == 201, (host, response.get_json())


def test_public_addresses_pass_the_check_and_plain_http_only_when_allowed(admin_for, rdb):
    # Public addresses are only judged: no endpoint is ever saved with an address off this machine.
    for url in ("https://1.1.1.1/hook?tenant=7", "https://[2606:4700:4700::1111]:8443/", "http://8.8.8.8/"):
        assert check_url(url, allow_http=True, allow_private=False).host, url
    with pytest.raises(TargetRefused, match=r"https://.*WEBHOOK_OUT_ALLOW_HTTP=true"):
        check_url("http://8.8.8.8/", allow_http=False, allow_private=False)
    # The same rules where an endpoint is saved, with loopback targets allowed for the test.
    client, admin = admin_for(WEBHOOK_OUT_ALLOW_HTTP="false", WEBHOOK_OUT_ALLOW_PRIVATE="true")
    refused = client.post(BASE, json={"url": "http://127.0.0.1:9/", "channels": ["o"]}, headers=admin)
    assert refused.status_code == 422 and "https://" in refused.get_json()["error"]["message"]
    assert "WEBHOOK_OUT_ALLOW_HTTP=true" in refused.get_json()["error"]["message"]
    accepted = client.post(BASE, json={"url": "https://127.0.0.1:9/", "channels": ["o"]}, headers=admin)
    assert accepted.status_code == 201
    strict_client, strict_admin = admin_for(WEBHOOK_OUT_ALLOW_HTTP="false")  # same Redis, private refused
    endpoint = f"{BASE}/{accepted.get_json()['id']}"
    patched = strict_client.patch(endpoint, json={"url": "https://[::1]/"}, headers=strict_admin)
    assert patched.status_code == 422
    assert client.get(endpoint, headers=admin).get_json()["url"] == "https://127.0.0.1:9/"


@pytest.mark.parametrize(
    "spelling, address",
    [("2130706433", "127.0.0.1"), ("0177.0.0.1", "127.0.0.1"), ("0x7f.1", "127.0.0.1"), ("127.1", "127.0.0.1"),
     ("0", "0.0.0.0"), ("::ffff:7f00:1", "::ffff:7f00:1"), ("example.com", None), ("1e100.net", None)],
)  # fmt: skip
def test_numeric_spellings_are_read_as_a_resolver_reads_them(spelling, address):
    found = numeric_host(spelling)
    assert (str(found) if found else None) == address


def test_public_addresses_have_no_refusal():
    for address in ("1.1.1.1", "8.8.8.8", "2606:4700:4700::1111", "::ffff:8.8.8.8", "2002:808:808::1"):
        assert refusal(ipaddress.ip_address(address)) is None, address
    # Global ones inside special-purpose blocks: PCP and TURN anycast, AMT, AS112, NAT64 around a public one.
    for address in ("192.0.0.9", "192.0.0.10", "2001:3::1", "2001:4:112::1", "2620:4f:8000::1", "64:ff9b::808:808"):
        assert refusal(ipaddress.ip_address(address)) is None, address


def test_each_connection_checks_the_resolved_address_again(make_service):
    """An endpoint saved while private targets were allowed (or whose name resolves elsewhere now) is refused
    at the attempt: the delivery process resolves the host and checks the address before connecting."""
    service = make_service(worker_env={"WEBHOOK_OUT_ALLOW_PRIVATE": "false"})
    receiver, api = service.receiver, service.admin
    orders = channel()
    path = f"/rebound/{orders}"
    endpoint = api.create_endpoint(receiver.behave(path, host="localhost"), [orders])
    api.publish(orders)
    refused = api.message_with(endpoint["id"], lambda m: len(m["attempts"]) == 1)
    (attempt,) = refused["attempts"]
    assert attempt["status_code"] is None and "forbidden address" in attempt["error"]
    assert "127.0.0.1" not in attempt["error"] and "loopback" not in attempt["error"]  # a name: not what it resolved to
    operator_log = service.workers[0].log_path.read_text()  # the operator's log says it
    assert re.search(r"localhost resolves to a forbidden address: \S+ is a loopback address", operator_log)
    assert refused["status"] == "pending" and receiver.at(path) == []
    # The same message reaches the same URL, at its scheduled retry, from a delivery process that allows
    # private targets: the empty list above was the check at work, not an unreachable receiver.
    for worker in service.workers:
        worker.stop()  # SIGTERM: a graceful stop
        assert worker.process.returncode == 0
    allowing = DeliveryProcess(service.env, service.workers[0].log_path.with_name("allowing.log")).start()
    service.workers.append(allowing)
    (arrived,) = receiver.wait_for(path, 1)
    assert arrived.headers["webhook-id"] == refused["id"] and arrived.headers["Host"] == f"localhost:{receiver.port}"
    arrived.verify(endpoint["secret"])
    delivered = api.message_with(endpoint["id"], lambda m: m["status"] == "delivered")
    assert [a["status_code"] for a in delivered["attempts"]] == [None, 204]
