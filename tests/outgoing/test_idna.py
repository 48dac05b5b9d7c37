"""Internationalised host names in outgoing webhook URLs: processed as the WHATWG URL standard does (UTS #46,
not transitional) and sent in their IDNA (punycode) form, to DNS, in `Host` and in TLS's SNI; a name that
is not valid IDNA is a 422. The send goes to a receiver on loopback, found through a DNS server on loopback
(tests/outgoing/dnsserver.py): the machine's resolver knows no internationalised name of its own."""

from __future__ import annotations

import pytest

from app.auth.users import create_user
from app.outgoing.ssrf import TargetRefused, check_url, parse_url
from tests.conftest import https_client
from tests.outgoing.conftest import channel, not_on_cluster
from tests.outgoing.dnsserver import DnsServer
from tests.utils import DEFAULT_PASSWORD, AuthActions, bearer, random_email

pytestmark = not_on_cluster("host name processing; the store's part is the endpoint record tested elsewhere")

BASE = "/admin/webhook-endpoints"


@pytest.mark.parametrize(
    ("url", "host", "host_header"),
    [
        ("https://bücher.example/hook", "xn--bcher-kva.example", "xn--bcher-kva.example"),
        ("https://BÜCHER.example:8443/", "xn--bcher-kva.example", "xn--bcher-kva.example:8443"),
        ("https://faß.example/", "xn--fa-hia.example", "xn--fa-hia.example"),  # not transitional: not fass
        ("https://пример.испытание/", "xn--e1afmkfd.xn--80akhbyknj4f", "xn--e1afmkfd.xn--80akhbyknj4f"),
        ("http://παράδειγμα.test:8080/", "xn--hxajbheg2az3al.test", "xn--hxajbheg2az3al.test:8080"),
        ("https://bücher。example/", "xn--bcher-kva.example", "xn--bcher-kva.example"),  # a full stop of CJK
        ("https://b%C3%BCcher.example/", "xn--bcher-kva.example", "xn--bcher-kva.example"),  # percent-encoded
        ("https://xn--bcher-kva.example./", "xn--bcher-kva.example", "xn--bcher-kva.example"),
        ("https://ｅｘａｍｐｌｅ．ｃｏｍ/", "example.com", "example.com"),  # full-width: mapped to ASCII
        ("https://under_score.example/", "under_score.example", "under_score.example"),  # ASCII: left alone
    ],
)
def test_a_host_is_named_in_its_ascii_form(url, host, host_header):
    target = parse_url(url, allow_http=True)
    assert (target.host, target.host_header) == (host, host_header)


@pytest.mark.parametrize(
    "host",
    ["💩.example", "-bücher.example", "bücher-.example", "a\u200db.bücher.example", "ü" * 60 + ".example",
     "bücher..example", "b%FFcher.example", "bü%2Fcher.example"],
)  # fmt: skip
def test_an_invalid_idn_is_refused_with_a_clear_message(host):
    with pytest.raises(TargetRefused, match="host"):
        parse_url(f"https://{host}/", allow_http=False)


def test_an_invalid_idn_is_a_422_naming_idna(make_app):
    app = make_app(WEBHOOK_OUT_ALLOW_PRIVATE="true")
    email = random_email()
    with app.app_context():
        create_user(email, DEFAULT_PASSWORD, role="admin")
    client = https_client(app)
    admin = bearer(AuthActions(client).login_body(email)["access_token"])
    response = client.post(BASE, json={"url": "https://💩.example/hook", "channels": ["o"]}, headers=admin)
    assert response.status_code == 422
    assert "not a valid internationalised domain name (IDNA)" in response.get_json()["error"]["message"]
    assert client.get(BASE, headers=admin).get_json() == {"endpoints": []}


def test_a_full_width_spelling_of_a_loopback_address_is_judged_as_that_address():
    with pytest.raises(TargetRefused, match="127.0.0.1 is a loopback address"):
        check_url("https://１２７．０．０．１/", allow_http=False, allow_private=False)


@pytest.fixture(scope="module")
def dns():
    """bücher.test (xn--bcher-kva.test) is 127.0.0.1; no other name exists."""
    server = DnsServer({"xn--bcher-kva.test": "127.0.0.1"}).start()
    yield server
    server.stop()


def test_an_idn_host_is_resolved_and_sent_in_its_punycode_form(make_service, dns):
    """The web process checks, and the delivery process resolves and names, xn--bcher-kva.test: the host a
    browser would send for bücher.test. Both resolve through `dns`."""
    service = make_service(**dns.resolver_env())
    receiver, api = service.receiver, service.admin
    orders = channel()
    path = f"/idn/{orders}"
    receiver.behave(path)
    url = f"http://bücher.test:{receiver.port}{path}"
    endpoint = api.create_endpoint(url, [orders])
    assert endpoint["url"] == url  # kept as written
    api.publish(orders)
    (arrived,) = receiver.wait_for(path, 1)
    assert arrived.headers["Host"] == f"xn--bcher-kva.test:{receiver.port}"
    arrived.verify(endpoint["secret"])
    assert dns.asked("xn--bcher-kva.test")
    assert all(name.isascii() for name, _ in dns.queries), dns.queries
    delivered = api.message_with(endpoint["id"], lambda m: m["status"] == "delivered")
    assert [a["status_code"] for a in delivered["attempts"]] == [204]
