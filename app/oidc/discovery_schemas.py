"""What `/.well-known/openid-configuration` and `/.well-known/jwks.json` answer."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from ..schemas import Answer


class PublicJwk(Answer):
    """A public signing key (RFC 7517): its key type's public members (`n` and `e`, `crv` with `x` and `y`, or
    `crv` and `x`), and never a private one."""

    kty: Literal["RSA", "EC", "OKP"]
    kid: str = Field(description="The key's RFC 7638 thumbprint; a token's header names it.")
    alg: Literal["RS256", "ES256", "EdDSA"]
    use: Literal["sig"]


class JwkSet(Answer):
    """The public keys that verify the service's tokens: every OpenID provider key that signs, or signed tokens
    still alive, and the access-token key when `JWT_ALGORITHM` is asymmetric."""

    keys: list[PublicJwk]


class DiscoveryDocument(Answer):
    """OpenID Connect Discovery 1.0 metadata (RFC 8414 names), built from the settings only."""

    issuer: str = Field(description="`OIDC_ISSUER` (default `PUBLIC_BASE_URL`).")
    authorization_endpoint: str
    token_endpoint: str
    userinfo_endpoint: str
    jwks_uri: str
    revocation_endpoint: str
    end_session_endpoint: str
    introspection_endpoint: str
    response_types_supported: list[str]
    response_modes_supported: list[str]
    grant_types_supported: list[str]
    subject_types_supported: list[str]
    id_token_signing_alg_values_supported: list[str]
    code_challenge_methods_supported: list[str]
    token_endpoint_auth_methods_supported: list[str]
    revocation_endpoint_auth_methods_supported: list[str]
    scopes_supported: list[str]
    claims_supported: list[str]
    backchannel_logout_supported: bool
    backchannel_logout_session_supported: bool
    frontchannel_logout_supported: bool
    authorization_response_iss_parameter_supported: bool
    request_parameter_supported: bool
    request_uri_parameter_supported: bool
    claims_parameter_supported: bool
