"""/openapi.json comes from the routes and the models the views validate with; /docs shows it."""

from __future__ import annotations

import base64

import pytest
from openapi_spec_validator import OpenAPIV31SpecValidator
from pydantic import Field

from app.auth.users import create_user
from app.http import validated
from app.openapi import build_document, operation, undeclared_routes
from app.schemas import Answer, Body
from tests.utils import DEFAULT_PASSWORD, bearer, random_email


def test_every_route_is_in_the_document(app):
    assert undeclared_routes(app) == []
    documented = build_document(app)["paths"]
    for rule in app.url_map.iter_rules():
        if rule.endpoint != "static":
            path = rule.rule.replace("<", "{").replace(">", "}")
            methods = {method.lower() for method in rule.methods - {"HEAD", "OPTIONS"}}
            assert methods <= set(documented[path]), rule.rule


@pytest.mark.not_on_cluster("the document is built from the views alone")
def test_every_operation_has_one_tag(app):
    """The reference page draws an operation once under each of its tags."""
    for path, operations in build_document(app)["paths"].items():
        for method, described in operations.items():
            assert len(described.get("tags", ())) == 1, (method, path)


def test_a_route_that_declares_nothing_is_caught(make_app):
    app = make_app()
    app.add_url_rule("/forgotten", "forgotten", lambda: "")
    assert undeclared_routes(app) == ["['GET'] /forgotten"]


def test_the_served_document_is_the_one_built_from_the_views(app, client):
    response = client.get("/openapi.json")
    assert response.status_code == 200 and response.mimetype == "application/json"
    served = response.get_json()
    assert served == build_document(app)
    assert served["openapi"] == "3.1.0"


# Every optional part of the service on: OAuth providers (a preset and an OpenID one), inbound webhook
# providers of every scheme, mail and outgoing-webhook settings.
EVERY_OPTION = {
    "OAUTH_PROVIDERS": "github,corp",
    "OAUTH_GITHUB_CLIENT_ID": "gh-id",
    "OAUTH_GITHUB_CLIENT_SECRET": "gh-very-secret",
    "OAUTH_CORP_CLIENT_ID": "corp-id",
    "OAUTH_CORP_CLIENT_SECRET": "corp-very-secret",
    "OAUTH_CORP_DISCOVERY_URL": "https://id.example.com/.well-known/openid-configuration",
    "WEBHOOK_PROVIDERS": "acme,pay,hub",
    "WEBHOOK_ACME_SCHEME": "standard",
    "WEBHOOK_ACME_SECRET": "whsec_" + base64.b64encode(b"a-standard-webhooks-test-secret!").decode(),
    "WEBHOOK_ACME_USER_PATH": "data.user_id",
    "WEBHOOK_PAY_SCHEME": "stripe",
    "WEBHOOK_PAY_SECRET": "whsec_stripe_test_secret_0123456789",
    "WEBHOOK_HUB_SCHEME": "github",
    "WEBHOOK_HUB_SECRET": "github-test-secret-0123456789",
    "SMTP_URL": "smtp://127.0.0.1:1",
    "PUBLIC_BASE_URL": "https://auth.example.test",
    "WEBHOOK_OUT_ALLOW_PRIVATE": "true",
    "WEBHOOK_OUT_ALLOW_HTTP": "true",
}


def duplicate_operation_ids(document: dict) -> dict[str, list[str]]:
    """operationIds used by more than one operation, with the operations using them."""
    users: dict[str, list[str]] = {}
    for path, operations in document["paths"].items():
        for method, described in operations.items():
            users.setdefault(described["operationId"], []).append(f"{method.upper()} {path}")
    return {name: where for name, where in users.items() if len(where) > 1}


@pytest.mark.parametrize("overrides", [{}, EVERY_OPTION], ids=["defaults", "every-option"])
def test_the_served_document_is_valid_openapi_3_1(make_app, overrides):
    document = make_app(**overrides).test_client().get("/openapi.json").get_json()
    errors = [str(error).splitlines()[0] for error in OpenAPIV31SpecValidator(document).iter_errors()]
    assert errors == []
    assert duplicate_operation_ids(document) == {}
    assert all(
        described["operationId"] for operations in document["paths"].values() for described in operations.values()
    )


def test_a_view_served_at_several_paths_and_methods_is_one_operation_each(make_app):
    app = make_app()

    @app.route("/twice", methods=["GET", "POST"])
    @app.route("/twice/again")
    @operation("test", tags=["test"], responses={204: None})
    def twice():
        return "", 204

    document = build_document(app)
    assert {"get", "post"} <= set(document["paths"]["/twice"]) and "get" in document["paths"]["/twice/again"]
    assert duplicate_operation_ids(document) == {}
    assert list(OpenAPIV31SpecValidator(document).iter_errors()) == []


def test_operation_ids_that_would_still_collide_are_refused(make_app):
    app = make_app()

    @app.get("/a-b")
    @app.get("/a_b")
    @operation("test", tags=["test"], responses={204: None})
    def look_alike():
        return "", 204

    with pytest.raises(ValueError, match="operationIds used more than once"):
        build_document(app)


def test_the_document_carries_the_constraints_the_views_enforce(app, client, auth):
    document = build_document(app)
    schemas = document["components"]["schemas"]
    login = document["paths"]["/auth/login"]["post"]
    assert login["requestBody"]["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/Login"}
    assert schemas["Login"]["required"] == ["email", "password"]
    assert schemas["Login"]["properties"]["transport"]["enum"] == ["cookie", "body"]
    batch = schemas["Batch"]["properties"]["events"]
    assert (batch["minItems"], batch["maxItems"]) == (1, 100)
    assert schemas["Publication"]["properties"]["channel"]["pattern"] == "^[A-Za-z0-9_.:=@-]{1,128}$"
    # ... and the service refuses exactly what the document forbids, with the statuses it lists.
    email = random_email()
    with app.app_context():
        create_user(email, DEFAULT_PASSWORD, role="admin")
    headers = bearer(auth.login_body(email)["access_token"])
    too_many = {"events": [{"channel": "broadcast", "event": "e"}] * 101}
    assert client.post("/events/batch", json=too_many, headers=headers).status_code == 422
    assert "422" in document["paths"]["/events/batch"]["post"]["responses"]
    bad_channel = {"channel": "no spaces", "event": "e"}
    refused = client.post("/events", json=bad_channel, headers=headers)
    assert refused.status_code == 422 and refused.get_json()["error"]["code"] == "validation_failed"
    wrong_type = client.post("/auth/login", json={"email": "a@example.com", "password": 5})
    assert wrong_type.status_code == 400
    assert wrong_type.get_json()["error"]["message"] == "Field 'password' must be of type string."


# The OAuth token endpoint answers every error in RFC 6749's shape, as its clients (OAuth libraries) expect.
RFC_6749 = {  # the OAuth endpoints answer as RFC 6749, 6750 and 7009 say
    ("post", "/oauth/token"),
    ("post", "/oauth/revoke"),
    ("get", "/oauth/userinfo"),
    ("post", "/oauth/userinfo"),
}


def test_every_error_has_the_one_error_shape(app):
    document = build_document(app)
    for path, operations in document["paths"].items():
        for method, described in operations.items():
            oauth = (method, path) in RFC_6749
            error = {"$ref": f"#/components/schemas/{'TokenError' if oauth else 'ErrorAnswer'}"}
            page = "pages" in described.get("tags", ())  # a browser page refuses with a page, not JSON
            for status, response in described["responses"].items():
                if page and set(response.get("content", {})) == {"text/html"}:
                    continue
                if int(status) >= 400 and status != "414":  # gunicorn's own page, before the service
                    assert response["content"]["application/json"]["schema"] == error, (method, path, status)
            if "requestBody" in described:
                # A form the token endpoint cannot use is invalid_request (400), never 415 or 422.
                wanted = {"400", "413"} if oauth else {"400", "413", "415", "422"}
                assert wanted <= set(described["responses"]), (method, path)
            if "security" in described:
                assert {"401", "403"} <= set(described["responses"]), (method, path)


def test_validation_errors_never_echo_the_input(make_app):
    class Secretive(Body):
        """A body with one constrained field."""

        code: str = Field(max_length=3)

    app = make_app()

    @app.post("/secretive")
    @operation("test", tags=["test"], body=Secretive, responses={204: Answer})
    def secretive():
        validated(Secretive)
        return "", 204

    client = app.test_client()
    response = client.post("/secretive", json={"code": "hunter2-secret"})
    assert response.status_code == 422
    assert "hunter2" not in response.get_data(as_text=True)
    assert client.post("/secretive", json={"code": "ok"}).status_code == 204


def test_the_reference_page_is_served_from_the_package_under_a_strict_policy(client):
    page = client.get("/docs")
    assert page.status_code == 200 and page.mimetype == "text/html"
    policy = page.headers["Content-Security-Policy"]
    assert "script-src 'self';" in policy and "unsafe-inline" not in policy and "unsafe-eval" not in policy
    assert "<script>" not in page.get_data(as_text=True)  # no inline script
    for name in ("swagger-ui-bundle.js", "swagger-ui.css"):
        asset = client.get(f"/docs/assets/{name}")
        assert asset.status_code == 200 and len(asset.get_data()) > 10_000
    assert client.get("/docs/assets/..%2Fapp.py").status_code == 404
    assert client.get("/docs/assets/oauth2-redirect.html").status_code == 404  # only what the page uses
