"""Fixtures for trusted issuers: an app that may fetch keys from loopback over HTTP, an administrator, a JWKS
server, and issuers defined through the API."""

from __future__ import annotations

import uuid

import pytest

from app.auth.users import create_user
from tests.conftest import https_client
from tests.issuers.issuer import AUDIENCE, KeySetServer, Signer
from tests.utils import DEFAULT_PASSWORD, AuthActions, bearer, random_email

# The test's JWKS server is on loopback, over plain HTTP: allowed only with both settings.
LOOPBACK_KEYS = {"WEBHOOK_OUT_ALLOW_HTTP": "true", "WEBHOOK_OUT_ALLOW_PRIVATE": "true"}


@pytest.fixture
def app(make_app):
    """The app, allowed to fetch keys from the loopback JWKS server."""
    return make_app(**LOOPBACK_KEYS)


@pytest.fixture
def client(app):
    return https_client(app)


@pytest.fixture
def auth(client):
    return AuthActions(client)


@pytest.fixture
def admin(app, auth):
    """An administrator, signed in (body transport): its id and a bearer header."""
    email = random_email()
    with app.app_context():
        user = create_user(email, DEFAULT_PASSWORD, role="admin")
    tokens = auth.login_body(email)
    return {"id": user["id"], "email": email, "headers": bearer(tokens["access_token"])}


@pytest.fixture(scope="module")
def key_server():
    started = KeySetServer().start()
    yield started
    started.stop()


@pytest.fixture
def define(client, admin):
    """Define an issuer through the API (PUT /admin/issuers/{name}); its name."""

    def put(name: str | None = None, **body) -> str:
        name = name or f"iss-{uuid.uuid4().hex[:8]}"
        body = {"issuer": f"https://{name}.example", "audience": AUDIENCE, **body}
        answer = client.put(f"/admin/issuers/{name}", json=body, headers=admin["headers"])
        assert answer.status_code == 200, answer.get_json()
        return name

    return put


@pytest.fixture
def rsa_issuer(define):
    """An issuer whose RSA key is given inline: (its name, its `iss`, its signer)."""
    signer = Signer.rsa()
    name = define(algorithms=["RS256"], jwks={"keys": [signer.jwk()]})
    return name, f"https://{name}.example", signer


@pytest.fixture
def audit_entries(client, admin):
    """The newest audit entries (of one type, and other filters), as GET /admin/audit answers them."""

    def read(entry_type: str | None = None, **filters) -> list[dict]:
        query = {"limit": 500, **({"type": entry_type} if entry_type else {}), **filters}
        answer = client.get("/admin/audit", query_string=query, headers=admin["headers"])
        assert answer.status_code == 200, answer.get_json()
        return answer.get_json()["entries"]

    return read
