"""The OpenID provider's clients: checked, stored in one Redis hash (client id -> JSON), read, changed, deleted.

A client's secret is random (256 bits), shown once (at creation and at each rotation) and stored only as its
SHA-256, compared in constant time. `OAuthClient` is the client model Authlib's authorization server uses
(`ClientMixin`): redirect URIs match as exact strings, confidential clients authenticate with their secret
(HTTP Basic or the form), public ones with their id alone.

Every change is one step on one key (a compare-and-set of the client's record), so a PATCH and a rotation
that race never lose each other's change, and a deleted client is gone for every reader at once:
`get_client` answers None from then on, so whatever looks the client up (every token request and every
verification of its tokens) fails. `client_deleted` tells the sessions' code to end what was issued to it.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import secrets
import time
from dataclasses import asdict, dataclass, field, replace

import gevent
from authlib.oauth2.rfc6749 import ClientMixin
from authlib.oauth2.rfc6749.util import list_to_scope, scope_to_list
from blinker import Namespace
from flask import current_app

from .. import audit
from ..errors import ApiError, validation_failed
from ..http import has_control_characters, rfc3339
from ..outgoing.ssrf import URL_LIMIT, TargetRefused, check_url, parse_url
from ..redis import Keys, get_redis, get_script

_signals = Namespace()
#: Sent with `client_id` and `client` (the deleted client as it was) after a client is deleted, so that
#: every session and token issued to it ends.
client_deleted = _signals.signal("oauth-client-deleted")

CLIENT_ID_PREFIX, SECRET_PREFIX = "cl_", "cs_"
CLIENT_ID_PATTERN = r"cl_[0-9a-f]{32}"  # 128 random bits
CLIENT_ID = re.compile(CLIENT_ID_PATTERN)
TYPES = ("confidential", "public")
GRANT_TYPES = ("authorization_code", "refresh_token", "client_credentials")
DEFAULT_GRANT_TYPES = ("authorization_code", "refresh_token")
SCOPES = ("openid", "email", "profile", "offline_access", "events", "orgs")
DEFAULT_SCOPES = ("openid",)
# How each type proves itself at the token, revocation and introspection endpoints.
AUTH_METHODS = {"confidential": ("client_secret_basic", "client_secret_post"), "public": ("none",)}
RESPONSE_TYPES = ("code",)
NAME_LIMIT, URIS_LIMIT = 100, 20
LOOPBACK_HOSTS = ("127.0.0.1", "::1", "localhost")
# A private-use URI scheme in reverse-domain form (RFC 8252, 7.1): at least one dot, so that no scheme a
# browser or the system gives a meaning (javascript:, data:, file:, intent:...) is one.
PRIVATE_USE_SCHEME = re.compile(r"[a-z][a-z0-9+-]*(\.[a-z0-9+-]+)+")
URI_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*")
RESOLVE_TIMEOUT = 5.0  # for checking a backchannel_logout_uri's host when it is saved
UPDATE_ATTEMPTS = 10  # compare-and-set rounds before giving up on a record others keep changing

# KEYS[1] the clients hash. ARGV: the client id, its record as read, the new record. Writes the new record only
# if the stored one is still the one read (1), else nothing (0): a change made meanwhile is never overwritten,
# and a deleted client is never written back.
REPLACE_CLIENT = """
if redis.call('HGET', KEYS[1], ARGV[1]) ~= ARGV[2] then return 0 end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[3])
return 1
"""


@dataclass(frozen=True)
class OAuthClient(ClientMixin):
    """A registered client (`C`), and the client model of Authlib's authorization server."""

    client_id: str
    name: str
    type: str
    redirect_uris: tuple[str, ...]
    grant_types: tuple[str, ...] = DEFAULT_GRANT_TYPES
    scopes: tuple[str, ...] = DEFAULT_SCOPES
    post_logout_redirect_uris: tuple[str, ...] = ()
    backchannel_logout_uri: str | None = None
    first_party: bool = False
    audience: str = ""
    created_at: float = 0.0
    secret_hash: str | None = field(default=None, repr=False)  # never answered, never in a repr or a log

    @property
    def is_public(self) -> bool:
        """A public client (a mobile or browser app) holds no secret."""
        return self.type == "public"

    def answer(self) -> dict:
        """`C`: the client as answers show it (never its secret or its hash)."""
        return {
            "client_id": self.client_id,
            "name": self.name,
            "type": self.type,
            "redirect_uris": list(self.redirect_uris),
            "grant_types": list(self.grant_types),
            "scopes": list(self.scopes),
            "post_logout_redirect_uris": list(self.post_logout_redirect_uris),
            "backchannel_logout_uri": self.backchannel_logout_uri,
            "first_party": self.first_party,
            "audience": self.audience,
            "created_at": rfc3339(self.created_at),
        }

    def stored(self) -> str:
        """The record as the clients hash keeps it."""
        record = asdict(self)
        del record["client_id"]
        return json.dumps(record, separators=(",", ":"))

    # Authlib's ClientMixin.

    @property
    def client_metadata(self) -> dict:
        """Registration metadata Authlib's endpoints consult: none is kept (userinfo answers plain JSON)."""
        return {}

    def get_client_id(self) -> str:
        """The client's id."""
        return self.client_id

    def get_default_redirect_uri(self) -> str | None:
        """The redirect URI when the request names none: only a client with exactly one has a default."""
        return self.redirect_uris[0] if len(self.redirect_uris) == 1 else None

    def get_allowed_scope(self, scope: str | None) -> str:
        """The requested scopes this client may have, in the order asked (none asked: none given)."""
        if not scope:
            return ""
        return list_to_scope([name for name in dict.fromkeys(scope_to_list(scope)) if name in self.scopes])

    def check_redirect_uri(self, redirect_uri: str) -> bool:
        """Whether `redirect_uri` is one registered, as an exact string."""
        return redirect_uri in self.redirect_uris

    def check_client_secret(self, client_secret: str) -> bool:
        """Whether `client_secret` is this client's current secret (compared in constant time)."""
        if self.secret_hash is None or not isinstance(client_secret, str):
            return False
        return hmac.compare_digest(hash_secret(client_secret), self.secret_hash)

    def check_endpoint_auth_method(self, method: str, endpoint: str) -> bool:
        """Confidential clients authenticate by their secret (Basic or form); public ones by their id alone."""
        return method in AUTH_METHODS[self.type]

    def check_response_type(self, response_type: str) -> bool:
        """The authorization code flow only, for a client registered for it."""
        return response_type in RESPONSE_TYPES and "authorization_code" in self.grant_types

    def check_grant_type(self, grant_type: str) -> bool:
        """Whether the client is registered for this grant type."""
        return grant_type in self.grant_types


def hash_secret(secret: str) -> str:
    """The SHA-256 under which a client secret is stored (the secret itself never is)."""
    return hashlib.sha256(secret.encode("utf-8", "surrogatepass")).hexdigest()


def new_secret() -> str:
    """A client secret: 256 random bits."""
    return SECRET_PREFIX + secrets.token_urlsafe(32)


def parse_client(client_id: str, stored: str | None) -> OAuthClient | None:
    """A client as its record is stored (None when nothing is)."""
    if not stored:
        return None
    record = json.loads(stored)
    lists = ("redirect_uris", "grant_types", "scopes", "post_logout_redirect_uris")
    return OAuthClient(client_id=client_id, **{**record, **{name: tuple(record[name]) for name in lists}})


# ---- The rules a client must follow ----


def check_client(client: OAuthClient) -> OAuthClient:
    """The client with its lists in order and without repeats, or 422 naming what is wrong (the address of
    its backchannel_logout_uri is checked apart: that needs the network)."""
    name = client.name.strip()
    if not 1 <= len(name) <= NAME_LIMIT or has_control_characters(name):
        raise validation_failed(f"name: 1 to {NAME_LIMIT} characters, without control characters.")
    if client.type not in TYPES:
        raise validation_failed("type: confidential or public.")
    grant_types = _chosen("grant_types", client.grant_types, GRANT_TYPES)
    if "client_credentials" in grant_types and client.is_public:
        raise validation_failed("grant_types: client_credentials is for confidential clients only (it needs a secret).")
    scopes = _chosen("scopes", client.scopes, SCOPES)
    redirect_uris = _uris("redirect_uris", client.redirect_uris, client.is_public)
    if not redirect_uris and "authorization_code" in grant_types:
        raise validation_failed("redirect_uris: at least one (the authorization code flow redirects to one).")
    logout_uris = _uris("post_logout_redirect_uris", client.post_logout_redirect_uris, client.is_public)
    audience = client.audience or client.client_id
    if len(audience) > URL_LIMIT or has_control_characters(audience):
        raise validation_failed(f"audience: at most {URL_LIMIT} characters, without control characters.")
    return replace(
        client,
        name=name,
        grant_types=grant_types,
        scopes=scopes,
        redirect_uris=redirect_uris,
        post_logout_redirect_uris=logout_uris,
        audience=audience,
    )


def _chosen(what: str, given, choices: tuple[str, ...]) -> tuple[str, ...]:
    """At least one of `choices`, none other, in the choices' order."""
    unknown = [value for value in given if value not in choices]
    if not given or unknown:
        raise validation_failed(f"{what}: one or more of {', '.join(choices)}.")
    return tuple(choice for choice in choices if choice in given)


def _uris(what: str, given, public: bool) -> tuple[str, ...]:
    """Redirect URIs, each checked, without repeats (in the order given)."""
    uris = tuple(dict.fromkeys(given))
    if len(uris) > URIS_LIMIT:
        raise validation_failed(f"{what}: at most {URIS_LIMIT}.")
    for uri in uris:
        check_redirect_uri(uri, public, what)
    return uris


def check_redirect_uri(uri: str, public: bool, what: str = "redirect_uris") -> str:
    """A URI the provider may send a browser to, or 422: https://, http:// on a loopback host, or (public
    clients only, i.e. native apps) a private-use scheme such as com.example.app:/cb; never a fragment.

    It is matched later as an exact string, so nothing here is normalised: what is checked is what is kept.
    """
    if not isinstance(uri, str) or not 0 < len(uri) <= URL_LIMIT:
        raise validation_failed(f"{what}: each a URI of 1 to {URL_LIMIT} characters.")
    if any(ord(char) < 33 or ord(char) == 127 for char in uri) or has_control_characters(uri):
        raise validation_failed(f"{what}: {uri!r} holds a space or a control character.")
    if "#" in uri:
        raise validation_failed(f"{what}: {uri!r} has a fragment (#...), which a redirect URI must not have.")
    scheme, colon, rest = uri.partition(":")
    if not colon or not URI_SCHEME.fullmatch(scheme):
        raise validation_failed(f"{what}: {uri!r} is not an absolute URI.")
    scheme = scheme.lower()
    if scheme in ("https", "http"):
        try:
            target = parse_url(uri, allow_http=True)
        except TargetRefused as refusal:
            raise validation_failed(f"{what}: {uri!r}: {refusal}") from None
        if scheme == "http" and target.host not in LOOPBACK_HOSTS:
            raise validation_failed(
                f"{what}: {uri!r}: http:// only on a loopback host (127.0.0.1, [::1], localhost); else https://."
            )
        return uri
    if PRIVATE_USE_SCHEME.fullmatch(scheme):
        if not public:
            raise validation_failed(
                f"{what}: {uri!r}: a private-use scheme is for public clients (native apps) only; "
                "a confidential client redirects to https:// (or http:// on a loopback host)."
            )
        if not rest.strip("/"):
            raise validation_failed(f"{what}: {uri!r} has no path after its scheme (e.g. com.example.app:/cb).")
        return uri
    raise validation_failed(
        f"{what}: {uri!r}: must be https://, http:// on a loopback host, or (public clients) a private-use "
        "scheme in reverse-domain form such as com.example.app:/cb."
    )


def check_backchannel_uri(uri: str) -> str:
    """422 unless outgoing webhooks could be sent to the URI (https, public addresses, unless the settings
    allow http or private ones), judged on what its host resolves to now."""
    settings = current_app.config["SETTINGS"].outgoing_webhooks
    if not isinstance(uri, str) or has_control_characters(uri):
        raise validation_failed("backchannel_logout_uri: an https URL, without control characters.")
    try:
        with gevent.Timeout(RESOLVE_TIMEOUT, TargetRefused("The URL's host could not be resolved in time.")):
            check_url(uri, settings.allow_http, settings.allow_private)
    except TargetRefused as refusal:
        raise validation_failed(f"backchannel_logout_uri: {refusal}") from None
    return uri


# ---- The store ----


def get_client(client_id: str) -> OAuthClient | None:
    """The client with this id, or None (an id of another shape, or a deleted client, is none)."""
    return _read(client_id)[0]


def _read(client_id: str) -> tuple[OAuthClient | None, str | None]:
    """The client with this id and its record as stored (None, None when there is none)."""
    if not isinstance(client_id, str) or not CLIENT_ID.fullmatch(client_id):
        return None, None
    stored = get_redis().hget(Keys.oauth_clients(), client_id)
    return parse_client(client_id, stored), stored


def list_clients() -> list[OAuthClient]:
    """Every client, oldest first."""
    stored = get_redis().hgetall(Keys.oauth_clients())
    clients = (parse_client(client_id, record) for client_id, record in stored.items())
    return sorted(clients, key=lambda client: (client.created_at, client.client_id))


def create_client(asked: OAuthClient) -> tuple[OAuthClient, str | None]:
    """Register a client (its id made here); it, and its secret (confidential clients), shown this once."""
    client_id = CLIENT_ID_PREFIX + secrets.token_hex(16)
    client = check_client(replace(asked, client_id=client_id, created_at=round(time.time(), 3), secret_hash=None))
    if client.backchannel_logout_uri is not None:
        check_backchannel_uri(client.backchannel_logout_uri)
    secret = None if client.is_public else new_secret()
    client = replace(client, secret_hash=hash_secret(secret) if secret else None)
    if not get_redis().hsetnx(Keys.oauth_clients(), client_id, client.stored()):
        raise ApiError(409, "conflict", "A client with this id exists; try again.")  # 128 random bits: never
    _record("oauth_client.created", client)
    return client, secret


def update_client(client_id: str, changes: dict) -> OAuthClient | None:
    """Change some of a client's settings (`changes` maps field names to new values, checked as at creation);
    the client as it is now, or None when there is no such client."""
    for _ in range(UPDATE_ATTEMPTS):
        current, stored = _read(client_id)
        if current is None:
            return None
        if "type" in changes and changes["type"] != current.type:
            raise validation_failed("type: a client's type cannot change; register a new client instead.")
        wanted = {name: value for name, value in changes.items() if name != "type"}
        if "audience" in wanted and wanted["audience"] is None:
            wanted["audience"] = client_id  # null: back to the default
        updated = check_client(replace(current, **wanted))
        changed = sorted(name for name in wanted if getattr(updated, name) != getattr(current, name))
        if "backchannel_logout_uri" in changed and updated.backchannel_logout_uri is not None:
            check_backchannel_uri(updated.backchannel_logout_uri)
        if not changed:
            return current
        if _replace(client_id, stored, updated):
            _record("oauth_client.updated", updated, changed=changed)
            return updated
    raise ApiError(409, "conflict", "The client kept changing meanwhile; try again.")


def rotate_secret(client_id: str) -> str | None:
    """A new secret for a confidential client: the old one stops working at once. None: no such client."""
    for _ in range(UPDATE_ATTEMPTS):
        current, stored = _read(client_id)
        if current is None:
            return None
        if current.is_public:
            raise ApiError(409, "conflict", "A public client has no secret to rotate.")
        secret = new_secret()
        if _replace(client_id, stored, replace(current, secret_hash=hash_secret(secret))):
            _record("oauth_client.updated", current, changed=["secret"])
            return secret
    raise ApiError(409, "conflict", "The client kept changing meanwhile; try again.")


def delete_client(client_id: str) -> bool:
    """Delete a client: it is unknown at once everywhere, and `client_deleted` ends what was issued to it.
    False when there was none."""
    client = get_client(client_id)
    if client is None or get_redis().hdel(Keys.oauth_clients(), client_id) != 1:
        return False
    _record("oauth_client.deleted", client)
    client_deleted.send(current_app._get_current_object(), client_id=client_id, client=client)
    return True


def _replace(client_id: str, stored: str, updated: OAuthClient) -> bool:
    """Write `updated` if the client's record is still `stored`, the one read (a compare-and-set on one key)."""
    replace_client = get_script(REPLACE_CLIENT)
    return replace_client(keys=[Keys.oauth_clients()], args=[client_id, stored, updated.stored()]) == 1


def _record(entry_type: str, client: OAuthClient, **details) -> None:
    """A client change's audit entry: which client, never its secret."""
    audit.record(
        entry_type, details={"client_id": client.client_id, "name": client.name, "type": client.type, **details}
    )
