"""`GET /oauth/authorize` (and the consent form's `POST` there): the authorization endpoint, on Authlib's server.

In order:
1. The client and its redirect URI. An unknown client, or a redirect URI not registered for it (exactly), is
   answered with a 400 page here and never redirected: nobody may use the endpoint to send a browser elsewhere.
2. Everything else that is wrong goes back to the client's redirect URI with `error`, `state` and `iss` (RFC
   9207): a response type other than `code`, a scope the client is not registered for, no PKCE (S256) ...
   (Authlib's validation, with the grants of grants.py).
3. The user: the browser session of the service's page (its access cookie). Without one, or when the request asks
   for a new sign-in (`prompt=login`, or a `max_age` the sign-in is older than), the browser goes to the page,
   `/?next=<this request>` (with `&reauth=1` when someone is signed in already), and comes back once signed in;
   `next` then no longer asks for a new sign-in, so the request does not loop. `prompt=none` shows no page:
   `login_required` instead.
4. Consent, for clients that are not first_party: a page naming the client and the scopes, one form with the
   buttons Allow and Deny and an anti-forgery field of its own (bound to the browser session and this request);
   remembered per user and client (consents.py), so a request within what was allowed asks nothing.
   `prompt=consent` asks again; `prompt=none` answers `consent_required` instead.
5. The code (codes.py), redirected with `state` and `iss`.

The consent page's content security policy is the page's, with the client's redirect URI's origin allowed as a
form action: allowing or denying redirects the form's submission there, which `form-action 'self'` would stop.
Its referrer policy is `same-origin` (not the service's `no-referrer`), so that its form's POST carries its Origin
and passes the cross-site rule of cookie-authenticated requests like any of the page's own requests.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import time
from urllib.parse import urlencode, urlsplit

from authlib.oauth2.rfc6749 import InvalidRequestError, OAuth2Error, UnsupportedResponseTypeError
from authlib.oauth2.rfc6749.util import scope_to_list
from authlib.oidc.core.errors import ConsentRequiredError, LoginRequiredError
from flask import Blueprint, current_app, make_response, redirect, render_template, request

from ..oauth_server.server import QueryRequest
from ..openapi import operation
from ..page import CONTENT_SECURITY_POLICY
from ..schemas import ErrorAnswer
from . import consents, sessions
from .clients import OAuthClient, get_client
from .schemas import AuthorizationRequest

bp = Blueprint("oidc_authorize", __name__)

SCOPE_TEXTS = {
    "openid": "Know who you are here (your user id).",
    "email": "See your e-mail address, and whether it is verified.",
    "profile": "See your user name: the part of your e-mail address before the @.",
    "offline_access": "Stay signed in while you are away (until you sign out or withdraw this).",
    "events": "Read your live events, and publish to your own channel, as you.",
    "orgs": "See the organizations you belong to.",
}
ERROR_TEXT = re.compile(r"[^\x20-\x21\x23-\x5b\x5d-\x7e]")  # what an OAuth error description may not hold


class UnknownTarget(Exception):
    """The request names no registered client, or a redirect URI not registered for it: a page, never a redirect."""


@bp.route("/oauth/authorize", methods=["GET", "POST"])
@operation(
    "OpenID Connect authorization endpoint: a code for the client (302), the consent page (200), or a page "
    "for an unknown client or redirect URI (400, never redirected)",
    tags=["pages"],
    query=AuthorizationRequest,
    responses={
        200: ("text/html", "The consent page: the client, the scopes, Allow and Deny"),
        302: None,
        400: ("text/html", "An unknown client or redirect URI"),
        403: ("text/html", "A consent form not made for this browser session"),
    },
    error_answer=ErrorAnswer,
    headers={302: {"Location": "The client's redirect URI with code (or error), state and iss; or the sign-in page."}},
)
def authorize():
    """Authorize a client for the signed-in user (see the module's text)."""
    server = current_app.extensions["oauth_server"]
    oauth_request = QueryRequest(request)
    try:
        client, redirect_uri = _target(oauth_request.payload.datalist)
    except UnknownTarget as refused:
        return _page("oauth_error.html", 400, message=str(refused), unknown_target=True)
    try:
        response = _authorize(server, oauth_request, client, redirect_uri)
    except OAuth2Error as error:
        error.redirect_uri = redirect_uri  # checked above: every other error goes back to the client
        error.state = oauth_request.payload.state
        response = server.handle_error_response(oauth_request, error)
        server.issuer_parameter.add_issuer_parameter(server, response)
    response.headers["Cache-Control"] = "no-store"
    return response


def _target(given) -> tuple[OAuthClient, str]:
    """The client and the redirect URI to answer at; UnknownTarget when either is not one registered."""
    client_ids, redirect_uris = given.get("client_id", []), given.get("redirect_uri", [])
    if len(client_ids) != 1 or not client_ids[0]:
        raise UnknownTarget("The request must name one application (client_id).")
    client = get_client(client_ids[0])
    if client is None:
        raise UnknownTarget("No application with this client_id is registered here.")
    if len(redirect_uris) > 1:
        raise UnknownTarget("The request must name one redirect_uri.")
    if redirect_uris:
        if not client.check_redirect_uri(redirect_uris[0]):
            raise UnknownTarget(f"This redirect_uri is not registered for {client.name}.")
        return client, redirect_uris[0]
    default = client.get_default_redirect_uri()
    if default is None:
        raise UnknownTarget(f"The request must name its redirect_uri: {client.name} has several.")
    return client, default


def _authorize(server, oauth_request, client: OAuthClient, redirect_uri: str):
    data = oauth_request.payload.data
    response_type = data.get("response_type") or ""
    if response_type != "code":
        raise UnsupportedResponseTypeError(ERROR_TEXT.sub("?", response_type[:40]))
    browser = sessions.browser_session()
    grant = server.get_consent_grant(request=oauth_request, end_user=browser)
    prompts = set((data.get("prompt") or "").split())
    if "none" in prompts and len(prompts) > 1:
        raise InvalidRequestError("prompt=none cannot be combined with another prompt.")
    max_age = _max_age(data.get("max_age"))
    too_old = browser is not None and max_age is not None and time.time() - browser.auth_time > max_age
    if browser is None or "login" in prompts or too_old:
        if "none" in prompts:
            raise LoginRequiredError("The user is not signed in (or signed in too long ago).")
        return _to_sign_in(again=browser is not None)
    scopes = scope_to_list(oauth_request.scope) or []
    if request.method == "POST":
        return _decided(server, oauth_request, grant, client, browser, scopes)
    asks = not client.first_party and (
        "consent" in prompts or not consents.covers(browser.user_id, client.client_id, scopes)
    )
    if asks and "none" in prompts:
        raise ConsentRequiredError("The user has not allowed this application these scopes.")
    if asks:
        return _consent_page(client, browser, scopes, redirect_uri)
    return server.create_authorization_response(request=oauth_request, grant_user=browser, grant=grant)


def _max_age(given: str | None) -> int | None:
    """max_age in seconds, or None; invalid_request unless it is a whole number."""
    if given is None or given == "":
        return None
    if not re.fullmatch(r"[0-9]{1,10}", given):
        raise InvalidRequestError("max_age must be a whole number of seconds.")
    return int(given)


def _to_sign_in(again: bool):
    """To the page, which signs the user in and sends the browser back to this request (`next`), no longer asking
    for a new sign-in (prompt=login, max_age) once it has had one."""
    args = request.args.copy()
    prompts = [prompt for prompt in (args.get("prompt") or "").split() if prompt != "login"]
    if "max_age" in args or len(prompts) != len((args.get("prompt") or "").split()):
        args.poplist("max_age")
        args.poplist("prompt")
        if prompts:
            args["prompt"] = " ".join(prompts)
        query = urlencode(list(args.items(multi=True)))
    else:
        query = request.query_string.decode("latin-1")
    asked = {"next": f"{request.path}?{query}"}
    if again:
        asked["reauth"] = "1"
    return redirect("/?" + urlencode(asked), 302)


def _decided(server, oauth_request, grant, client: OAuthClient, browser, scopes: list[str]):
    """The consent form's answer: Deny is access_denied, Allow is remembered and gives the code."""
    if not hmac.compare_digest(request.form.get("consent_token", ""), _form_token(browser)):
        return _page("oauth_error.html", 403, message="This consent form has expired; start again from the app.")
    decision = request.form.get("decision")
    if decision == "deny":
        return server.create_authorization_response(request=oauth_request, grant_user=None, grant=grant)
    if decision != "allow":
        return _page("oauth_error.html", 400, message="Choose Allow or Deny.")
    if not client.first_party:
        consents.grant(browser.user_id, client, scopes)
    return server.create_authorization_response(request=oauth_request, grant_user=browser, grant=grant)


def _form_token(browser) -> str:
    """The consent form's anti-forgery value: bound to the browser session and to this very request."""
    key = hashlib.sha256(b"oidc-consent-form:" + current_app.config["SECRET_KEY"].encode()).digest()
    message = f"{browser.session_id}\n{request.query_string.decode('latin-1')}".encode()
    return hmac.new(key, message, hashlib.sha256).hexdigest()


def _consent_page(client: OAuthClient, browser, scopes: list[str], redirect_uri: str):
    response = _page(
        "oauth_consent.html",
        200,
        client=client,
        email=browser.user.get("email"),
        scopes=[(scope, SCOPE_TEXTS.get(scope, scope)) for scope in scopes],
        action=f"{request.path}?{request.query_string.decode('latin-1')}",
        consent_token=_form_token(browser),
        destination=_origin(redirect_uri),
    )
    response.headers["Content-Security-Policy"] = consent_policy(redirect_uri)
    # The form's POST must carry this page's Origin for the cross-site rule of cookie-authenticated requests: under
    # the service's usual no-referrer policy a browser sends `Origin: null` with a form's POST.
    response.headers["Referrer-Policy"] = "same-origin"
    return response


def _origin(uri: str) -> str:
    """Where a redirect URI leads, as a CSP source: `https://host:port`, or `scheme:` for an app's own scheme."""
    parts = urlsplit(uri)
    return f"{parts.scheme}://{parts.netloc}" if parts.scheme in ("http", "https") else f"{parts.scheme}:"


def consent_policy(redirect_uri: str) -> str:
    """The page's content security policy, the redirect URI's origin also allowed as a form action."""
    return CONTENT_SECURITY_POLICY.replace("form-action 'self'", f"form-action 'self' {_origin(redirect_uri)}")


def _page(template: str, status: int, **context):
    response = make_response(render_template(template, **context), status)
    response.headers["Cache-Control"] = "no-store"
    return response
