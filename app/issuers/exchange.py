"""The token exchange itself: a trusted issuer's token becomes an ordinary session of the user that issuer
and its `sub` name; and the end of every session an issuer's tokens made, when the issuer is deleted.

An exchange checks the token (keys.py), finds or makes the user (app/auth/users.py), grants the channels
the token lists (app/channels/manage.py), then starts the session as every login does. An issuer deleted
while an exchange runs takes that exchange's session with it: the exchange looks once more after starting
the session, and the deletion ends the sessions of every user its exchanges made or found.
"""

from __future__ import annotations

from dataclasses import dataclass

import gevent
import jwt
from flask import current_app
from jwt.exceptions import PyJWTError

from .. import audit
from ..auth import emails, sessions, users
from ..channels import manage
from ..redis import Keys, get_redis
from . import store
from .keys import IssuerKeys, TokenRefused

SWEEP_BATCH = 200  # users per step when an issuer's sessions end


@dataclass(frozen=True)
class Exchanged:
    """What an accepted subject token came to: the user, its new session, and the issuer that vouched."""

    user: dict
    session: sessions.IssuedSession
    issuer: store.Issuer


def _keys() -> IssuerKeys:
    return current_app.extensions["issuer_keys"]


def exchange(subject_token: str, device: str | None, ip: str | None) -> Exchanged:
    """Start a session for the user a trusted issuer's token names; TokenRefused when no issuer accepts it."""
    issuer, claims = verified(subject_token)
    user = users.find_or_create_external_user(issuer.name, claims["sub"], _email(claims.get(issuer.email_claim)))
    get_redis().sadd(Keys.issuer_users(issuer.name), user["id"])  # before the session: a deletion finds it
    if issuer.channels_claim is not None:
        channels = claims.get(issuer.channels_claim)
        info = claims.get(issuer.info_claim) if issuer.info_claim is not None else None
        manage.apply_source_grants(
            user["id"],
            issuer.source,
            [name for name in channels if isinstance(name, str)] if isinstance(channels, list) else [],
            info if isinstance(info, dict) else None,
            float(claims["exp"]),
        )
    login = {"method": "token_exchange", "issuer": issuer.name}
    session = sessions.start_session(user["id"], device, ip, login, proves_factor=False)
    if store.get_issuer(get_redis(), issuer.name) is None:  # deleted meanwhile: its sweep may have missed this
        sessions.end_session(user["id"], session.session_id)
        raise TokenRefused("The issuer is no longer trusted.")
    return Exchanged(user, session, issuer)


def verified(subject_token: str) -> tuple[store.Issuer, dict]:
    """The issuer that vouches for the token, and its claims; TokenRefused when none does.

    Only the issuers whose `issuer` is the token's unverified `iss` are tried: a token must verify with the
    keys of the issuer it names, never with another issuer's.
    """
    iss = _unverified_issuer(subject_token)
    candidates = store.issuers_of(get_redis(), iss)
    if not candidates:
        raise TokenRefused("No trusted issuer has the subject token's iss.")
    refusal = None
    for issuer in candidates:
        try:
            return issuer, _keys().verify(issuer, subject_token)
        except TokenRefused as refused:
            refusal = refused
    raise refusal


def _unverified_issuer(subject_token: str) -> str:
    """The `iss` the token names, read before anything of it is trusted: only to choose whose keys to try."""
    try:
        iss = jwt.decode(subject_token, options={"verify_signature": False}).get("iss")
    except PyJWTError:
        raise TokenRefused("The subject token is not a valid JWT.") from None
    if not isinstance(iss, str) or not iss:
        raise TokenRefused("The subject token lacks the claim iss.")
    return iss


def _email(claimed) -> str | None:
    """The e-mail the token gives, when it is one plain address; else none (never stored, so never mailed)."""
    if not isinstance(claimed, str):
        return None
    try:
        return emails.plain_address(claimed)
    except emails.NotPlainAddress:
        return None


def end_sessions(name: str) -> int:
    """End every session of every user the issuer's exchanges made or found (tokenVersion + 1, sessions
    ended, live connections closed, as logging out everywhere does); how many users had them ended."""
    client = get_redis()
    ended = 0
    batch: list[str] = []
    for user_id in client.sscan_iter(Keys.issuer_users(name), count=SWEEP_BATCH):
        batch.append(user_id)
        if len(batch) == SWEEP_BATCH:
            ended += _end_batch(name, batch)
            batch = []
            gevent.sleep(0)  # a large issuer: let the worker's other greenlets run in between
    ended += _end_batch(name, batch)
    client.delete(Keys.issuer_users(name))
    return ended


def _end_batch(name: str, user_ids: list[str]) -> int:
    ended = 0
    for user_id in user_ids:
        user = users.get_user(user_id)
        if user is None or user.get("external_issuer") != name:
            continue  # deleted since (its record is gone: ending would make a stub of it)
        sessions.logout_all(user_id, "session.revoked")
        ended += 1
    return ended


def record_refusal(refused: TokenRefused) -> None:
    """A refused exchange, recorded as a failed login by the service (nothing of the token but why)."""
    audit.record("login.failed", actor=audit.SYSTEM, details={"method": "token_exchange", "reason": str(refused)})
