"""The Python client's token exchange against the live service, with real issuers (an HMAC secret; an RSA
key given as an inline JWKS): a session for the application's own user, refusals as `ApiError` in OAuth's
shape, and proxy namespaces (their signing secret answered once)."""

from __future__ import annotations

import secrets

import httpx
import pytest
import requests
from auth_rt_client import ApiError, Client, EventReader, ExternalIdentity, Namespace, Tokens

from tests.client.collector import Collector
from tests.client.conftest import create_key
from tests.events.conftest import FAST
from tests.issuers.conftest import LOOPBACK_KEYS
from tests.issuers.issuer import AUDIENCE, Signer, claims
from tests.servers import LiveServer

pytestmark = pytest.mark.not_on_cluster("the client speaks HTTP; exchanges on both modes are tested in tests/issuers")

ACCESS_TOKEN_TYPE = "urn:ietf:params:oauth:token-type:access_token"  # noqa: S105 - a name, not a secret


@pytest.fixture(scope="module")
def server(base_env, tmp_path_factory):
    """One worker that may reach a proxy URL on loopback over HTTP (as a developer's machine would)."""
    live = LiveServer({**base_env, **FAST, **LOOPBACK_KEYS}, log_path=tmp_path_factory.mktemp("logs") / "app.log")
    live.start()
    yield live
    live.stop()


@pytest.fixture(scope="module")
def rooms(server) -> str:  # noqa: ARG001 - the namespace lives in the server's Redis
    return f"rooms{secrets.token_hex(4)}"


@pytest.fixture(scope="module")
def backend_key(server, module_cli, rooms) -> str:  # noqa: ARG001 - the key lives in the server's Redis
    """The application's backend: trusts issuers, manages and publishes to its rooms and its users' channels."""
    scopes = ["issuers:manage", "channels:manage", "events:publish"]
    key = create_key(module_cli, "product", scopes, [f"{rooms}:*", "user:*"])
    with Client(server.url, key) as client:
        client.put_namespace(rooms, subscribe="members", presence=True)
    return key


def trust(server: LiveServer, key: str, **keys) -> tuple[str, str]:
    """A new trusted issuer with these keys (`secret` or `jwks`): its name here and its `iss`."""
    name = f"product-{secrets.token_hex(4)}"
    issuer = f"https://{name}.example"
    body = {"issuer": issuer, "audience": AUDIENCE, **keys}
    answer = requests.put(
        f"{server.url}/admin/issuers/{name}", json=body, headers={"Authorization": f"Bearer {key}"}, timeout=10
    )
    assert answer.status_code == 200, answer.text
    return name, issuer


@pytest.fixture(scope="module")
def hmac_issuer(server, backend_key) -> tuple[str, str, Signer]:
    signer = Signer.hmac()
    name, issuer = trust(server, backend_key, algorithms=["HS256"], secret=signer.private)
    return name, issuer, signer


@pytest.fixture(scope="module")
def rsa_issuer(server, backend_key) -> tuple[str, str, Signer]:
    signer = Signer.rsa()
    name, issuer = trust(server, backend_key, algorithms=["RS256"], jwks={"keys": [signer.jwk()]})
    return name, issuer, signer


def test_exchange_opens_a_session_for_the_applications_user_with_no_api_key(server, backend_key, hmac_issuer, rooms):
    name, issuer, signer = hmac_issuer
    token = signer.sign(claims(issuer, "auth0|ada", email="ada@product.example"))
    with Client(server.url) as client:  # no key: the token is the credential
        tokens = client.exchange(token)
    assert isinstance(tokens, Tokens)
    assert (tokens.token_type, tokens.expires_in, tokens.issued_token_type) == ("Bearer", 900, ACCESS_TOKEN_TYPE)
    assert tokens.user.external == ExternalIdentity(name, "auth0|ada")
    assert (tokens.user.email, tokens.user.role) == ("ada@product.example", "user")
    assert tokens.access_token not in repr(tokens) and tokens.refresh_token not in repr(tokens)
    me = httpx.get(f"{server.url}/auth/me", headers={"Authorization": f"Bearer {tokens.access_token}"})
    assert me.json()["user"]["id"] == tokens.user.id and me.json()["session_id"] == tokens.session_id

    # The same user at the next exchange; the backend grants a room, and the user reads it as any user does.
    with Client(server.url, backend_key) as backend:  # a client with a key exchanges too
        again = backend.exchange(token, "urn:ietf:params:oauth:token-type:jwt", device="worker")
        assert again.user.id == tokens.user.id and again.session_id != tokens.session_id
        room = f"{rooms}:design"
        backend.grant(room, tokens.user.id, info={"name": "Ada"})
        reader = EventReader(server.url, again.access_token, channels=[room], transport="long-poll", wait_seconds=2)
        collector = Collector(reader)
        try:
            backend.publish(room, "message", {"text": "hello"})
            [event] = collector.events(1)
        finally:
            collector.stop()
    assert (event.channel, event.data) == (room, {"text": "hello"})


def test_an_id_token_of_an_rsa_issuer_with_inline_keys_names_the_device(server, rsa_issuer):
    name, issuer, signer = rsa_issuer
    with Client(server.url) as client:
        tokens = client.exchange(signer.sign(claims(issuer, "kc-42")), "id_token", device="Billing worker")
    assert tokens.user.external == ExternalIdentity(name, "kc-42") and tokens.user.email is None
    sessions = httpx.get(f"{server.url}/auth/sessions", headers={"Authorization": f"Bearer {tokens.access_token}"})
    assert [session["device"] for session in sessions.json()["sessions"]] == ["Billing worker"]


def test_refused_tokens_raise_api_errors_in_oauths_shape(server, hmac_issuer, rsa_issuer):
    _, hmac_iss, hmac_signer = hmac_issuer
    _, _, rsa_signer = rsa_issuer
    refused = {
        "expired": hmac_signer.sign(claims(hmac_iss, lifetime=-120)),
        "another audience": hmac_signer.sign(claims(hmac_iss, audience="someone-else")),
        "no trusted issuer": hmac_signer.sign(claims("https://unknown.example")),
        "another issuer's key": rsa_signer.sign(claims(hmac_iss)),
    }
    with Client(server.url) as client:
        for why, token in refused.items():
            with pytest.raises(ApiError) as raised:
                client.exchange(token)
            assert (raised.value.status, raised.value.code) == (400, "invalid_grant"), why
            assert raised.value.message and raised.value.message != "invalid_grant", why  # the description
        with pytest.raises(ApiError) as raised:
            client.exchange(hmac_signer.sign(claims(hmac_iss)), "saml2")
    assert (raised.value.status, raised.value.code) == (400, "invalid_request")


def test_a_proxy_namespace_answers_its_secret_once(server, backend_key, rooms):
    url = "http://127.0.0.1:9/may-subscribe"  # checked when saved, asked only when someone subscribes
    name = f"{rooms}p"
    with Client(server.url, backend_key) as client:
        made = client.put_namespace(name, subscribe="proxy", publish="subscribers", presence=True, proxy_url=url)
        assert (made.subscribe, made.proxy_url) == ("proxy", url)
        assert made.proxy_secret.startswith("whsec_") and made.proxy_secret not in repr(made)
        kept = client.put_namespace(name, subscribe="proxy", proxy_url=url)
        assert kept.proxy_secret is None  # replacing the rules keeps the secret, unshown
        rotated = client.put_namespace(name, subscribe="proxy", proxy_url=url, rotate_proxy_secret=True)
        assert rotated.proxy_secret.startswith("whsec_") and rotated.proxy_secret != made.proxy_secret
        listed = next(namespace for namespace in client.namespaces() if namespace.name == name)
        assert listed == Namespace(name, "proxy", "server", False, False, url)
        plain = client.put_namespace(name, subscribe="members")
        assert (plain.proxy_url, plain.proxy_secret) == (None, None)
        with pytest.raises(ApiError) as raised:
            client.put_namespace(name, subscribe="proxy", proxy_url="ftp://127.0.0.1/x")
    assert raised.value.status == 422
