"""Trusted issuers' records: checked, stored in one Redis hash (name -> JSON), read, deleted.

An issuer's HMAC `secret` is stored with its record (the service must have it to verify) and never
answered. What `jwks` holds is public keys only: a private member or a symmetric key is refused.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field, replace

from jwt import PyJWK
from jwt.exceptions import PyJWTError

from ..errors import validation_failed
from ..http import rfc3339
from ..redis import Keys

NAME_PATTERN = r"[a-z0-9_-]{1,32}"
NAME = re.compile(NAME_PATTERN)
# The JWS algorithms an issuer may use (PyJWT verifies each); never `none`.
HMAC_ALGORITHMS = ("HS256", "HS384", "HS512")
KEY_ALGORITHMS = (
    "RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES256K", "ES384", "ES512", "EdDSA",
)  # fmt: skip
ALGORITHMS = KEY_ALGORITHMS + HMAC_ALGORITHMS
SECRET_MIN_BYTES = 32
# An HMAC key at least as long as the hash's output (RFC 7518, 3.2): PyJWT refuses a shorter one.
SECRET_BYTES = {"HS256": 32, "HS384": 48, "HS512": 64}
DEFAULT_EMAIL_CLAIM = "email"
# JWK members that hold private or symmetric key material: a JWKS here is the issuer's public keys.
PRIVATE_MEMBERS = ("d", "p", "q", "dp", "dq", "qi", "oth", "k")


@dataclass(frozen=True)
class Issuer:
    """A trusted issuer: whose tokens (`issuer`, `audience`) are accepted, signed how, and which claims say what."""

    name: str
    issuer: str
    audience: str
    algorithms: tuple[str, ...]
    jwks_url: str | None = None
    jwks: dict | None = None
    secret: str | None = field(default=None, repr=False)  # never answered, never in a repr or a log
    email_claim: str = DEFAULT_EMAIL_CLAIM
    channels_claim: str | None = None
    info_claim: str | None = None
    created_at: float = 0.0

    @property
    def source(self) -> str:
        """What the channel grants its tokens make are marked with."""
        return f"issuer:{self.name}"

    @property
    def keys_kind(self) -> str:
        """Where its keys come from: `jwks_url`, `jwks` or `secret`."""
        return "secret" if self.secret else "jwks" if self.jwks else "jwks_url"

    def answer(self) -> dict:
        """`X`: the issuer as answers show it (never the secret)."""
        return {
            "name": self.name,
            "issuer": self.issuer,
            "audience": self.audience,
            "algorithms": list(self.algorithms),
            "jwks_url": self.jwks_url,
            "jwks": self.jwks,
            "email_claim": self.email_claim,
            "channels_claim": self.channels_claim,
            "info_claim": self.info_claim,
            "created_at": rfc3339(self.created_at),
        }

    def stored(self) -> str:
        """The record as the issuers hash keeps it."""
        record = {**self.answer(), "algorithms": list(self.algorithms), "created_at": self.created_at}
        del record["name"]
        return json.dumps({**record, "secret": self.secret}, separators=(",", ":"))


def parse_issuer(name: str, stored: str | None) -> Issuer | None:
    """An issuer as its record is stored (None when nothing is)."""
    if not stored:
        return None
    record = json.loads(stored)
    return Issuer(name=name, **{**record, "algorithms": tuple(record["algorithms"])})


def check_issuer(issuer: Issuer) -> Issuer:
    """The issuer, or 422 naming what is wrong with its name, keys or algorithms (its URL's address is
    checked apart: that needs the network)."""
    if not NAME.fullmatch(issuer.name):
        raise validation_failed("An issuer's name must be 1-32 of a-z, 0-9, '_' and '-'.")
    given = [kind for kind in ("jwks_url", "jwks", "secret") if getattr(issuer, kind) is not None]
    if len(given) != 1:
        raise validation_failed("Give exactly one of jwks_url, jwks and secret.")
    unknown = [name for name in issuer.algorithms if name not in ALGORITHMS]
    if not issuer.algorithms or unknown:
        raise validation_failed(f"algorithms must be one or more of {', '.join(ALGORITHMS)} (never none).")
    symmetric = [name for name in issuer.algorithms if name in HMAC_ALGORITHMS]
    if issuer.secret is not None:
        if len(symmetric) != len(issuer.algorithms):
            raise validation_failed(f"A secret verifies {', '.join(HMAC_ALGORITHMS)} only.")
        needed = max(SECRET_MIN_BYTES, *(SECRET_BYTES[name] for name in issuer.algorithms))
        if len(issuer.secret.encode()) < needed:
            raise validation_failed(f"The secret must have at least {needed} bytes for these algorithms.")
    elif symmetric:
        # A public key must never serve as an HMAC secret: HS* comes with a secret of its own, or not at all.
        raise validation_failed(f"{', '.join(HMAC_ALGORITHMS)} need a secret (and only a secret).")
    if issuer.jwks is not None:
        _check_public_keys(issuer.jwks)
    return issuer


def _check_public_keys(jwks: dict) -> None:
    """422 unless every key of the set is a public key PyJWT can use."""
    for number, key in enumerate(jwks.get("keys", []), start=1):
        if key.get("kty") == "oct" or any(member in key for member in PRIVATE_MEMBERS):
            raise validation_failed(
                f"Key {number} of jwks holds private or symmetric key material: give public keys only "
                "(an HMAC key goes in secret)."
            )
        try:
            usable = PyJWK(key)
        except PyJWTError:
            raise validation_failed(f"Key {number} of jwks is not a usable public key (JWK).") from None
        if usable.Algorithm.check_key_length(usable.key):
            raise validation_failed(f"Key {number} of jwks is too short (an RSA key needs 2048 bits at least).")


def put_issuer(client, issuer: Issuer) -> tuple[Issuer, bool]:
    """Create or replace an issuer (a replaced one keeps when it was made); it, and whether it is new."""
    before = get_issuer(client, issuer.name)
    created_at = before.created_at if before else round(time.time(), 3)
    stored = replace(issuer, created_at=created_at)
    client.hset(Keys.issuers(), issuer.name, stored.stored())
    return stored, before is None


def get_issuer(client, name: str) -> Issuer | None:
    """The issuer with this name, or None."""
    return parse_issuer(name, client.hget(Keys.issuers(), name)) if NAME.fullmatch(name) else None


def list_issuers(client) -> list[Issuer]:
    """Every issuer, by name."""
    return [parse_issuer(name, stored) for name, stored in sorted(client.hgetall(Keys.issuers()).items())]


def issuers_of(client, iss: str) -> list[Issuer]:
    """The issuers whose `issuer` is `iss`: the ones whose keys may have signed a token that names it."""
    return [issuer for issuer in list_issuers(client) if issuer.issuer == iss]


def delete_issuer(client, name: str) -> bool:
    """Delete an issuer's record: its tokens are refused from now on. False when there was none."""
    return NAME.fullmatch(name) is not None and client.hdel(Keys.issuers(), name) == 1
