"""What the tests of the provider's flows share: the service (one gunicorn per module, its issuer its own URL), a
browser holding the service's cookies, and a relying party that is Authlib's requests client, checking ID tokens
against the published JWKS with PyJWT as any relying party would.

Nothing follows a redirect to a client's redirect URI: the tests read the `Location` the service answers, so no
request leaves the machine (the URIs name hosts nobody serves).
"""

from __future__ import annotations

import http.cookiejar
import secrets
import uuid
from dataclasses import dataclass, field
from urllib.parse import parse_qs, urljoin, urlsplit

import jwt
import pytest
import requests
from authlib.integrations.requests_client import OAuth2Session

from app import create_app
from app.apikeys.store import create_key
from app.auth.users import create_user
from app.oidc import clients
from tests.servers import LiveServer
from tests.utils import DEFAULT_PASSWORD, random_email

REDIRECT_URI = "https://rp.example/callback"


@pytest.fixture(scope="module", autouse=True)
def secure_cookies_to_loopback():
    """Send Secure cookies to http://127.0.0.1 and http://localhost, as browsers do for loopback (a secure
    context); requests copies cookies with the default policy, so the default policy is what has to allow it."""
    default = http.cookiejar.DefaultCookiePolicy.return_ok_secure

    def return_ok_secure(self, cookie, request):
        host = urlsplit(request.get_full_url()).hostname
        return host in ("127.0.0.1", "localhost") or default(self, cookie, request)

    http.cookiejar.DefaultCookiePolicy.return_ok_secure = return_ok_secure
    yield
    http.cookiejar.DefaultCookiePolicy.return_ok_secure = default


@dataclass
class Service:
    """The running service and an in-process app on its Redis (to register clients and users directly)."""

    web: LiveServer
    app: object
    discovery: dict = field(default_factory=dict)

    @property
    def url(self) -> str:
        return self.web.url

    def call(self, method: str, path: str, **kwargs) -> requests.Response:
        return requests.request(method, self.url + path, timeout=10, allow_redirects=False, **kwargs)

    def new_client(self, **fields) -> tuple[clients.OAuthClient, str | None]:
        """A registered client (confidential, not first party, scopes openid email profile offline_access events
        unless told otherwise), and its secret."""
        asked = clients.OAuthClient(
            client_id="",
            name=fields.pop("name", f"Shop {uuid.uuid4().hex[:6]}"),
            type=fields.pop("type", "confidential"),
            redirect_uris=tuple(fields.pop("redirect_uris", (REDIRECT_URI,))),
            grant_types=tuple(fields.pop("grant_types", ("authorization_code", "refresh_token"))),
            scopes=tuple(fields.pop("scopes", ("openid", "email", "profile", "offline_access", "events", "orgs"))),
            **fields,
        )
        with self.app.app_context():
            return clients.create_client(asked)

    def new_user(self, email: str | None = None, role: str = "user") -> dict:
        """A user with a password: id and e-mail."""
        email = email or random_email()
        with self.app.app_context():
            user = create_user(email, DEFAULT_PASSWORD, role=role)
        return {"id": user["id"], "email": email}

    def api_key(self, *scopes: str) -> dict:
        """A bearer header of a new API key with these scopes (every channel)."""
        with self.app.app_context():
            raw, _ = create_key(f"key {uuid.uuid4().hex[:6]}", list(scopes), ["*"])
        return {"Authorization": f"Bearer {raw}"}

    def introspect(self, token: str) -> dict:
        """RFC 7662's answer for a token, asked with an API key of scope tokens:introspect."""
        if not hasattr(self, "_introspector"):
            self._introspector = self.api_key("tokens:introspect")
        answer = self.call("POST", "/auth/introspect", data={"token": token}, headers=self._introspector)
        assert answer.status_code == 200, answer.text
        return answer.json()


def start_service(base_env: dict, log_dir, **settings) -> Service:
    """A gunicorn whose OpenID issuer is its own address."""
    web = LiveServer({**base_env, **settings}, log_path=log_dir / "gunicorn.log")
    web.env["OIDC_ISSUER"] = web.url
    web.start()
    service = Service(web, create_app({**base_env, **settings, "OIDC_ISSUER": web.url}))
    service.discovery = service.call("GET", "/.well-known/openid-configuration").json()
    return service


class Browser(requests.Session):
    """A browser on the service's page: its cookies, and the sign-in the page does."""

    def __init__(self, service: Service):
        super().__init__()
        self.service = service

    def sign_in(self, email: str, password: str = DEFAULT_PASSWORD) -> requests.Response:
        """Log in on the page (cookie transport): the browser session."""
        body = {"email": email, "password": password, "transport": "cookie"}
        answer = self.post(self.service.url + "/auth/login", json=body, timeout=10)
        assert answer.status_code in (200, 401), answer.text
        return answer

    def go(self, url: str, **kwargs) -> requests.Response:
        """One navigation, its redirect not followed."""
        return self.request(
            kwargs.pop("method", "GET"), urljoin(self.service.url, url), timeout=10, allow_redirects=False, **kwargs
        )


@dataclass
class Answer:
    """Where an authorization request ended: at the client (its redirect's parameters), at the sign-in page
    (`next`), at the consent page, or at a page of refusal."""

    response: requests.Response

    @property
    def location(self) -> str:
        return self.response.headers.get("Location", "")

    @property
    def at_client(self) -> bool:
        return self.response.status_code == 302 and self.location.startswith(REDIRECT_URI.split("/callback")[0])

    @property
    def params(self) -> dict:
        return {name: values[0] for name, values in parse_qs(urlsplit(self.location).query).items()}

    @property
    def sign_in_next(self) -> str | None:
        """The `next` of a redirect to the sign-in page, if it is one."""
        if self.response.status_code != 302 or not self.location.startswith("/?"):
            return None
        return parse_qs(urlsplit(self.location).query)["next"][0]

    @property
    def consent_page(self) -> bool:
        return self.response.status_code == 200 and 'id="consent-form"' in self.response.text


class RelyingParty:
    """A client application: Authlib's requests client, with PKCE S256, discovering the provider."""

    def __init__(self, service: Service, client: clients.OAuthClient, secret: str | None, scope: str, **kwargs):
        self.service, self.client = service, client
        auth = kwargs.pop("token_endpoint_auth_method", "client_secret_basic" if secret else "none")
        self.session = OAuth2Session(
            client.client_id,
            secret,
            scope=scope,
            redirect_uri=client.redirect_uris[0] if client.redirect_uris else None,
            code_challenge_method="S256",
            token_endpoint_auth_method=auth,
            **kwargs,
        )
        self.verifier = secrets.token_urlsafe(48)
        self.nonce = secrets.token_urlsafe(16)
        self.state = None

    def authorization_url(self, **params) -> str:
        """The authorization request (with PKCE, and a new nonce unless told otherwise)."""
        self.nonce = params.setdefault("nonce", secrets.token_urlsafe(16))
        url, self.state = self.session.create_authorization_url(
            self.service.discovery["authorization_endpoint"], code_verifier=self.verifier, **params
        )
        return url

    def authorize(self, browser: Browser, **params) -> Answer:
        return Answer(browser.go(self.authorization_url(**params)))

    def redeem(self, answer: Answer, **kwargs) -> dict:
        """The tokens for the code of `answer` (Authlib checks the state)."""
        return self.session.fetch_token(
            self.service.discovery["token_endpoint"],
            authorization_response=answer.location,
            code_verifier=kwargs.pop("code_verifier", self.verifier),
            **kwargs,
        )

    def verified_id_token(self, token: dict) -> dict:
        """The ID token's claims, verified against the published JWKS (signature, issuer, audience, expiry)."""
        id_token = token["id_token"]
        header = jwt.get_unverified_header(id_token)
        keys = jwt.PyJWKSet.from_dict(requests.get(self.service.discovery["jwks_uri"], timeout=10).json())
        key = keys[header["kid"]]
        return jwt.decode(
            id_token,
            key.key,
            algorithms=[key.algorithm_name],
            audience=self.client.client_id,
            issuer=self.service.discovery["issuer"],
            options={"require": ["iss", "sub", "aud", "exp", "iat", "auth_time", "sid", "amr", "at_hash"]},
        )


def authorized(rp: RelyingParty, browser: Browser, email: str, **params) -> dict:
    """A whole authorization: the request, the sign-in if the browser has none, the consent if asked (allowed),
    and the code redeemed; the token answer."""
    answer = rp.authorize(browser, **params)
    if answer.sign_in_next is not None:
        answer = sign_in_and_come_back(browser, answer, email)
    if answer.consent_page:
        answer = consent(browser, answer)
    assert answer.at_client and "code" in answer.params, (answer.response.status_code, answer.location)
    return rp.redeem(answer)


def sign_in_and_come_back(browser: Browser, answer: Answer, email: str) -> Answer:
    """Follow the page's sign-in: log in, then go on to `next` as the page does."""
    assert answer.sign_in_next is not None, (answer.response.status_code, answer.location)
    assert browser.sign_in(email).status_code == 200
    return Answer(browser.go(answer.sign_in_next))


def consent(browser: Browser, answer: Answer, decision: str = "allow") -> Answer:
    """Answer the consent page's form (as its buttons do)."""
    assert answer.consent_page, answer.response.text[:300]
    page = answer.response.text
    action = page.split('action="', 1)[1].split('"', 1)[0].replace("&amp;", "&")
    token = page.split('name="consent_token" value="', 1)[1].split('"', 1)[0]
    form = {"consent_token": token, "decision": decision}
    return Answer(browser.go(action, method="POST", data=form, headers={"Origin": browser.service.url}))
