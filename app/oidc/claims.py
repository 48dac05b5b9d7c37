"""What the provider says about a user, per scope (the ID token and userinfo), and the ID token itself.

`openid` gives `sub` (the user id). `email` gives `email` and `email_verified`. The service keeps no name, so
`profile` gives `preferred_username`: the local part of the e-mail address (a display name, not an identifier:
it need not be unique; the consent page says so). `orgs` gives `orgs`: the organizations the user belongs to,
`[{"id", "name", "role"}]`, as they are when the claims are made. `events` and `offline_access` are about what the
tokens may do, not about the user.

ID tokens are signed with the provider's current key by `keys.sign` (PyJWT), not by joserfc's `jwt.encode` that
Authlib's OpenIDCode calls: joserfc flags EdDSA, one of the algorithms the provider offers, as deprecated.
"""

from __future__ import annotations

import time

from authlib.oauth2.rfc6749.util import scope_to_list
from authlib.oidc.core import UserInfo
from authlib.oidc.core.util import create_half_hash

from ..auth.sessions import member_role
from ..redis import Keys, get_redis
from . import keys
from .issuer import issuer

ID_TOKEN_SECONDS = 900


def user_claims(user: dict, scope: str) -> UserInfo:
    """The claims about `user` (U, its public fields) that `scope` lets a client have."""
    scopes = set(scope_to_list(scope) or ())
    claims = UserInfo(sub=user["id"])
    email = user.get("email")
    if "email" in scopes and email:
        claims.update(email=email, email_verified=bool(user.get("email_verified")))
    if "profile" in scopes and email:
        claims["preferred_username"] = email.rpartition("@")[0]
    if "orgs" in scopes:
        claims["orgs"] = user_orgs(user["id"])
    return claims


def user_orgs(user_id: str) -> list[dict]:
    """The user's organizations, `[{"id", "name", "role"}]` by id: the user's index names them, and each one's
    own members (the authority) confirm the membership and give the role; a name read from its record."""
    client = get_redis()
    org_ids = sorted(client.hkeys(Keys.user_orgs(user_id)))
    if not org_ids:
        return []
    pipe = client.pipeline(transaction=False)  # each organization in its own slot: fine across slots
    for org_id in org_ids:
        pipe.hget(Keys.org_members(org_id), user_id)
        pipe.hget(Keys.org(org_id), "name")
    answers = pipe.execute()
    found = []
    for org_id, stored, name in zip(org_ids, answers[::2], answers[1::2], strict=True):
        role = member_role(stored)
        if role is not None and name is not None:
            found.append({"id": org_id, "name": name, "role": role})
    return found


def id_token(
    client_id: str,
    user: dict,
    scope: str,
    access_token: str,
    session_id: str,
    auth_time: int,
    amr: list[str],
    nonce: str | None,
) -> str:
    """An ID token for `client_id` about `user`, in the client session `session_id`, with `at_hash` of the access
    token issued beside it."""
    signer = keys.signing_key()
    now = int(time.time())
    claims = {
        "iss": issuer(),
        "sub": user["id"],
        "aud": client_id,
        "iat": now,
        "exp": now + ID_TOKEN_SECONDS,
        "auth_time": int(auth_time),
        "sid": session_id,
        "amr": list(amr),
        "at_hash": create_half_hash(access_token, signer.alg).decode(),
        **user_claims(user, scope),
    }
    if nonce:
        claims["nonce"] = nonce
    return keys.sign(claims, signer=signer)
