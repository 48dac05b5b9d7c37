"""A software authenticator and client for tests: what a browser and a passkey provider would answer.

It makes EC P-256 (ES256) or RSA (RS256) credentials with "none" attestation, builds authenticator data
(RP ID hash, flags UP/UV/BE/BS/AT, a signature counter) and clientDataJSON (type, challenge, origin), and
signs assertions with `cryptography`. The CBOR is written with `cbor2` here, on the test side only: the
service reads it with py_webauthn. Every part can be made wrong on purpose (another origin, RP ID or
challenge, no user verification, a counter, a bad signature, another user handle), so each refusal of
the service can be tested one at a time.
"""

from __future__ import annotations

import base64
import hashlib
import json
import secrets
import struct
from dataclasses import dataclass, field

import cbor2
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa

UP, UV, BE, BS, AT = 0x01, 0x04, 0x08, 0x10, 0x40
ES256, RS256 = -7, -257
AAGUID = bytes(16)  # "none" attestation: the authenticator does not say what it is


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def from_b64url(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


@dataclass
class Credential:
    """One credential the authenticator holds: its id, key, account and counter."""

    id: bytes
    private_key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey
    algorithm: int
    rp_id: str
    user_handle: bytes
    sign_count: int = 0

    @property
    def id_text(self) -> str:
        return b64url(self.id)

    def cose_public_key(self) -> bytes:
        numbers = self.private_key.public_key().public_numbers()
        if self.algorithm == ES256:
            return cbor2.dumps(
                {1: 2, 3: ES256, -1: 1, -2: numbers.x.to_bytes(32, "big"), -3: numbers.y.to_bytes(32, "big")}
            )
        n = numbers.n.to_bytes((numbers.n.bit_length() + 7) // 8, "big")
        e = numbers.e.to_bytes((numbers.e.bit_length() + 7) // 8, "big")
        return cbor2.dumps({1: 3, 3: RS256, -1: n, -2: e})

    def sign(self, data: bytes) -> bytes:
        if self.algorithm == ES256:
            return self.private_key.sign(data, ec.ECDSA(hashes.SHA256()))
        return self.private_key.sign(data, padding.PKCS1v15(), hashes.SHA256())


@dataclass
class Authenticator:
    """A passkey provider and the browser in front of it, speaking as `origin` for `rp_id`.

    `counting=False` is an authenticator whose counter stays 0 (many synced passkeys); `backup_eligible`
    and `backed_up` set BE and BS.
    """

    origin: str
    rp_id: str
    algorithm: int = ES256
    counting: bool = True
    backup_eligible: bool = False
    backed_up: bool = False
    credentials: list[Credential] = field(default_factory=list)

    def _flags(self, user_verified: bool, attested: bool = False) -> int:
        flags = UP | (UV if user_verified else 0)
        flags |= (BE if self.backup_eligible else 0) | (BS if self.backed_up else 0)
        return flags | (AT if attested else 0)

    def _client_data(self, kind: str, challenge: str, origin: str | None) -> bytes:
        data = {"type": kind, "challenge": challenge, "origin": origin or self.origin, "crossOrigin": False}
        return json.dumps(data, separators=(",", ":")).encode()

    def create(
        self,
        options: dict,
        *,
        user_verified: bool = True,
        origin: str | None = None,
        rp_id: str | None = None,
        challenge: str | None = None,
        credential_id: bytes | None = None,
    ) -> dict:
        """RegistrationResponseJSON for PublicKeyCredentialCreationOptionsJSON, as `toJSON()` gives it."""
        if self.algorithm == ES256:
            key = ec.generate_private_key(ec.SECP256R1())
        else:
            key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        credential = Credential(
            id=credential_id or secrets.token_bytes(32),
            private_key=key,
            algorithm=self.algorithm,
            rp_id=options["rp"]["id"],
            user_handle=from_b64url(options["user"]["id"]),
        )
        self.credentials.append(credential)
        attested = AAGUID + struct.pack(">H", len(credential.id)) + credential.id + credential.cose_public_key()
        rp_hash = hashlib.sha256((rp_id or options["rp"]["id"]).encode()).digest()
        auth_data = rp_hash + bytes([self._flags(user_verified, attested=True)]) + struct.pack(">I", 0) + attested
        attestation = cbor2.dumps({"fmt": "none", "attStmt": {}, "authData": auth_data})
        client_data = self._client_data("webauthn.create", challenge or options["challenge"], origin)
        return {
            "id": credential.id_text,
            "rawId": credential.id_text,
            "type": "public-key",
            "authenticatorAttachment": "platform",
            "clientExtensionResults": {},
            "response": {
                "clientDataJSON": b64url(client_data),
                "attestationObject": b64url(attestation),
                "transports": ["internal", "hybrid"],
            },
        }

    def get(
        self,
        options: dict,
        credential: Credential | None = None,
        *,
        user_verified: bool = True,
        origin: str | None = None,
        rp_id: str | None = None,
        challenge: str | None = None,
        counter: int | None = None,
        user_handle: bytes | None = None,
        bad_signature: bool = False,
    ) -> dict:
        """AuthenticationResponseJSON for PublicKeyCredentialRequestOptionsJSON (with the newest credential)."""
        credential = credential or self.credentials[-1]
        if counter is None:
            if self.counting:
                credential.sign_count += 1
            counter = credential.sign_count
        rp_hash = hashlib.sha256((rp_id or options["rpId"]).encode()).digest()
        auth_data = rp_hash + bytes([self._flags(user_verified)]) + struct.pack(">I", counter)
        client_data = self._client_data("webauthn.get", challenge or options["challenge"], origin)
        signature = credential.sign(auth_data + hashlib.sha256(client_data).digest())
        if bad_signature:
            signature = credential.sign(auth_data + hashlib.sha256(client_data + b" ").digest())
        handle = credential.user_handle if user_handle is None else user_handle
        return {
            "id": credential.id_text,
            "rawId": credential.id_text,
            "type": "public-key",
            "authenticatorAttachment": "platform",
            "clientExtensionResults": {},
            "response": {
                "clientDataJSON": b64url(client_data),
                "authenticatorData": b64url(auth_data),
                "signature": b64url(signature),
                "userHandle": b64url(handle),
            },
        }
