"""Passkeys (WebAuthn, on py_webauthn): the registration and login ceremonies, and where passkeys are kept.

Ceremonies. Options carry a fresh 32-byte challenge that the server keeps for five minutes and takes
back (GETDEL) at the first answer, before reading the rest of it, so every answer, accepted or refused,
uses it up: a registration's is kept under the user, a login's under the SHA-256 of its `login_id`.
Login options come before anyone says who they are, and never say whether an address has passkeys:
`allowCredentials` is always empty, so only discoverable credentials are used and the authenticator
names the account by its user handle. py_webauthn checks each response (type, challenge, origin against
WEBAUTHN_ORIGINS, RP ID hash against WEBAUTHN_RP_ID, user presence and verification, the signature
against the stored public key, the signature counter); nothing here parses CBOR or checks a signature by
hand.

Storage. A user's passkeys are one hash under the user's hash tag (credential id -> the record as JSON:
name, COSE public key, counter, transports, backup flags, times), so deleting the user or taking the
account over removes them in the same step as the rest. A global index credential id -> user id
(`indexes`: claim, write, commit) keeps a credential id to one account and finds its account at login.
The user handle (`user.id` in the options) is 32 random bytes written once into the user record: it
names the account to the authenticator and says nothing about it.

Counter. A login checks the counter twice: py_webauthn against the value read, then one Lua step that
compares and sets it on the stored record, so two logins with the same counter value (a cloned
authenticator, or one assertion sent twice under two login ids) cannot both pass. An authenticator that
does not count (always 0) is allowed; one that counted and then answers 0 or less is refused.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import NamedTuple
from urllib.parse import urlsplit

from flask import current_app, request

from .. import audit, mail
from ..errors import ApiError, bad_request, not_found, unauthorized, validation_failed
from ..http import has_control_characters, json_body, rfc3339
from ..mail.messages import PASSKEY_ADDED
from ..redis import AUDIT_LUA, Keys, get_redis, get_script
from ..settings import is_rp_id
from . import indexes, users
from .guards import own_origin

log = logging.getLogger(__name__)

CHALLENGE_SECONDS = 5 * 60
CHALLENGE_BYTES = 32
USER_HANDLE_BYTES = 32
NAME_MAX = 64
MAX_PASSKEYS = 20
CREDENTIAL_ID_MAX = 1023  # bytes: WebAuthn's bound on a credential id
CREDENTIAL_ID_TEXT_MAX = 1364  # the same as base64url without padding
LOGIN_ID_MAX = 200  # an issued one has 43 characters
# A login asked for with an e-mail keeps its account beside the challenge (base64url has no ':'); an
# address no account has keeps NO_ACCOUNT, which no credential's owner is.
ACCOUNT_SEPARATOR = ":"
NO_ACCOUNT = "none"
BASE64URL = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")

# py_webauthn is imported by the functions that run a ceremony, not with this module: any `webauthn` import
# loads every attestation format (about 100 ms per process), and most processes never see a passkey.


def _refused() -> tuple[type[Exception], ...]:
    """What py_webauthn raises for a response it refuses, or for bytes it cannot decode on the way (CBOR,
    base64, a key or signature of the wrong shape: ValueError and its subclasses)."""
    from webauthn.helpers.exceptions import WebAuthnException

    return (WebAuthnException, ValueError)


def verify_authentication_response(**arguments):
    """py_webauthn's check of a login's assertion (its verified counter and backup state)."""
    from webauthn import verify_authentication_response as verify

    return verify(**arguments)


def _algorithms() -> list:
    """The signature algorithms a new passkey may use: ES256 and RS256."""
    from webauthn.helpers.cose import COSEAlgorithmIdentifier

    return [COSEAlgorithmIdentifier.ECDSA_SHA_256, COSEAlgorithmIdentifier.RSASSA_PKCS1_v1_5_SHA_256]


def invalid_credentials() -> ApiError:
    """401 invalid_credentials: the one answer to every refused passkey login, whatever the reason."""
    return unauthorized("The passkey was not accepted. Try again, or log in another way.", "invalid_credentials")


def _conflict() -> ApiError:
    return ApiError(409, "conflict", "This passkey is registered already.")


def relying_party() -> tuple[str, list[str]]:
    """(RP ID, accepted origins): WEBAUTHN_RP_ID and WEBAUTHN_ORIGINS, else (not in production) this request's
    host and origin.

    400 when the RP ID would come from a request whose Host is no host name (a browser never sends one); 404 in
    production when the configuration names no RP ID (PUBLIC_BASE_URL an IP address and WEBAUTHN_RP_ID unset).
    """
    settings = current_app.config["SETTINGS"]
    configured = settings.webauthn
    if settings.production:  # never the request's: its Host is the client's to choose, a forged one included
        if configured.rp_id is None or not configured.origins:
            raise not_found("Passkeys are not available: this service has no domain name to bind them to.")
        return configured.rp_id, list(configured.origins)
    rp_id = configured.rp_id or _request_host()
    if rp_id is None:
        raise bad_request("The Host header names no host that passkeys could be bound to.")
    return rp_id, list(configured.origins) or [own_origin()]


def _request_host() -> str | None:
    try:
        host = urlsplit(f"//{request.host}").hostname
    except ValueError:  # an unclosed IPv6 bracket
        return None
    return host if host and is_rp_id(host) else None


def login_challenge_key(login_id: str) -> str:
    """Where a login's challenge waits for its answer (under the login_id's SHA-256)."""
    return Keys.passkey_login(hashlib.sha256(login_id.encode()).hexdigest())


def is_credential_id(value: object) -> bool:
    """Whether `value` has the shape of a credential id (base64url text within WebAuthn's bound)."""
    return isinstance(value, str) and 0 < len(value) <= CREDENTIAL_ID_TEXT_MAX and set(value) <= BASE64URL


def find_owner(credential_id: str) -> str | None:
    """The id of the user who registered this credential id, if anyone did (the record may be missing)."""
    if not is_credential_id(credential_id):
        return None
    return indexes.holder(get_redis().get(Keys.user_by_passkey(credential_id)))


# Records: JSON in the user's passkeys hash. Times are epoch seconds as text, `last_used_at` "" until used.


def _records(user_id: str) -> list[dict]:
    stored = get_redis().hgetall(Keys.user_passkeys(user_id))
    return sorted((json.loads(raw) for raw in stored.values()), key=lambda record: float(record["created_at"]))


def _record(user_id: str, credential_id: str) -> dict | None:
    raw = get_redis().hget(Keys.user_passkeys(user_id), credential_id) if is_credential_id(credential_id) else None
    return json.loads(raw) if raw else None


def _transports(record: dict) -> list:
    from webauthn.helpers.structs import AuthenticatorTransport

    # Redis's Lua writes an empty list back as {}: anything but a list of known names counts as none.
    named = record.get("transports") or []
    known = {transport.value for transport in AuthenticatorTransport}
    return [AuthenticatorTransport(name) for name in named if name in known] if isinstance(named, list) else []


def public_passkey(record: dict) -> dict:
    """`P` in docs/api.md: what answers show of a passkey (never its key)."""
    return {
        "id": record["id"],
        "name": record["name"],
        "created_at": rfc3339(record["created_at"]),
        "last_used_at": rfc3339(record.get("last_used_at") or None),
    }


def list_passkeys(user_id: str) -> list[dict]:
    """The user's passkeys, oldest first (`P`)."""
    return [public_passkey(record) for record in _records(user_id)]


def _parsed(parse: Callable, credential: dict):
    """py_webauthn's structure of a credential's JSON; 400 when it is not one (missing fields, bad base64)."""
    try:
        return parse(credential)
    except _refused():
        raise bad_request("Field 'credential' is not a WebAuthn credential in its JSON form.") from None


# Registration.

# KEYS: 1 user, 2 the registration challenge. ARGV: a new user handle (kept only if the user has none),
# the challenge (`<session id> <challenge>`: it answers that session only), its lifetime. The user's
# handle, or nil for a user who is gone (nothing written then).
START_REGISTRATION_LUA = """
if redis.call('EXISTS', KEYS[1]) == 0 then return false end
redis.call('HSETNX', KEYS[1], 'passkey_handle', ARGV[1])
redis.call('SET', KEYS[2], ARGV[2], 'EX', tonumber(ARGV[3]))
return redis.call('HGET', KEYS[1], 'passkey_handle')
"""


def registration_options(user: dict, session_id: str) -> dict:
    """PublicKeyCredentialCreationOptionsJSON for a new passkey of `user` (`U`); its challenge is kept for
    the session that asked (the one that proved a recent authentication)."""
    from webauthn import generate_registration_options
    from webauthn.helpers import base64url_to_bytes, bytes_to_base64url, options_to_json_dict
    from webauthn.helpers.structs import (
        AttestationConveyancePreference,
        AuthenticatorSelectionCriteria,
        PublicKeyCredentialDescriptor,
        ResidentKeyRequirement,
        UserVerificationRequirement,
    )

    rp_id, _ = relying_party()
    challenge = secrets.token_bytes(CHALLENGE_BYTES)
    handle = get_script(START_REGISTRATION_LUA)(
        keys=[Keys.user(user["id"]), Keys.passkey_registration(user["id"])],
        args=[
            bytes_to_base64url(secrets.token_bytes(USER_HANDLE_BYTES)),
            f"{session_id} {bytes_to_base64url(challenge)}",
            CHALLENGE_SECONDS,
        ],
    )
    if handle is None:
        raise unauthorized("The session has ended; log in again.")
    options = generate_registration_options(
        rp_id=rp_id,
        rp_name=current_app.config["SETTINGS"].webauthn.rp_name,
        user_name=user["email"],
        user_id=base64url_to_bytes(handle),
        user_display_name=user["email"],
        challenge=challenge,
        timeout=CHALLENGE_SECONDS * 1000,
        attestation=AttestationConveyancePreference.NONE,
        authenticator_selection=AuthenticatorSelectionCriteria(
            resident_key=ResidentKeyRequirement.REQUIRED,
            user_verification=UserVerificationRequirement.REQUIRED,
        ),
        exclude_credentials=[
            PublicKeyCredentialDescriptor(id=base64url_to_bytes(record["id"]), transports=_transports(record) or None)
            for record in _records(user["id"])
        ],
        supported_pub_key_algs=_algorithms(),
    )
    return options_to_json_dict(options)


def default_name() -> str:
    """The name of a passkey registered without one: `Passkey 2025-01-31`."""
    return f"Passkey {datetime.now(UTC).date().isoformat()}"


def validate_name(name: str) -> str:
    """A passkey's name, stripped: 1-64 characters without control characters (422 otherwise)."""
    name = name.strip()
    if not 1 <= len(name) <= NAME_MAX or has_control_characters(name):
        raise validation_failed(f"A passkey's name must have 1 to {NAME_MAX} characters, without control characters.")
    return name


# KEYS: 1 user, 2 the user's passkeys, 3 the caller's session, 4 the passkey.added audit entry's
# (AUDIT_LUA). ARGV: credential id, record, most passkeys allowed, the caller's tokenVersion, then the
# entry's. ok (added and recorded) | exists | full | gone (the session ended or the account was taken
# over or logged out everywhere since the request was authenticated: nothing is written).
ADD_LUA = (
    AUDIT_LUA
    + """
if redis.call('EXISTS', KEYS[3]) == 0 or redis.call('HGET', KEYS[1], 'token_version') ~= ARGV[4] then
  return 'gone'
end
if redis.call('HEXISTS', KEYS[2], ARGV[1]) == 1 then return 'exists' end
if redis.call('HLEN', KEYS[2]) >= tonumber(ARGV[3]) then return 'full' end
redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
record_audit()
return 'ok'
"""
)


# KEYS[1] the registration challenge. ARGV: the answering session. The challenge, taken (so used up), when
# that session asked for it; nil otherwise (another session's stays for its own answer).
TAKE_REGISTRATION_LUA = """
local kept = redis.call('GET', KEYS[1])
if not kept or string.sub(kept, 1, #ARGV[1] + 1) ~= ARGV[1] .. ' ' then return false end
redis.call('DEL', KEYS[1])
return string.sub(kept, #ARGV[1] + 2)
"""


def take_registration_challenge(user_id: str, session_id: str) -> str | None:
    """The challenge of the user's last registration options, when this session asked for them, taken (so
    used up) for the answer at hand."""
    return get_script(TAKE_REGISTRATION_LUA)(keys=[Keys.passkey_registration(user_id)], args=[session_id])


def register(caller, challenge: str | None, credential: dict, name: str | None) -> dict:
    """Verify a RegistrationResponseJSON against `challenge` (taken from the caller's last options) and keep
    the passkey (`P`).

    400 for a malformed credential, 422 for a refused one (no options under way, used or expired
    challenge, wrong origin or RP ID, no user verification, an algorithm other than ES256 or RS256),
    409 when the credential id is registered already (to anyone).
    """
    from webauthn import verify_registration_response
    from webauthn.helpers import base64url_to_bytes, bytes_to_base64url, parse_registration_credential_json
    from webauthn.helpers.structs import CredentialDeviceType

    user_id = caller.user_id
    parsed = _parsed(parse_registration_credential_json, credential)
    name = validate_name(name) if name is not None else default_name()
    if challenge is None:
        raise validation_failed("No passkey registration is under way (used, or older than five minutes): start again.")
    rp_id, origins = relying_party()
    try:
        verified = verify_registration_response(
            credential=parsed,
            expected_challenge=base64url_to_bytes(challenge),
            expected_rp_id=rp_id,
            expected_origin=origins,
            require_user_verification=True,
            supported_pub_key_algs=_algorithms(),
        )
    except _refused() as refusal:
        log.info("passkey registration refused for user %s: %s", user_id, refusal)
        raise validation_failed(
            "The passkey was not accepted: it was made for another site or challenge, or without verifying you."
        ) from None
    if len(verified.credential_id) > CREDENTIAL_ID_MAX:
        raise validation_failed(f"A passkey's credential id has at most {CREDENTIAL_ID_MAX} bytes.")
    now = f"{time.time():.3f}"
    record = {
        "id": bytes_to_base64url(verified.credential_id),
        "name": name,
        "public_key": bytes_to_base64url(verified.credential_public_key),
        "sign_count": verified.sign_count,
        "transports": [transport.value for transport in parsed.response.transports or []],
        "aaguid": verified.aaguid,
        "backup_eligible": verified.credential_device_type == CredentialDeviceType.MULTI_DEVICE,
        "backed_up": verified.credential_backed_up,
        "created_at": now,
        "last_used_at": "",
    }
    _store(caller, record)
    mail.queue_mail(PASSKEY_ADDED, user_id=caller.user_id)  # a passkey outlives a password reset: say so
    return public_passkey(record)


def _store(caller, record: dict) -> None:
    """Claim the credential id's index, write the record, commit the claim (see indexes.py)."""
    user_id, credential_id = caller.user_id, record["id"]
    index = Keys.user_by_passkey(credential_id)
    if indexes.claim(index, user_id) is not None:
        raise _conflict()
    details = {"passkey_id": credential_id, "name": record["name"]}
    entry = audit.new_entry("passkey.added", subject=user_id, details=details)
    outcome = get_script(ADD_LUA)(
        keys=[
            Keys.user(user_id),
            Keys.user_passkeys(user_id),
            Keys.session(user_id, caller.session_id),
            *audit.script_keys(entry),
        ],
        args=[credential_id, json.dumps(record), MAX_PASSKEYS, caller.token_version, *audit.script_args(entry)],
    )
    if outcome == "exists":
        raise _conflict()  # the caller's own passkey: the index is that passkey's, and stays
    if outcome != "ok":
        indexes.release(index, user_id)
        if outcome == "full":
            raise validation_failed(f"An account has at most {MAX_PASSKEYS} passkeys: remove one first.")
        raise unauthorized("The session has ended; log in again.")
    if not indexes.commit(index, user_id):  # taken over, which happens only once this account is gone
        get_redis().hdel(Keys.user_passkeys(user_id), credential_id)
        raise _conflict()
    audit.complete(entry)


# KEYS[1] the user's passkeys. ARGV: credential id, new name. The record as JSON, or nil when unknown.
RENAME_LUA = """
local raw = redis.call('HGET', KEYS[1], ARGV[1])
if not raw then return false end
local record = cjson.decode(raw)
record.name = ARGV[2]
raw = cjson.encode(record)
redis.call('HSET', KEYS[1], ARGV[1], raw)
return raw
"""


def rename(user_id: str, credential_id: str, name: str) -> dict | None:
    """Rename one of the user's passkeys (`P`); None when the user has no such passkey."""
    if not is_credential_id(credential_id):
        return None
    raw = get_script(RENAME_LUA)(keys=[Keys.user_passkeys(user_id)], args=[credential_id, validate_name(name)])
    return public_passkey(json.loads(raw)) if raw else None


# KEYS[1] the user's passkeys, KEYS[2] the passkey.removed audit entry's (AUDIT_LUA). ARGV: credential id,
# then the entry's. 1 when the passkey was there (now deleted, and recorded), else 0.
REMOVE_LUA = (
    AUDIT_LUA
    + """
if redis.call('HDEL', KEYS[1], ARGV[1]) == 0 then return 0 end
record_audit()
return 1
"""
)


def remove(user_id: str, credential_id: str) -> bool:
    """Delete one of the user's passkeys and release its credential id; False when it has no such passkey."""
    if not is_credential_id(credential_id):
        return False
    entry = audit.new_entry("passkey.removed", subject=user_id, details={"passkey_id": credential_id})
    removed = get_script(REMOVE_LUA)(
        keys=[Keys.user_passkeys(user_id), *audit.script_keys(entry)], args=[credential_id, *audit.script_args(entry)]
    )
    if not removed:
        return False
    audit.complete(entry)
    indexes.release(Keys.user_by_passkey(credential_id), user_id)
    return True


# Login.


def login_options(email: str | None = None) -> dict:
    """PublicKeyCredentialRequestOptionsJSON and the login_id its answer must name; the challenge is kept.

    The same answer for every caller: `allowCredentials` stays empty. With an `email`, the login is for that
    account alone (kept beside the challenge): a credential of any other account, or any credential when no
    account has the address, is refused.
    """
    from webauthn import generate_authentication_options
    from webauthn.helpers import bytes_to_base64url, options_to_json_dict
    from webauthn.helpers.structs import UserVerificationRequirement

    rp_id, _ = relying_party()
    challenge = secrets.token_bytes(CHALLENGE_BYTES)
    login_id = secrets.token_urlsafe(32)
    kept = bytes_to_base64url(challenge)
    if email is not None:
        kept += ACCOUNT_SEPARATOR + (users.find_user_id_by_email(email) or NO_ACCOUNT)
    get_redis().set(login_challenge_key(login_id), kept, ex=CHALLENGE_SECONDS)
    options = generate_authentication_options(
        rp_id=rp_id,
        challenge=challenge,
        timeout=CHALLENGE_SECONDS * 1000,
        allow_credentials=[],
        user_verification=UserVerificationRequirement.REQUIRED,
    )
    return {"options": options_to_json_dict(options), "login_id": login_id}


class LoginChallenge(NamedTuple):
    """The challenge of one login's options, and the account the login is for (None: whoever answers)."""

    challenge: str
    account: str | None


@dataclass(frozen=True)
class Assertion:
    """A verified passkey login, not yet counted: `use` records it (and may still refuse it)."""

    user: dict  # the owner's stored record
    credential_id: str
    sign_count: int
    backed_up: bool


def take_login_challenge(login_id: object) -> LoginChallenge | None:
    """The challenge of the login options `login_id` names, taken (so used up) for the answer at hand.

    Anything else than a login_id (missing, of another type, too long) names none.
    """
    if not isinstance(login_id, str) or not 0 < len(login_id) <= LOGIN_ID_MAX:
        return None
    kept = get_redis().getdel(login_challenge_key(login_id))
    if kept is None:
        return None
    challenge, _, account = kept.partition(ACCOUNT_SEPARATOR)
    return LoginChallenge(challenge, account or None)


def verify_login(challenge: LoginChallenge | None, credential: dict, user_id: str | None = None) -> Assertion:
    """Check an AuthenticationResponseJSON against `challenge` (taken from the login's options).

    400 for a malformed credential; 401 invalid_credentials for every refusal: no challenge (unknown,
    used or expired login_id), unknown credential, a passkey of another account than the one the options
    were asked for (or, with `user_id`, than that user), a user handle other than its owner's, wrong
    origin or RP ID, no user verification, a bad signature, a counter not greater.
    """
    from webauthn.helpers import base64url_to_bytes, parse_authentication_credential_json

    parsed = _parsed(parse_authentication_credential_json, credential)
    owner = find_owner(parsed.id) if challenge is not None else None
    if owner is None or any(bound not in (None, owner) for bound in (user_id, challenge.account)):
        raise invalid_credentials()
    user, record = users.get_user(owner), _record(owner, parsed.id)
    handle = (user or {}).get("passkey_handle")
    given = parsed.response.user_handle
    # With an empty allowCredentials the authenticator names the account itself (its user handle): it must match.
    if not user or not record or not handle or not given or not hmac.compare_digest(given, base64url_to_bytes(handle)):
        raise invalid_credentials()
    rp_id, origins = relying_party()
    try:
        verified = verify_authentication_response(
            credential=parsed,
            expected_challenge=base64url_to_bytes(challenge.challenge),
            expected_rp_id=rp_id,
            expected_origin=origins,
            credential_public_key=base64url_to_bytes(record["public_key"]),
            credential_current_sign_count=int(record["sign_count"]),
            require_user_verification=True,
        )
    except _refused() as refusal:
        log.info("passkey login refused for user %s: %s", owner, refusal)
        raise invalid_credentials() from None
    return Assertion(user, parsed.id, verified.new_sign_count, verified.credential_backed_up)


# KEYS[1] the user's passkeys. ARGV: credential id, the assertion's counter, now, backed up (1|0).
# The counter's compare-and-set: 'ok' once stored, 'counter' when it is not greater than the stored one
# (and either counts), 'unknown' for a passkey deleted meanwhile.
USE_LUA = """
local raw = redis.call('HGET', KEYS[1], ARGV[1])
if not raw then return 'unknown' end
local record = cjson.decode(raw)
local stored, given = tonumber(record.sign_count), tonumber(ARGV[2])
if (given > 0 or stored > 0) and given <= stored then return 'counter' end
record.sign_count = given
record.last_used_at = ARGV[3]
record.backed_up = ARGV[4] == '1'
redis.call('HSET', KEYS[1], ARGV[1], cjson.encode(record))
return 'ok'
"""


def use(assertion: Assertion) -> None:
    """Record a verified login: counter and last use, in the compare-and-set step; 401 when it lost a race."""
    outcome = get_script(USE_LUA)(
        keys=[Keys.user_passkeys(assertion.user["id"])],
        args=[assertion.credential_id, assertion.sign_count, f"{time.time():.3f}", int(assertion.backed_up)],
    )
    if outcome != "ok":
        log.info("passkey login refused for user %s: %s", assertion.user["id"], outcome)
        raise invalid_credentials()


def authenticate(challenge: LoginChallenge | None, credential: dict, user_id: str | None = None) -> dict:
    """verify_login, then use: the owner's stored record (for re-authentication, where nothing else applies)."""
    assertion = verify_login(challenge, credential, user_id)
    use(assertion)
    return assertion.user


def rate_limit_account() -> str:
    """The account a passkey login names (its credential's owner), for the per-account rate limit."""
    try:
        credential = json_body(optional=True).get("credential")
    except ApiError:
        return "passkey:malformed"  # the view answers the bad body itself
    credential_id = credential.get("id") if isinstance(credential, dict) else None
    if not is_credential_id(credential_id):
        return "passkey:malformed"
    owner = find_owner(credential_id)
    return f"user:{owner}" if owner else "passkey:" + hashlib.sha256(credential_id.encode()).hexdigest()[:32]
