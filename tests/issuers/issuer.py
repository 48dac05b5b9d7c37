"""A product's backend as trusted issuers see it in tests: real keys (RSA, EC, Ed25519, HMAC) made with
`cryptography`, tokens signed with PyJWT, and a JWKS served over HTTP on loopback by a small server that
counts what it is asked."""

from __future__ import annotations

import json
import secrets
import threading
import time
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from jwt.algorithms import ECAlgorithm, OKPAlgorithm, RSAAlgorithm

AUDIENCE = "auth-rt-tests"
EXCHANGE = "urn:ietf:params:oauth:grant-type:token-exchange"
JWT_TYPE = "urn:ietf:params:oauth:token-type:jwt"
ACCESS_TOKEN_TYPE = "urn:ietf:params:oauth:token-type:access_token"


@dataclass
class Signer:
    """One key of an issuer: signs tokens, and shows its public half as a JWK."""

    algorithm: str
    private: object  # a cryptography private key, or the HMAC secret (str)
    kid: str = field(default_factory=lambda: uuid.uuid4().hex[:12])

    @classmethod
    def rsa(cls, algorithm: str = "RS256") -> Signer:
        return cls(algorithm, rsa.generate_private_key(public_exponent=65537, key_size=2048))

    @classmethod
    def ec(cls, algorithm: str = "ES256") -> Signer:
        return cls(algorithm, ec.generate_private_key(ec.SECP256R1()))

    @classmethod
    def ed25519(cls) -> Signer:
        return cls("EdDSA", ed25519.Ed25519PrivateKey.generate())

    @classmethod
    def hmac(cls, algorithm: str = "HS256", size: int = 32) -> Signer:
        return cls(algorithm, secrets.token_urlsafe(size)[:size])

    def jwk(self, **members) -> dict:
        """The public key as a JWK, with its kid."""
        public = self.private.public_key()
        kind = {"RS": RSAAlgorithm, "PS": RSAAlgorithm, "ES": ECAlgorithm, "Ed": OKPAlgorithm}[self.algorithm[:2]]
        return {**json.loads(kind.to_jwk(public)), "kid": self.kid, "use": "sig", **members}

    def public_pem(self) -> bytes:
        """The public key in PEM, as an issuer would publish it (and an attacker would take it)."""
        return self.private.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )

    def sign(self, claims: dict, *, kid: str | None | bool = True, algorithm: str | None = None, key=None) -> str:
        """A token of these claims: with this key's kid (`kid=False` for none, a string for another)."""
        headers = {} if kid is False else {"kid": self.kid if kid is True else kid}
        return jwt.encode(claims, key if key is not None else self.private, algorithm or self.algorithm, headers)


def claims(iss: str, sub: str | None = None, *, audience=AUDIENCE, lifetime: float = 600, **more) -> dict:
    """A subject token's claims: issued now, expiring in `lifetime` seconds."""
    now = int(time.time())
    made = {"iss": iss, "aud": audience, "sub": sub or f"user-{uuid.uuid4().hex[:10]}", "iat": now}
    made["exp"] = now + int(lifetime)
    return {**made, **more}


def exchange_form(token: str, **fields) -> dict:
    """The form of a token exchange."""
    return {"grant_type": EXCHANGE, "subject_token": token, "subject_token_type": JWT_TYPE, **fields}


@dataclass
class KeySetServer:
    """A JWKS endpoint on 127.0.0.1: answers each path's key set as JSON, and counts the requests per path."""

    sets: dict[str, dict] = field(default_factory=dict)
    requests: dict[str, int] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self) -> KeySetServer:
        keys = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):  # quiet
                pass

            def do_GET(self):  # noqa: N802 - the name http.server calls
                with keys.lock:
                    keys.requests[self.path] = keys.requests.get(self.path, 0) + 1
                    found = keys.sets.get(self.path)
                body = json.dumps(found).encode() if found is not None else b"{}"
                self.send_response(200 if found is not None else 404)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def publish(self, path: str, *signers: Signer) -> str:
        """Serve these keys' public halves at `path`; its URL."""
        with self.lock:
            self.sets[path] = {"keys": [signer.jwk() for signer in signers]}
        return self.url(path)

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}{path}"

    def fetches(self, path: str) -> int:
        with self.lock:
            return self.requests.get(path, 0)
