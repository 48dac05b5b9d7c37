"""The OpenID provider's signing keys: made by the service, kept in Redis encrypted, published in the JWKS.

One key signs at a time, the current key. `flask --app wsgi keys rotate` makes a new key current; the key it
replaces stops signing but stays published (in the JWKS, and accepted by `verify`) for
PUBLISHED_AFTER_SIGNING_SECONDS, longer than any token it signed lives, and is then dropped. `keys retire` removes
a key that no longer signs at once: its tokens stop verifying. The first key is made at first need (a token to
sign, the JWKS asked for) with OIDC_ID_TOKEN_ALG's algorithm, by one process only: a Lua step installs a key only
while none is current, and every other process takes the winner's. A changed OIDC_ID_TOKEN_ALG applies from the
next rotation; the current key keeps signing until then (two instances with different settings during a deploy
must not take turns replacing each other's key).

At rest each record holds the public JWK in clear (it is public: the JWKS shows it) and the private JWK sealed by
AES-256-GCM under a key derived from SECRET_KEY by HKDF-SHA256 with a purpose label, never SECRET_KEY itself; the
kid is the associated data, so a sealed key copied into another key's record does not open. A process whose
SECRET_KEY is not the one the current key was sealed under cannot sign (503, and a log line saying what to do) but
still publishes and verifies, from the public parts; `keys rotate` there makes a key it can open.

Per process: the records are read again when their version (a random value every change sets) differs, checked
at most every RECHECK_SECONDS, so a rotation or retirement reaches every worker and instance within that time;
a private key, once opened, is kept OPENED_LIFESPAN_SECONDS so that signing does not decrypt per token.

Keys are made and exported by joserfc (kid = RFC 7638 thumbprint); tokens are signed and verified by PyJWT, as
the service's own access tokens are (joserfc flags EdDSA, which the contract names, as deprecated).
"""

from __future__ import annotations

import base64
import json
import logging
import os
import secrets
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import NamedTuple

import jwt
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from flask import Flask, current_app
from joserfc.jwk import ECKey, OKPKey, RSAKey, import_key

from .. import audit
from ..errors import ApiError
from ..redis import Keys
from .issuer import issuer

log = logging.getLogger(__name__)

# The longest-lived token a key signs lives 900 s (access and ID tokens); a worker may still sign with a replaced
# key for RECHECK_SECONDS, and clocks differ: five minutes of margin on top.
PUBLISHED_AFTER_SIGNING_SECONDS = 900 + 300
RECHECK_SECONDS = 1.0
OPENED_LIFESPAN_SECONDS = 600.0
RSA_BITS = 2048
ALGORITHMS = ("RS256", "ES256", "EdDSA")
SEAL_PURPOSE = b"auth-rt oidc signing keys v1"  # the HKDF label: this derived key seals signing keys, nothing else
SEAL_VERSION = "v1"

_MAKERS = {
    "RS256": lambda: RSAKey.generate_key(RSA_BITS, private=True),
    "ES256": lambda: ECKey.generate_key("P-256", private=True),
    "EdDSA": lambda: OKPKey.generate_key("Ed25519", private=True),
}

_KEYS = [Keys.signing_keys(), Keys.signing_keys_stopped(), Keys.signing_key_current(), Keys.signing_keys_version()]

# KEYS as _KEYS. Everything, as one consistent reading: version, current kid, records, stop times.
READ_LUA = """
return {redis.call('GET', KEYS[4]) or '', redis.call('GET', KEYS[3]) or '', redis.call('HGETALL', KEYS[1]),
        redis.call('HGETALL', KEYS[2])}
"""

# KEYS as _KEYS. ARGV: kid, record, now, new version, '1' to install only while no key is current (the first key,
# made by whichever process gets here first). The key replaced stops signing now. Answers the current kid and
# the kid of the key it replaced ('' for none).
INSTALL_LUA = """
local current = redis.call('GET', KEYS[3])
if current and redis.call('HEXISTS', KEYS[1], current) == 0 then current = false end
if ARGV[5] == '1' and current then return {current, ''} end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
if current then redis.call('HSET', KEYS[2], current, ARGV[3]) end
redis.call('SET', KEYS[3], ARGV[1])
redis.call('SET', KEYS[4], ARGV[4])
return {ARGV[1], current or ''}
"""

# KEYS as _KEYS. ARGV: kid, new version. Answers 'current' (refused), 'unknown' or 'retired'.
RETIRE_LUA = """
if redis.call('GET', KEYS[3]) == ARGV[1] then return 'current' end
if redis.call('HDEL', KEYS[1], ARGV[1]) == 0 then return 'unknown' end
redis.call('HDEL', KEYS[2], ARGV[1])
redis.call('SET', KEYS[4], ARGV[2])
return 'retired'
"""

# KEYS as _KEYS. ARGV: now, the publication window (s), new version. Drops the keys that stopped signing at least
# the window ago; answers their kids.
PRUNE_LUA = """
local stopped, current, dropped = redis.call('HGETALL', KEYS[2]), redis.call('GET', KEYS[3]), {}
for i = 1, #stopped, 2 do
  local kid = stopped[i]
  if kid ~= current and tonumber(ARGV[1]) - tonumber(stopped[i + 1]) >= tonumber(ARGV[2]) then
    redis.call('HDEL', KEYS[1], kid)
    redis.call('HDEL', KEYS[2], kid)
    table.insert(dropped, kid)
  end
end
if #dropped > 0 then redis.call('SET', KEYS[4], ARGV[3]) end
return dropped
"""


class SigningKeyUnreadable(ApiError):
    """The current key does not open with this process's SECRET_KEY: nothing can be signed (the log says why)."""

    def __init__(self):
        super().__init__(503, "unavailable", "The service cannot sign tokens now; retry later.")


class TokenInvalid(Exception):
    """A token that is not one of this provider's, valid now (the message says why, for logs only)."""


class KeyRefused(Exception):
    """A key change the operator asked for cannot be made (the message says why)."""


@dataclass(frozen=True)
class StoredKey:
    """One signing key as stored: its public JWK (with kid, alg, use) and its sealed private JWK."""

    kid: str
    alg: str
    created_at: int
    public: dict
    sealed: str
    stopped_at: int | None = None  # when it stopped signing; None while it signs
    verifier: jwt.PyJWK | None = field(default=None, compare=False, repr=False)

    def published_until(self) -> float | None:
        """Until when the key stays in the JWKS (epoch seconds); None while it signs."""
        return None if self.stopped_at is None else self.stopped_at + PUBLISHED_AFTER_SIGNING_SECONDS

    def published(self, now: float) -> bool:
        """Whether tokens it signed may still be alive: it signs, or stopped less than the window ago."""
        until = self.published_until()
        return until is None or now < until


@dataclass(frozen=True)
class KeyState:
    """What Redis holds, as read at one moment."""

    version: str
    current: str | None
    keys: dict[str, StoredKey]


class Signer(NamedTuple):
    """The key to sign with now: its kid (the header's), algorithm and private joserfc key (`kid, alg, key =`)."""

    kid: str
    alg: str
    key: RSAKey | ECKey | OKPKey


def sealing_key(secret_key: str) -> AESGCM:
    """The AES-256-GCM key that seals signing keys: HKDF-SHA256 of SECRET_KEY with this purpose's label."""
    derived = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=SEAL_PURPOSE).derive(secret_key.encode())
    return AESGCM(derived)


def _seal(cipher: AESGCM, kid: str, private_jwk: dict) -> str:
    nonce = os.urandom(12)
    sealed = cipher.encrypt(nonce, json.dumps(private_jwk).encode(), kid.encode())
    return f"{SEAL_VERSION}:{base64.urlsafe_b64encode(nonce + sealed).decode()}"


def _open(cipher: AESGCM, kid: str, sealed: str) -> RSAKey | ECKey | OKPKey:
    """The private key sealed in `sealed`; InvalidTag when it does not open with this cipher (or was altered)."""
    version, _, data = sealed.partition(":")
    raw = base64.urlsafe_b64decode(data)
    if version != SEAL_VERSION or len(raw) < 28:
        raise InvalidTag()
    key = import_key(json.loads(cipher.decrypt(raw[:12], raw[12:], kid.encode())))
    if not key.is_private or key.thumbprint() != kid:  # sealed under this kid: only a wrongly made key differs
        raise InvalidTag()
    return key


class KeyRing:
    """The signing keys as this process knows them: read again when they change, opened once in a while."""

    def __init__(self, client, secret_key: str, algorithm: str):
        self.client = client
        self.cipher = sealing_key(secret_key)
        self.algorithm = algorithm
        self.read_script = client.register_script(READ_LUA)
        self.install_script = client.register_script(INSTALL_LUA)
        self.retire_script = client.register_script(RETIRE_LUA)
        self.prune_script = client.register_script(PRUNE_LUA)
        self.state: KeyState | None = None
        self.checked_at = 0.0  # time.monotonic() of the last version check
        self.opened: dict[str, tuple[RSAKey | ECKey | OKPKey, float]] = {}
        self.making = threading.Lock()  # a gevent lock under the gevent worker (patched before the app is built)
        self.told: set[str] = set()  # log lines written once per process (unreadable kid, algorithm mismatch)

    # Reading.

    def current_state(self, force: bool = False) -> KeyState:
        """The keys, read again when their version changed (checked at most every RECHECK_SECONDS); a key whose
        publication window has passed is deleted (by the first process to notice) and read no more."""
        now = time.monotonic()
        state = self.state
        if force or state is None or now - self.checked_at >= RECHECK_SECONDS:
            if force or state is None or self.client.get(Keys.signing_keys_version()) != state.version:
                state = self._read()
            self.state, self.checked_at = state, now
        if any(not key.published(time.time()) for key in state.keys.values()):
            self.prune(time.time())
            state = self.state = self._read()
        return state

    def _read(self) -> KeyState:
        version, current, records, stopped = self.read_script(keys=_KEYS)
        stop_times = dict(zip(stopped[::2], stopped[1::2], strict=True))
        keys = {}
        for kid, text in zip(records[::2], records[1::2], strict=True):
            record = json.loads(text)
            stopped_at = int(stop_times[kid]) if kid in stop_times and kid != current else None
            keys[kid] = StoredKey(
                kid,
                record["alg"],
                record["created_at"],
                record["public"],
                record["sealed"],
                stopped_at,
                jwt.PyJWK(record["public"], algorithm=record["alg"]),
            )
        self.opened = {kid: opened for kid, opened in self.opened.items() if kid in keys}
        return KeyState(version, current if current in keys else None, keys)

    def published_keys(self) -> list[StoredKey]:
        """The current key (made now if there is none), then the others still published, newest first."""
        state = self._with_current()
        now = time.time()
        others = sorted(
            (key for kid, key in state.keys.items() if kid != state.current and key.published(now)),
            key=lambda key: key.created_at,
            reverse=True,
        )
        return [state.keys[state.current], *others]

    def verification_key(self, kid: str) -> StoredKey | None:
        """The published key with this kid, if there is one."""
        key = self.current_state().keys.get(kid)
        return key if key is not None and key.published(time.time()) else None

    # Signing.

    def signer(self) -> Signer:
        """The current key, opened (made first if there is none)."""
        state = self._with_current()
        key = state.keys[state.current]
        if key.alg != self.algorithm:
            self._tell_once(
                f"alg:{key.kid}",
                logging.WARNING,
                "OIDC_ID_TOKEN_ALG is %s but the current signing key %s is %s: it signs until `flask --app wsgi "
                "keys rotate` makes a %s key",
                self.algorithm,
                key.kid,
                key.alg,
                self.algorithm,
            )
        return Signer(key.kid, key.alg, self.opened_key(key))

    def opened_key(self, key: StoredKey) -> RSAKey | ECKey | OKPKey:
        """The private key of `key`, opened at most every OPENED_LIFESPAN_SECONDS; SigningKeyUnreadable if it
        does not open with this SECRET_KEY."""
        now = time.monotonic()
        kept = self.opened.get(key.kid)
        if kept is not None and now - kept[1] < OPENED_LIFESPAN_SECONDS:
            return kept[0]
        try:
            private = _open(self.cipher, key.kid, key.sealed)
        except (InvalidTag, ValueError):
            self._tell_once(
                f"unreadable:{key.kid}",
                logging.ERROR,
                "signing key %s does not open with this SECRET_KEY, so no OpenID token can be signed: give this "
                "process the SECRET_KEY the key was made under, or run `flask --app wsgi keys rotate` to sign with "
                "a new key (tokens of the old one stay valid until they expire)",
                key.kid,
            )
            raise SigningKeyUnreadable() from None
        self.opened[key.kid] = (private, now)
        return private

    def readable(self, key: StoredKey) -> bool:
        """Whether `key` opens with this process's SECRET_KEY."""
        try:
            _open(self.cipher, key.kid, key.sealed)
        except (InvalidTag, ValueError):
            return False
        return True

    # Changing.

    def _with_current(self) -> KeyState:
        """The state, with a current key: made now, by this process or another, when there is none."""
        state = self.current_state()
        if state.current is not None:
            return state
        with self.making:  # one greenlet of this process makes it; the others wait and take it
            state = self.current_state(force=True)
            if state.current is None:
                self.install(self._new_key(self.algorithm), only_if_none=True)
                state = self.current_state(force=True)
        return state

    def _new_key(self, algorithm: str) -> StoredKey:
        private = _MAKERS[algorithm]()
        kid = private.thumbprint()
        public = {**private.as_dict(private=False), "kid": kid, "alg": algorithm, "use": "sig"}
        return StoredKey(
            kid, algorithm, int(time.time()), public, _seal(self.cipher, kid, private.as_dict(private=True))
        )

    def install(self, key: StoredKey, only_if_none: bool) -> str | None:
        """Make `key` the current key (with `only_if_none`, only while none is), recorded in the audit log; the kid of
        the key it replaced, if any."""
        record = json.dumps({"alg": key.alg, "created_at": key.created_at, "public": key.public, "sealed": key.sealed})
        args = [key.kid, record, int(time.time()), secrets.token_hex(8), "1" if only_if_none else "0"]
        current, replaced = self.install_script(keys=_KEYS, args=args)
        self.checked_at = 0.0  # read again at the next use
        if current == key.kid:
            audit.record(
                "signing_key.rotated",
                # the first key is the service's doing, whoever's request needed it; a rotation is the operator's
                actor=audit.SYSTEM if only_if_none else None,
                details={"kid": key.kid, "alg": key.alg, "previous_kid": replaced or None},
            )
        return replaced or None

    def rotate(self) -> tuple[StoredKey, StoredKey | None]:
        """A new key of OIDC_ID_TOKEN_ALG's algorithm signs from now on; the new key and the one it replaced."""
        key = self._new_key(self.algorithm)
        replaced = self.install(key, only_if_none=False)
        return key, self.current_state(force=True).keys.get(replaced) if replaced else None

    def retire(self, kid: str) -> StoredKey | None:
        """Remove a key that no longer signs, at once; KeyRefused for the current key or an unknown kid."""
        key = self.current_state(force=True).keys.get(kid)
        outcome = self.retire_script(keys=_KEYS, args=[kid, secrets.token_hex(8)])
        self.checked_at = 0.0
        if outcome == "current":
            raise KeyRefused(f"{kid} signs now: run `flask --app wsgi keys rotate` first, then retire it")
        if outcome == "unknown":
            raise KeyRefused(f"no signing key {kid} (`flask --app wsgi keys list` shows them)")
        audit.record("signing_key.retired", details={"kid": kid, "alg": key.alg if key else None})
        return key

    def prune(self, now: float) -> list[str]:
        """Drop the keys whose publication window has passed."""
        dropped = self.prune_script(keys=_KEYS, args=[int(now), PUBLISHED_AFTER_SIGNING_SECONDS, secrets.token_hex(8)])
        if dropped:
            log.info("signing keys %s dropped from the JWKS: their tokens have expired", ", ".join(dropped))
        return dropped

    def _tell_once(self, what: str, level: int, message: str, *args) -> None:
        if what not in self.told:
            self.told.add(what)
            log.log(level, message, *args)


def init_app(app: Flask) -> None:
    """This process's key ring (nothing is read or made before it is needed)."""
    settings = app.config["SETTINGS"]
    app.extensions["oidc_keys"] = KeyRing(app.extensions["redis"], str(settings.secret_key), settings.oidc_id_token_alg)


def _ring() -> KeyRing:
    return current_app.extensions["oidc_keys"]


def signing_key() -> Signer:
    """The key to sign with now (kid, alg, private joserfc key); SigningKeyUnreadable (503) if it cannot be opened."""
    return _ring().signer()


def sign(claims: dict, typ: str | None = None, signer: Signer | None = None) -> str:
    """A JWT of `claims` signed with the current key (or `signer`, the key a claim such as `at_hash` was computed
    for); its header names the kid (and `typ` when given)."""
    signer = signer or signing_key()
    headers = {"kid": signer.kid, **({"typ": typ} if typ else {})}
    return jwt.encode(claims, signer.key.private_key, algorithm=signer.alg, headers=headers)


def public_jwks() -> list[dict]:
    """The public JWKs of every key that signs or signed tokens still alive (current first); makes the first key."""
    return [dict(key.public) for key in _ring().published_keys()]


def algorithms() -> list[str]:
    """The algorithms tokens are signed with: the current key's, then the others' published, then the setting's."""
    ring = _ring()
    state = ring.current_state()
    now = time.time()
    ordered = sorted(state.keys.values(), key=lambda key: (key.kid != state.current, -key.created_at))
    found = [key.alg for key in ordered if key.published(now)] + [ring.algorithm]
    return list(dict.fromkeys(found))


def verify(token: str, *, typ: str | None, audience: str | None = None, verify_exp: bool = True) -> dict:
    """The claims of a token this provider signed with a published key, checked for its issuer, `typ` (None: no
    `typ`, or `JWT`), audience when given, and expiry unless told not to; TokenInvalid otherwise.

    The algorithm is the key's, never the header's choice.
    """
    try:
        header = jwt.get_unverified_header(token)
    except jwt.PyJWTError as error:
        raise TokenInvalid(f"not a JWT: {error}") from None
    kid = header.get("kid")
    key = _ring().verification_key(kid) if isinstance(kid, str) else None
    if key is None:
        raise TokenInvalid("no published key has this kid")
    if header.get("typ") != typ and not (typ is None and header.get("typ") == "JWT"):
        raise TokenInvalid(f"typ is not {typ}")
    options = {"require": ["iss", "iat", "exp"], "verify_aud": audience is not None, "verify_exp": verify_exp}
    try:
        return jwt.decode(
            token, key.verifier.key, algorithms=[key.alg], issuer=issuer(), audience=audience, options=options
        )
    except jwt.PyJWTError as error:
        raise TokenInvalid(str(error)) from None


def rotate() -> tuple[StoredKey, StoredKey | None]:
    """A new current key (`keys rotate`): the new key, and the one that stopped signing."""
    return _ring().rotate()


def retire(kid: str) -> StoredKey | None:
    """Remove a key at once (`keys retire`); KeyRefused for the current key or an unknown kid."""
    return _ring().retire(kid)


@dataclass(frozen=True)
class KeyListing:
    """A key as `keys list` shows it."""

    kid: str
    alg: str
    created_at: int
    published_until: float | None  # None: it signs now
    readable: bool


def list_keys() -> list[KeyListing]:
    """Every key still published, current first, with whether this process's SECRET_KEY opens it."""
    ring = _ring()
    state = ring.current_state(force=True)
    now = time.time()
    ordered = sorted(state.keys.values(), key=lambda key: (key.kid != state.current, -key.created_at))
    return [
        KeyListing(key.kid, key.alg, key.created_at, key.published_until(), ring.readable(key))
        for key in ordered
        if key.published(now)
    ]


def iso(epoch: float) -> str:
    """Epoch seconds as RFC 3339 UTC."""
    return datetime.fromtimestamp(epoch, tz=UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
