"""An issuer's verification keys, and the check of a subject token with them (PyJWT does all of JOSE).

Keys come from the issuer's record (an inline JWKS, or an HMAC secret), or from its `jwks_url`, fetched
through the address-checked HTTP of outgoing webhooks (app/outgoing/sender.py: https and public
addresses only, unless the two settings allow others; checked at every connection). Fetched keys are kept
per worker process for JWKS_LIFESPAN_SECONDS; a token naming a `kid` they lack fetches them again at once,
but at most once a minute per issuer, so a stream of made-up kids cannot turn into a stream of requests.

Our own small cache rather than PyJWT's `PyJWKClient`: its cool-down starts at every successful fetch (so
a key rotated in just after the first fetch would be refused for a minute) and counts no failed attempt
(so an issuer whose endpoint is down would be asked again for every token); its lock is a thread lock.
PyJWT still parses every key (`PyJWKSet`, `PyJWK`) and verifies every token (`jwt.decode`).
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass

import gevent.lock
import jwt
from jwt import PyJWK, PyJWKSet
from jwt.exceptions import PyJWTError

from ..http import has_control_characters
from .store import Issuer

log = logging.getLogger(__name__)

JWKS_LIFESPAN_SECONDS = 300.0  # how long fetched keys are used before they are fetched again
UNKNOWN_KID_INTERVAL = 60.0  # an unknown kid fetches again at most this often per issuer
JWKS_TIMEOUT_SECONDS = 5.0
JWKS_READ_LIMIT = 256 * 1024
LEEWAY_SECONDS = 60  # clocks differ: exp, nbf and iat are judged with this much slack both ways
REQUIRED_CLAIMS = ["exp", "iss", "aud", "sub"]


class TokenRefused(Exception):
    """A subject token that is not accepted; the message says why in plain ASCII (an RFC 6749 description)."""


# PyJWT's refusals, most specific first (a bad signature is also a DecodeError), as the answer says them.
REFUSALS = (
    (jwt.ExpiredSignatureError, "The subject token has expired."),
    (jwt.ImmatureSignatureError, "The subject token is not valid yet: its nbf or iat is in the future."),
    (jwt.InvalidAudienceError, "The subject token is not for this audience (aud)."),
    (jwt.InvalidIssuerError, "The subject token names another issuer (iss)."),
    (jwt.exceptions.InvalidSubjectError, "The subject token's sub must be a non-empty string."),
    (jwt.InvalidSignatureError, "The subject token's signature does not verify with the issuer's keys."),
    (jwt.InvalidAlgorithmError, "The subject token's algorithm (alg) is not one of the issuer's."),
    (jwt.InvalidKeyError, "The issuer's key does not fit the subject token's algorithm, or is too short."),
)


@dataclass(frozen=True)
class FetchedKeys:
    """An issuer's keys as its JWKS URL last answered them."""

    url: str
    keys: tuple[dict, ...]
    fetched_at: float  # time.monotonic()


class IssuerKeys:
    """The keys of every issuer, kept per worker process; `verify` checks a subject token with them."""

    def __init__(self, sender, lifespan: float = JWKS_LIFESPAN_SECONDS, unknown_kid_interval=UNKNOWN_KID_INTERVAL):
        self.sender = sender  # one Sender for issuers in this process (purpose "trusted issuer")
        self.lifespan = lifespan
        self.unknown_kid_interval = unknown_kid_interval
        self.fetched: dict[str, FetchedKeys] = {}
        self.fetched_for_unknown_kid: dict[str, float] = {}  # issuer -> when an unknown kid last fetched
        self.locks: dict[str, gevent.lock.Semaphore] = {}

    def forget(self, name: str) -> None:
        """Drop what is kept of an issuer (replaced or deleted here)."""
        self.fetched.pop(name, None)
        self.fetched_for_unknown_kid.pop(name, None)
        self.sender.forget(set(self.fetched))

    def verify(self, issuer: Issuer, token: str) -> dict:
        """The token's claims when the issuer's keys verify it and every rule holds; else TokenRefused."""
        try:
            header = jwt.get_unverified_header(token)
        except PyJWTError:
            raise TokenRefused("The subject token is not a valid JWT.") from None
        algorithm = header.get("alg")
        if algorithm not in issuer.algorithms:  # `none` included: no issuer may have it
            raise TokenRefused("The subject token's algorithm (alg) is not one of the issuer's.")
        claims = self._decode(issuer, token, self._key(issuer, header))
        subject = claims["sub"]
        if not isinstance(subject, str) or not subject or has_control_characters(subject):
            raise TokenRefused("The subject token's sub must be a non-empty string without control characters.")
        return claims

    def _decode(self, issuer: Issuer, token: str, key) -> dict:
        try:
            return jwt.decode(
                token,
                key,
                algorithms=list(issuer.algorithms),
                audience=issuer.audience,
                issuer=issuer.issuer,
                leeway=LEEWAY_SECONDS,
                options={"require": REQUIRED_CLAIMS, "enforce_minimum_key_length": True},
            )
        except jwt.MissingRequiredClaimError as missing:
            raise TokenRefused(f"The subject token lacks the claim {missing.claim}.") from None
        except PyJWTError as refused:
            reason = next((said for kind, said in REFUSALS if isinstance(refused, kind)), None)
            raise TokenRefused(reason or "The subject token is not a valid JWT.") from None

    def _key(self, issuer: Issuer, header: dict):
        """What verifies the token: the secret's bytes, or the issuer's public key its `kid` names."""
        if issuer.secret is not None:
            return issuer.secret.encode()
        kid = header.get("kid")
        keys = issuer.jwks["keys"] if issuer.jwks is not None else self._fetched_keys(issuer, kid)
        jwk = pick(keys, kid)
        if jwk is None:
            if kid is None:
                raise TokenRefused("The subject token names no key (kid) and the issuer has several.")
            raise TokenRefused("No key of the issuer has the subject token's kid.")
        if jwk.get("alg", header["alg"]) != header["alg"]:
            raise TokenRefused("The key the subject token names is for another algorithm (alg).")
        try:
            return PyJWK(jwk, header["alg"])  # bound to the token's algorithm, which PyJWT then holds it to
        except PyJWTError:
            raise TokenRefused("The key the subject token names does not fit its algorithm (alg).") from None

    def _fetched_keys(self, issuer: Issuer, kid: str | None) -> tuple[dict, ...]:
        """The keys at the issuer's URL: kept ones while fresh, else fetched; fetched again for an unknown kid
        at most once per UNKNOWN_KID_INTERVAL. One fetch at a time per issuer: the others wait for its keys."""
        with self.locks.setdefault(issuer.name, gevent.lock.Semaphore()):
            kept = self.fetched.get(issuer.name)
            now = time.monotonic()
            if kept is None or kept.url != issuer.jwks_url or now - kept.fetched_at >= self.lifespan:
                return self._fetch(issuer).keys
            if kid is None or pick(kept.keys, kid) is not None:
                return kept.keys
            last = self.fetched_for_unknown_kid.get(issuer.name)
            if last is not None and now - last < self.unknown_kid_interval:
                return kept.keys
            self.fetched_for_unknown_kid[issuer.name] = now  # the attempt counts, whether or not it succeeds
            return self._fetch(issuer).keys

    def _fetch(self, issuer: Issuer) -> FetchedKeys:
        reply = self.sender.request(
            issuer.name, "GET", issuer.jwks_url, timeout=JWKS_TIMEOUT_SECONDS, read_limit=JWKS_READ_LIMIT
        )
        problem = reply.result.error
        if reply.result.succeeded:
            problem, keys = _parse_key_set(reply.body)
            if keys:
                fetched = FetchedKeys(issuer.jwks_url, keys, time.monotonic())
                self.fetched[issuer.name] = fetched
                return fetched
        log.warning("trusted issuer %s: its keys could not be fetched from its jwks_url: %s", issuer.name, problem)
        raise TokenRefused("The issuer's keys could not be fetched from its jwks_url.")


def _parse_key_set(body: bytes) -> tuple[str | None, tuple[dict, ...]]:
    """(None, the keys) of a JWKS answer, or (what is wrong, ())."""
    if len(body) >= JWKS_READ_LIMIT:
        return f"the answer is larger than {JWKS_READ_LIMIT} bytes", ()
    try:
        data = json.loads(body)
        PyJWKSet.from_dict(data)  # at least one key PyJWT can use
    except (ValueError, AttributeError, TypeError, PyJWTError):
        return "the answer is not a JSON Web Key Set with a usable key", ()
    return None, tuple(key for key in data["keys"] if isinstance(key, dict))


def pick(keys, kid: str | None) -> dict | None:
    """The signing key named `kid`; without a kid, the one signing key when there is only one."""
    signing = [key for key in keys if key.get("use") in (None, "sig")]
    if kid is None:
        return signing[0] if len(signing) == 1 else None
    return next((key for key in signing if key.get("kid") == kid), None)
