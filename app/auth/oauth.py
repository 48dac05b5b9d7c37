"""OAuth 2.0 authorization-code login as a client (Authlib), with PKCE (S256), state and nonce.

State, code_verifier, nonce and `next` live in Authlib's state data in the Flask session: a signed,
HttpOnly, Secure, SameSite=Lax cookie scoped to /auth/oauth that lives ten minutes. Lax, because a
Strict cookie is not sent on the provider's cross-site redirect back. The state check comes first in
the callback; a state is also marked used in Redis, so even a replayed cookie cannot use it twice.
"""

from __future__ import annotations

import hashlib
import html
import time
from dataclasses import dataclass
from datetime import timedelta

from flask import Blueprint, Flask, Response, current_app, redirect, request, session, url_for
from flask.sessions import SecureCookieSessionInterface

from .. import audit
from ..errors import ApiError, bad_request, not_found, validation_failed
from ..http import validated_query
from ..openapi import operation
from ..redis import AUDIT_LUA, END_SESSION_FUNCTION_LUA, Keys, get_redis, get_script
from ..settings import OAuthProvider
from . import account, cookies, emails, indexes, mailtokens, mfa, sessions, tokens, users
from .schemas import NextPage, OAuthProviderPath, ProviderReturn

bp = Blueprint("oauth", __name__, url_prefix="/auth/oauth")

STATE_LIFETIME = timedelta(minutes=10)
# Unfinished logins kept in the state cookie. Each adds about 135 bytes; without a bound, a hostile
# page starting logins in a loop would grow the cookie until the browser drops it and every request
# fails (431), blocking the victim's OAuth login. Only the newest few are kept.
MAX_PENDING_LOGINS = 3


@dataclass(frozen=True)
class Identity:
    """Who the provider says the user is, and whether it vouches for the e-mail address."""

    subject: str
    email: str | None
    email_verified: bool


def _registration(provider: OAuthProvider) -> dict:
    """Authlib's registration options for one provider (PKCE S256 always)."""
    options = {
        "client_id": provider.client_id,
        "client_secret": str(provider.client_secret),
        "server_metadata_url": provider.discovery_url,
        "authorize_url": provider.authorize_url,
        "access_token_url": provider.token_url,
        "userinfo_endpoint": provider.userinfo_url,
        "api_base_url": provider.api_base_url,
        "client_kwargs": {"scope": provider.scope, "code_challenge_method": "S256"},
    }
    return {key: value for key, value in options.items() if value is not None}


class OAuthStateOnly(SecureCookieSessionInterface):
    """Flask's signed-cookie session, opened only under the OAuth paths: the one thing it holds is the
    state of unfinished logins. Elsewhere the session is a null one, and no request pays for reading
    and verifying a cookie nothing else uses."""

    def open_session(self, app, request):
        """The state cookie under the OAuth paths; a null session elsewhere."""
        if not request.path.startswith(bp.url_prefix + "/"):
            return self.make_null_session(app)
        return super().open_session(app, request)


def init_app(app: Flask) -> None:
    """Register every configured OAuth provider with Authlib."""
    app.session_interface = OAuthStateOnly()
    providers = app.config["SETTINGS"].oauth_providers
    if providers:
        # Authlib's client (and the requests library under it) is loaded only where a provider is configured.
        from authlib.integrations.flask_client import OAuth

        oauth = OAuth(app)
        for provider in providers:
            oauth.register(provider.name, **_registration(provider))
    app.extensions["oauth_providers"] = [provider.name for provider in providers]


def provider_names() -> list[str]:
    """The configured OAuth providers, for the page's login buttons."""
    return current_app.extensions.get("oauth_providers", [])


def _client(provider: str):
    if provider not in provider_names():
        raise not_found("No such OAuth provider.")
    return current_app.extensions["authlib.integrations.flask_client"].create_client(provider)


def safe_next(value: str | None) -> str:
    """A same-site relative path, or 400: `next` must never send the browser to another site."""
    if not value:
        return "/"
    if not value.startswith("/") or value.startswith("//") or "\\" in value or any(ord(c) < 32 for c in value):
        raise bad_request("'next' must be a relative path on this site.")
    return value


@bp.get("/<provider>/login")
@operation(
    "Start an OAuth login: to the provider, with state and PKCE bound to this browser",
    tags=["oauth"],
    path=OAuthProviderPath,
    query=NextPage,
    responses={302: None},
    errors=(404,),
    headers={302: {"Location": "The provider's authorization URL."}},
)
def login(provider: str):
    """Start a login: fresh state, PKCE verifier and nonce in the state cookie, then off to the provider."""
    client = _client(provider)
    next_path = safe_next(validated_query(NextPage).next)
    redirect_uri = url_for(".callback", provider=provider, _external=True)
    authorization = client.create_authorization_url(redirect_uri)
    session.permanent = True  # Max-Age = STATE_LIFETIME
    client.save_authorize_data(redirect_uri=redirect_uri, next=next_path, **authorization)
    _keep_newest_attempts(MAX_PENDING_LOGINS)
    return redirect(authorization["url"], 302)


def _keep_newest_attempts(limit: int) -> None:
    """Drop all but the `limit` newest unfinished logins (Authlib keys them `_state_<provider>_<state>`)."""
    attempts = [key for key in session if key.startswith("_state_")]
    attempts.sort(key=lambda key: (session[key] or {}).get("exp", 0) if isinstance(session[key], dict) else 0)
    for key in attempts[:-limit]:
        session.pop(key)


def _claim_state_once(state: str) -> bool:
    key = Keys.oauth_state_used(hashlib.sha256(state.encode()).hexdigest())
    return bool(get_redis().set(key, "1", nx=True, ex=int(STATE_LIFETIME.total_seconds())))


@bp.get("/<provider>/callback")
@operation(
    "Finish an OAuth login: session cookies set, then on to the landing page",
    tags=["oauth"],
    path=OAuthProviderPath,
    query=ProviderReturn,
    responses={302: None},
    errors=(400, 404),
    headers={302: {"Set-Cookie": "The session's access and refresh cookies."}},
)
def callback(provider: str):
    """Finish a login: state first, then the code exchange, the user, a session and its cookies."""
    client = _client(provider)
    state = request.args.get("state")
    state_data = client.framework.get_state_data(session, state) if state else None
    if state_data is None or not _claim_state_once(state):
        raise ApiError(400, "invalid_state", "The login attempt could not be matched to this browser; start again.")
    try:
        return _complete_login(provider, client, state_data)
    finally:
        _forget_attempt(client, state)


def _forget_attempt(client, state: str) -> None:
    """Used once: drop this attempt's data, and the cookie itself when no other attempt is pending."""
    client.framework.clear_state_data(session, state)
    if not any(key.startswith("_state_") for key in session):
        session.clear()


def _complete_login(provider: str, client, state_data: dict):
    import requests
    from authlib.integrations.base_client import OAuthError

    if "error" in request.args:
        reason = request.args.get("error_description") or request.args["error"]
        raise ApiError(400, "oauth_error", f"The provider did not authorise the login: {reason[:200]}")
    try:
        token = client.authorize_access_token()  # sends the original code_verifier; verifies the ID token
        identity = _identity(provider, client, token)
    except OAuthError as error:
        raise ApiError(400, "oauth_failed", f"The provider refused the login: {error.error}") from None
    except requests.RequestException:
        raise ApiError(503, "unavailable", "The provider could not be reached; try again.") from None
    user = find_or_create_user(provider, identity)
    account.require_verified_email(user)
    if mfa.is_enabled(user):
        # The provider vouched for the first factor only: the page asks for the code. The token
        # travels in the fragment, so it is not sent to any server or logged.
        token = mfa.start_login(user, request.user_agent.string or f"{provider} login", "oauth")
        return redirect(f"/login-mfa#mfa_token={token}", 302)
    device, login = request.user_agent.string or f"{provider} login", {"method": "oauth", "provider": provider}
    issued = sessions.start_session(user["id"], device, request.remote_addr, login)
    access_token = tokens.issue_access_token(user["id"], user["role"], int(user["token_version"]), issued.session_id)
    # A Strict cookie set during a cross-site redirect chain is not sent within that chain, so land
    # through a page of our own that moves on to `next` as a fresh, same-site navigation.
    response = redirect(url_for(".landing", next=state_data.get("next", "/")), 302)
    settings = current_app.config["SETTINGS"]
    cookies.set_token_cookies(
        response, access_token, settings.access_token_ttl, issued.refresh_token, settings.refresh_token_ttl
    )
    return response


@bp.get("/landing")
@operation(
    "After an OAuth login: a same-site page that moves on to `next`",
    tags=["oauth"],
    query=NextPage,
    responses={200: ("text/html", "A page that moves on")},
)
def landing():
    """A same-site page that moves on to `next`, so the new Strict cookies are sent."""
    target = html.escape(safe_next(validated_query(NextPage).next), quote=True)
    page = (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        f'<meta http-equiv="refresh" content="0; url={target}"><title>Signed in</title></head>'
        f'<body><p>Signed in. <a href="{target}">Continue</a></p></body></html>'
    )
    response = Response(page, mimetype="text/html")
    response.headers["Cache-Control"] = "no-store"
    return response


def _identity(provider: str, client, token: dict) -> Identity:
    """Who the provider says this is: verified ID-token claims for OpenID, the API for GitHub."""
    from authlib.integrations.base_client import OAuthError

    if "userinfo" in token:  # OpenID: Authlib checked signature (JWKS), issuer, audience, nonce, expiry
        claims = dict(token["userinfo"])
        if "email" not in claims:  # providers may keep scope claims for the userinfo endpoint only
            extra = client.userinfo(token=token)
            if str(extra.get("sub")) != str(claims["sub"]):
                raise OAuthError(error="userinfo_subject_mismatch")
            claims.update({k: extra[k] for k in ("email", "email_verified") if k in extra})
        return Identity(str(claims["sub"]), claims.get("email"), claims.get("email_verified") is True)
    if provider == "github":
        profile = client.get("user", token=token).json()
        emails = client.get("user/emails", token=token).json()
        primary = next((e for e in emails if e.get("primary")), None) or {}
        return Identity(str(profile["id"]), primary.get("email"), primary.get("verified") is True)
    claims = client.userinfo(token=token)
    return Identity(str(claims["sub"]), claims.get("email"), claims.get("email_verified") is True)


def find_or_create_user(provider: str, identity: Identity) -> dict:
    """By (provider, subject); else link a local account by e-mail only if the provider verified it.

    A local account whose own address was never verified is taken over by the provider identity
    (`take_over`): whoever registered it first never proved the address, and keeps no way in.
    """
    client = get_redis()
    address = _plain_or_none(identity.email)
    identity_key = Keys.user_by_identity(provider, identity.subject)
    user_id = indexes.holder(client.get(identity_key))
    if user_id and (user := users.get_user(user_id)):
        same_address = address is not None and address == user["email"]
        if identity.email_verified and same_address and user.get("email_verified") != "1":
            details = {"method": "oauth", "provider": provider}
            entry = audit.new_entry("email.verified", subject=user_id, details=details)
            pipe = client.pipeline(transaction=True)
            pipe.hset(Keys.user(user_id), "email_verified", "1")
            audit.add_to_transaction(pipe, entry)
            pipe.execute()
            audit.complete(entry)
            user["email_verified"] = "1"
        return user
    if not identity.email:
        raise validation_failed("The provider did not share an e-mail address.")
    if address is None:
        # Never stored, linked by, or mailed: a header parser may read other mailboxes in it.
        raise validation_failed(f"The provider's e-mail address cannot be used: {emails.RULE}.")
    existing_id = users.find_user_id_by_email(address)
    if existing_id and users.get_user(existing_id) is not None:
        if not identity.email_verified:
            raise ApiError(
                409,
                "conflict",
                "An account with this e-mail exists, and the provider has not verified the address, so it cannot "
                "be linked. Log in with your password.",
            )
        _link(identity_key, existing_id, provider)
        return users.get_user(existing_id)
    # The account's address counts as verified only when the provider says it verified it.
    return users.create_user(address, None, identities=(identity_key,), email_verified=identity.email_verified)


def _plain_or_none(email: str | None) -> str | None:
    """A provider's address as stored, or None when it gave none or one that is not one plain address."""
    try:
        return emails.plain_address(email) if isinstance(email, str) else None
    except emails.NotPlainAddress:
        return None


def _link(identity_key: str, user_id: str, provider: str | None = None) -> None:
    """Link a provider identity that vouches for the address to an existing account, and verify it.

    Claim the index, then one step on the account (`take_over`), then commit the claim; 409 when
    another live account holds the identity already.
    """
    if indexes.claim(identity_key, user_id) is not None:
        # Another account holds this identity (it was linked meanwhile): logging in to this one without
        # linking it, or taking it over, would leave whoever registered it first their way in.
        raise ApiError(409, "conflict", "This provider account is linked to another account; try logging in again.")
    released = take_over(user_id, identity_key, provider)
    for key in released:
        indexes.release(key, user_id)
    indexes.commit(identity_key, user_id)


# KEYS: 1 user, 2 the user's session set, 3 its identities, 4 its passkeys, then ARGV[3] further keys of
# the user to delete (recovery codes, mailed tokens, a passkey registration under way), then the listing
# of every session (SESSIONS_LUA), then the email.verified audit entry's (AUDIT_LUA). ARGV: now, the
# identity key, that count, the listing, the entry's. Links the identity and marks the address verified.
# When the address was not verified before, whoever registered the account never proved it, so every way
# in they may hold goes in the same step, recorded: password, TOTP, recovery codes, passkeys (and the
# user handle they were made for), mailed tokens, other identities, every session with its refresh-token
# records, and tokenVersion + 1 (old access tokens, pending MFA logins, device credentials).
# {taken over (0|1), {released identity keys}, {ended session ids}, {deleted passkeys' credential ids}},
# nil for an unknown user, or 'stale'.
TAKE_OVER_LUA = (
    END_SESSION_FUNCTION_LUA
    + AUDIT_LUA
    + """
if redis.call('EXISTS', KEYS[1]) == 0 then return false end
if redis.call('HGET', KEYS[1], 'email_verified') == '1' then
  redis.call('SADD', KEYS[3], ARGV[2])
  return {0, {}, {}, {}}
end
local n = tonumber(ARGV[3])
local sessions = listed_sessions(5 + n, 4)
if not still_current(sessions, KEYS[2], nil, true) then return 'stale' end
local released = {}
for _, key in ipairs(redis.call('SMEMBERS', KEYS[3])) do
  if key ~= ARGV[2] then table.insert(released, key) end
end
redis.call('DEL', KEYS[3])
redis.call('SADD', KEYS[3], ARGV[2])
local passkeys = redis.call('HKEYS', KEYS[4])
redis.call('DEL', KEYS[4])
for i = 5, 4 + n do redis.call('DEL', KEYS[i]) end
redis.call('HSET', KEYS[1], 'password_hash', '', 'email_verified', '1')
redis.call('HDEL', KEYS[1], """
    + mfa.MFA_FIELDS_LUA
    + """, 'passkey_handle')
redis.call('HINCRBY', KEYS[1], 'token_version', 1)
record_audit()
return {1, released, end_sessions(sessions, KEYS[2], ARGV[1], true), passkeys}
"""
)


def take_over(user_id: str, identity_key: str, provider: str | None = None) -> list[str]:
    """Link `identity_key` to the account and verify its address, taking the account over when the
    address was unverified; the index keys (identities, passkeys) the account no longer holds (to release)."""
    client = get_redis()
    details = {"method": "oauth", "provider": provider, "account_taken_over": True}
    entry = audit.new_entry("email.verified", subject=user_id, details=details)
    extra = [
        Keys.user_recovery_codes(user_id),
        Keys.passkey_registration(user_id),
        *(Keys.user_mail_token(user_id, purpose) for purpose in (mailtokens.VERIFY, mailtokens.RESET)),
    ]
    script = get_script(TAKE_OVER_LUA)
    result = sessions.run_listed(
        lambda listing, args: script(
            keys=[
                Keys.user(user_id),
                Keys.user_sessions(user_id),
                Keys.user_identities(user_id),
                Keys.user_passkeys(user_id),
                *extra,
                *listing,
                *audit.script_keys(entry),
            ],
            args=[f"{time.time():.3f}", identity_key, len(extra), *args, *audit.script_args(entry)],
        ),
        user_id,
        lambda: sorted(client.smembers(Keys.user_sessions(user_id))),
        purge=True,
    )
    if not result or not result[0]:
        return []
    audit.complete(entry)
    _, released, ended, passkeys = result
    sessions.sessions_ended.send(
        current_app._get_current_object(), user_id=user_id, session_ids=list(ended), whole_user=True
    )
    return [*released, *(Keys.user_by_passkey(credential_id) for credential_id in passkeys)]
