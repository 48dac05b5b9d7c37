"""Schemathesis against a live gunicorn: every documented operation, with valid and invalid input,
answers as /openapi.json says (statuses, media types, schemas, headers) and never with a 5xx.

Bounded and derandomised: the same examples on every run, a fixed number per operation and mode
(SCHEMATHESIS_EXAMPLES raises it for a longer local run).
"""

from __future__ import annotations

import copy
import os

import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.config import SchemathesisConfig
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from app import create_app
from app.openapi import build_document
from tests.client.conftest import create_key
from tests.servers import LiveServer
from tests.utils import DEFAULT_PASSWORD, random_email

pytestmark = pytest.mark.not_on_cluster(
    "OpenAPI conformance of the HTTP layer; its Redis paths run on the cluster in other tests"
)

EXAMPLES = int(os.environ.get("SCHEMATHESIS_EXAMPLES", "5"))  # per operation and mode: the suite keeps its time
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
    response_headers_conformance,
    negative_data_rejection,
]
# Streams never end, so a request/response fuzzer cannot judge them; their refusals before the stream
# starts (401, 400 for a bad cursor, 429) are tested in tests/events and tests/auth/test_bad_input.py.
STREAMS = {"GET /events/stream", "GET /ws"}
# Operations that end the caller's session or change its password: each case gets a user of its own.
OWN_USER = {"POST /auth/logout", "POST /auth/logout-all", "DELETE /auth/sessions/{session_id}", "POST /auth/password"}
URL_LIMIT = 2000  # an endpoint URL's maxLength in the document
SETTINGS = {
    "WEBHOOK_OUT_ALLOW_PRIVATE": "true",  # endpoints saved by valid cases point at loopback
    "WEBHOOK_OUT_ALLOW_HTTP": "true",
    "LONG_POLL_TIMEOUT_SECONDS": "0.2",
    "LONG_POLL_MAX_TIMEOUT_SECONDS": "0.5",
    "RATE_LIMITS_ENABLED": "false",
}
_LOCAL = {"SECRET_KEY": "s" * 40, "JWT_SECRET": "j" * 40, "REDIS_URL": "redis://127.0.0.1:1/0", "APP_ENV": "test"}
_DOCUMENT = build_document(create_app(_LOCAL))
# Invalid input needs something to be invalid: a body or a parameter.
CASES = sorted(
    (f"{method.upper()} {path}", mode)
    for path, operations in _DOCUMENT["paths"].items()
    for method, described in operations.items()
    for mode in ("valid", "invalid")
    if f"{method.upper()} {path}" not in STREAMS
    and (mode == "valid" or "requestBody" in described or "parameters" in described)
)


@pytest.fixture(scope="module")
def service(base_env, tmp_path_factory):
    live = LiveServer({**base_env, **SETTINGS}, workers=2, log_path=tmp_path_factory.mktemp("logs") / "gunicorn.log")
    live.start()
    yield live
    live.stop()


# Invalid input must be refused with one of these (never 2xx, never 5xx).
REFUSALS = [400, 401, 403, 404, 413, 414, 415, 422, 429]


def load(document: dict):
    config = SchemathesisConfig.from_dict({"checks": {"negative_data_rejection": {"expected-statuses": REFUSALS}}})
    return schemathesis.openapi.from_dict(document, config=config)


@pytest.fixture(scope="module")
def document(service) -> dict:
    return requests.get(service.url + "/openapi.json", timeout=10).json()


def _login(service, email: str) -> str:
    body = {"email": email, "password": DEFAULT_PASSWORD, "transport": "body"}
    response = requests.post(service.url + "/auth/login", json=body, timeout=10)
    assert response.status_code == 200, response.text
    return response.json()["access_token"]


@pytest.fixture(scope="module")
def admin_token(service, module_cli) -> str:
    email = random_email()
    done = module_cli("users", "create", "--email", email, "--password", DEFAULT_PASSWORD, "--role", "admin")
    assert done.returncode == 0, done.stderr
    return _login(service, email)


@pytest.fixture(scope="module")
def api_key(service, module_cli) -> str:
    scopes = [
        "events:publish",
        "tokens:introspect",
        "webhooks:manage",
        "channels:manage",
        "audit:read",
        "issuers:manage",
        "clients:manage",
        "orgs:manage",
    ]
    return create_key(module_cli, "schemathesis", scopes, ["*"])


def _own_user_token(service) -> str:
    email = random_email()
    created = requests.post(service.url + "/auth/register", json={"email": email, "password": DEFAULT_PASSWORD})
    assert created.status_code == 201, created.text
    return _login(service, email)


@pytest.mark.parametrize("label, mode", CASES, ids=[f"{label} {mode}" for label, mode in CASES])
def test_operation_conforms_to_the_document(service, document, admin_token, api_key, label, mode):
    run(load(document), service, admin_token, api_key, label, mode)


def test_a_document_that_drifted_from_the_service_fails(service, document, admin_token, api_key):
    """The harness can fail: a status the document does not list, and an answer the document describes
    otherwise than the service gives it, are both caught."""
    drifted = copy.deepcopy(document)
    del drifted["paths"]["/events"]["get"]["responses"]["204"]  # nothing new: the service answers 204
    with pytest.raises(BaseExceptionGroup) as caught:
        run(load(drifted), service, admin_token, api_key, "GET /events", "valid")
    assert "Undocumented status code" in str(caught.value.exceptions)
    drifted["components"]["schemas"]["Status"]["properties"]["status"]["enum"] = ["fine"]
    with pytest.raises(BaseExceptionGroup) as caught:
        run(load(drifted), service, admin_token, api_key, "GET /healthz", "valid")
    assert "Response violates schema" in str(caught.value.exceptions)


LOOPBACK_HOOK = "http://127.0.0.1:9/hook"  # the discard port; no delivery process runs here anyway


def keep_on_this_machine(case) -> None:
    """Webhook endpoint, JWKS, proxy and back-channel logout URLs point at loopback: saving one resolves its
    host, and a generated name would send a DNS query off this machine. Only URLs the document accepts are
    replaced (an over-long one stays, and is refused before any resolution), so an invalid case stays invalid.
    (A client's redirect URIs are checked by their form alone: nothing resolves them.)"""
    body = case.body if isinstance(case.body, dict) else None
    for field in ("url", "jwks_url", "proxy_url", "backchannel_logout_uri"):
        if body is not None and isinstance(body.get(field), str) and len(body[field]) <= URL_LIMIT:
            body[field] = LOOPBACK_HOOK


def run(schema, service, admin_token: str, api_key: str, label: str, mode: str) -> None:
    """Every generated case of one operation, sent to the live service and checked against the document."""
    generation = GenerationMode.POSITIVE if mode == "valid" else GenerationMode.NEGATIVE
    method, path = label.split(" ", 1)
    operation = schema[path][method]
    security = {name for requirement in operation.definition.raw.get("security", []) for name in requirement}

    @settings(
        max_examples=EXAMPLES,
        derandomize=True,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(case=operation.as_strategy(generation_mode=generation))
    def check(case):
        keep_on_this_machine(case)
        if label in OWN_USER:
            token = _own_user_token(service)
        else:
            # Operations open to users and keys alike: valid cases as a backend, invalid ones as an admin.
            by_key = security == {"apiKey"} or ("apiKey" in security and mode == "valid")
            token = api_key if by_key else admin_token
        headers = {"Authorization": f"Bearer {token}"} if security else {}
        response = case.call(base_url=service.url, headers=headers, timeout=10, allow_redirects=False)
        case.validate_response(response, checks=CHECKS, headers=headers)

    check()
