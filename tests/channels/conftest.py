"""Fixtures for channels: people and keys who manage or read them, and a record of announced changes."""

from __future__ import annotations

import pytest

from app.apikeys.store import create_key
from app.auth.users import create_user
from app.channels import grants
from app.channels.namespaces import Namespace, put_namespace
from app.channels.presence import PresenceKeeper
from tests.utils import DEFAULT_PASSWORD, bearer, random_email


@pytest.fixture
def new_user(app, auth):
    """A user made in Redis and logged in: its tokens, id and a bearer header."""

    def make(role: str = "user") -> dict:
        email = random_email()
        with app.app_context():
            user = create_user(email, DEFAULT_PASSWORD, role=role)
        tokens = auth.login_body(email)
        return {**tokens, "id": user["id"], "email": email, "headers": bearer(tokens["access_token"])}

    return make


@pytest.fixture
def admin(new_user) -> dict:
    return new_user("admin")


@pytest.fixture
def user(new_user) -> dict:
    return new_user()


@pytest.fixture
def key(app):
    """A bearer header for a new API key with the given scopes and publish channels."""

    def make(*scopes: str, channels: tuple[str, ...] = ()) -> dict:
        with app.app_context():
            raw, _ = create_key("channels test", list(scopes), list(channels))
        return bearer(raw)

    return make


@pytest.fixture
def namespace(app, rdb):
    """Define a namespace directly in Redis (no announcement), as the API would store it."""

    def define(name: str = "chat", **rules) -> Namespace:
        defined = Namespace(name, **rules)
        put_namespace(rdb, defined)
        return defined

    return define


@pytest.fixture
def granted(app, rdb):
    """Grant a user a channel directly in Redis, as the API would store it."""

    def grant(channel: str, user_id: str, info=None, expires_in=None) -> None:
        with app.app_context():
            assert grants.grant(app.extensions["redis"], channel, user_id, info, expires_in)

    return grant


@pytest.fixture
def announced(app, monkeypatch) -> list[tuple]:
    """Every access change announced on the bus, as (reason, channel, namespace, user_id); still sent."""
    bus = app.extensions["event_bus"]
    seen: list[tuple] = []
    announce = bus.announce_access_changed

    def record(reason, *, channel=None, namespace=None, user_id=None):
        seen.append((reason, channel, namespace, user_id))
        announce(reason, channel=channel, namespace=namespace, user_id=user_id)

    monkeypatch.setattr(bus, "announce_access_changed", record)
    return seen


class Clock:
    """A module's `time`, moved on at will: expiry is judged without waiting for it."""

    def __init__(self, real):
        self.real = real
        self.ahead = 0.0

    def time(self) -> float:
        return self.real.time() + self.ahead


@pytest.fixture
def clock(monkeypatch):
    """The time the channel modules judge expiry by; `clock.ahead = 3600` is an hour from now."""
    import time

    from app.channels import access

    fake = Clock(time)
    monkeypatch.setattr(grants, "time", fake)
    monkeypatch.setattr(access, "time", fake)
    return fake


@pytest.fixture
def keepers(rdb):
    """Make keepers (each as one worker's) on the session's Redis; their greenlets stop after the test."""
    made = []

    def make(timeout: float = 60, client=None, linger: float = 0.0, **options) -> PresenceKeeper:
        keeper = PresenceKeeper(client or rdb, timeout, linger_seconds=linger, **options)
        made.append(keeper)
        return keeper

    yield make
    for keeper in made:
        keeper.stop()
