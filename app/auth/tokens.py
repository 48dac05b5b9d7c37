"""JWT access tokens: issued with the configured key, verified with the configured algorithm only."""

from __future__ import annotations

import base64
import binascii
import functools
import hashlib
import json
import re
import secrets
import time
from dataclasses import dataclass

import jwt
from cryptography.hazmat.primitives import serialization
from flask import Flask, current_app
from jwt.algorithms import HMACAlgorithm

from . import sessions

REQUIRED_CLAIMS = ["iss", "aud", "sub", "role", "ver", "sid", "jti", "iat", "exp"]
MAX_LIFETIME_SECONDS = 900  # 15 minutes, whatever a token that was signed with our key claims
TOKEN_TYPE = "at+jwt"  # noqa: S105 (a JWT "typ" value, not a secret)
VERIFIED_TOKENS_KEPT = 4096  # per worker; a verified token is a few hundred bytes
BASE64URL = re.compile(rb"[A-Za-z0-9_-]*")


class TokenExpired(Exception):
    """A well-formed access token past its expiry."""

    pass


class TokenInvalid(Exception):
    """An access token that fails any other check (signature, algorithm, claims)."""

    pass


@dataclass(frozen=True)
class AccessClaims:
    """What a verified access token says about its bearer."""

    user_id: str
    role: str
    token_version: int
    session_id: str
    expires_at: int
    issued_at: int
    org_id: str | None = None  # the session's active organization when the token was issued, and the role there
    org_role: str | None = None


class TokenKeys:
    """The signing key, the verification key and (for asymmetric keys) the public JWKS."""

    def __init__(self, settings):
        self.algorithm = settings.jwt_algorithm
        self.issuer = settings.jwt_issuer
        self.audience = settings.jwt_audience
        self.ttl = settings.access_token_ttl
        self.kid = None
        self.jwks = {"keys": []}
        if settings.asymmetric_jwt:
            private_key = serialization.load_pem_private_key(settings.jwt_private_key.encode(), password=None)
            self.signing_key = private_key
            self.verifying_key = private_key.public_key()
            algorithm = jwt.get_algorithm_by_name(self.algorithm)
            public_jwk = algorithm.to_jwk(self.verifying_key, as_dict=True)
            self.kid = _thumbprint(public_jwk)
            self.jwks = {"keys": [{**public_jwk, "kid": self.kid, "alg": self.algorithm, "use": "sig"}]}
        else:
            self.signing_key = self.verifying_key = str(settings.jwt_secret)
        self.jwt = AccessTokenJWT(self.algorithm, self.verifying_key)
        self.verified = functools.lru_cache(maxsize=VERIFIED_TOKENS_KEPT)(functools.partial(_verify, self))


class AccessTokenJWS(jwt.PyJWS):
    """PyJWT's JWS with every check of its own, one made as one regular expression: PyJWT 2.15 checks a segment's
    alphabet one character at a time in Python, about a third of what verifying an access token cost (every stream
    opened after a deploy brings a token its worker has not verified yet)."""

    @staticmethod
    def _decode_base64url_segment(segment: bytes, name: str) -> bytes:
        stripped = segment.rstrip(b"=")
        padding = len(segment) - len(stripped)
        if (
            padding > 2
            or (padding and len(segment) % 4)
            or len(stripped) % 4 == 1
            or BASE64URL.fullmatch(stripped) is None
        ):
            raise jwt.DecodeError(f"Invalid {name} padding")
        try:
            decoded = base64.urlsafe_b64decode(stripped + b"=" * (-len(stripped) % 4))
        except binascii.Error as error:
            raise jwt.DecodeError(f"Invalid {name} padding") from error
        if base64.urlsafe_b64encode(decoded).rstrip(b"=") != stripped:  # a non-canonical last character
            raise jwt.DecodeError(f"Invalid {name} padding")
        return decoded


class PreparedHMAC(HMACAlgorithm):
    """PyJWT's HMAC with the service's secret checked and prepared once: PyJWT prepares the key again for every
    token (it parses the secret as JSON to refuse a JWK given as one), about a sixth of a verification."""

    def __init__(self, hash_alg, secret: str):
        super().__init__(hash_alg)
        self.secret = secret
        self.prepared = super().prepare_key(secret)

    def prepare_key(self, key):
        """The secret's prepared bytes; any other key prepared as PyJWT does."""
        return self.prepared if key is self.secret else super().prepare_key(key)


class AccessTokenJWT(jwt.PyJWT):
    """PyJWT for the service's access tokens: `algorithm` only, through AccessTokenJWS (and PreparedHMAC for a
    shared secret)."""

    def __init__(self, algorithm: str, verifying_key):
        super().__init__()
        self._jws = AccessTokenJWS(algorithms=[], options=self._get_sig_options())
        implementation = jwt.get_algorithm_by_name(algorithm)
        if isinstance(implementation, HMACAlgorithm):
            implementation = PreparedHMAC(implementation.hash_alg, verifying_key)
        self._jws.register_algorithm(algorithm, implementation)


def _thumbprint(public_jwk: dict) -> str:
    """RFC 7638 JWK thumbprint: SHA-256 over the required members in lexicographic order."""
    required = {"RSA": ("e", "kty", "n"), "EC": ("crv", "kty", "x", "y"), "OKP": ("crv", "kty", "x")}
    members = {k: public_jwk[k] for k in required[public_jwk["kty"]]}
    digest = hashlib.sha256(json.dumps(members, separators=(",", ":"), sort_keys=True).encode()).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def init_app(app: Flask) -> None:
    """Load the signing and verification keys once per app."""
    app.extensions["token_keys"] = TokenKeys(app.config["SETTINGS"])


def _keys() -> TokenKeys:
    return current_app.extensions["token_keys"]


def issue_access_token(user_id: str, role: str, token_version: int, session_id: str) -> str:
    """A signed access token; it names the user, role, tokenVersion and session, nothing secret, and the
    session's active organization with the user's role there (`org_id`, `org_role`) while the user is a member
    of it, as read now."""
    keys = _keys()
    now = int(time.time())
    claims = {
        "iss": keys.issuer,
        "aud": keys.audience,
        "sub": str(user_id),
        "role": role,
        "ver": int(token_version),
        "sid": session_id,
        "jti": secrets.token_urlsafe(16),
        "iat": now,
        "exp": now + keys.ttl,
    }
    org = sessions.active_org(str(user_id), session_id)
    if org is not None:
        claims["org_id"], claims["org_role"] = org
    headers = {"typ": TOKEN_TYPE}
    if keys.kid:
        headers["kid"] = keys.kid
    return keys.jwt.encode(claims, keys.signing_key, algorithm=keys.algorithm, headers=headers)


def decode_access_token(token: str) -> AccessClaims:
    """Verify signature, algorithm (ours, never the header's), type, issuer, audience, expiry, claims.

    A token verified before is not verified again: its claims are kept (up to VERIFIED_TOKENS_KEPT),
    and only its expiry is checked against the clock. Verification gives the same answer for the same
    token and key every time; what can change (the session, the token version) is checked in Redis.
    """
    claims = _keys().verified(token)
    if claims.expires_at <= time.time():
        raise TokenExpired()
    return claims


def _verify(keys: TokenKeys, token: str) -> AccessClaims:
    try:
        decoded = keys.jwt.decode_complete(
            token,
            keys.verifying_key,
            algorithms=[keys.algorithm],
            audience=keys.audience,
            issuer=keys.issuer,
            options={"require": REQUIRED_CLAIMS},
        )
    except jwt.ExpiredSignatureError:
        raise TokenExpired() from None
    except jwt.InvalidTokenError as error:
        raise TokenInvalid(type(error).__name__) from None
    header, claims = decoded["header"], decoded["payload"]
    if header.get("typ") != TOKEN_TYPE:
        raise TokenInvalid("wrong token type")
    if keys.kid and header.get("kid") != keys.kid:
        raise TokenInvalid("unknown key id")
    if not (
        isinstance(claims["sub"], str)
        and isinstance(claims["sid"], str)
        and isinstance(claims["role"], str)
        and isinstance(claims["ver"], int)
        and not isinstance(claims["ver"], bool)
        and isinstance(claims["iat"], int)
        and isinstance(claims["exp"], int)
    ):
        raise TokenInvalid("malformed claims")
    if claims["exp"] - claims["iat"] > MAX_LIFETIME_SECONDS:
        raise TokenInvalid("lives longer than an access token may")
    org_id, org_role = claims.get("org_id"), claims.get("org_role")
    if (org_id, org_role) != (None, None) and not (isinstance(org_id, str) and isinstance(org_role, str)):
        raise TokenInvalid("malformed organization claims")
    return AccessClaims(
        claims["sub"], claims["role"], claims["ver"], claims["sid"], claims["exp"], claims["iat"], org_id, org_role
    )
