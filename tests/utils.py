"""Test helpers: random accounts, an auth helper over a test client, Set-Cookie parsing, Redis dumps."""

from __future__ import annotations

import uuid

DEFAULT_PASSWORD = "correct horse battery"


def random_email() -> str:
    return f"user-{uuid.uuid4().hex[:12]}@example.com"


class AuthActions:
    """Register and log in through the real endpoints, like flaskr's `auth` fixture."""

    def __init__(self, client):
        self.client = client

    def register(self, email: str | None = None, password: str = DEFAULT_PASSWORD) -> dict:
        email = email or random_email()
        response = self.client.post("/auth/register", json={"email": email, "password": password})
        assert response.status_code == 201, response.get_json()
        return {**response.get_json()["user"], "password": password}

    def login(self, email: str, password: str = DEFAULT_PASSWORD, transport: str = "body", device: str | None = None):
        body = {"email": email, "password": password, "transport": transport}
        if device:
            body["device"] = device
        return self.client.post("/auth/login", json=body)

    def login_body(self, email: str, password: str = DEFAULT_PASSWORD, device: str | None = None) -> dict:
        response = self.login(email, password, "body", device)
        assert response.status_code == 200, response.get_json()
        return response.get_json()

    def new_user_tokens(self, device: str | None = None) -> dict:
        user = self.register()
        return {**self.login_body(user["email"], device=device), "email": user["email"]}


def bearer(token: str) -> dict:
    return {"Authorization": f"Bearer {token}"}


def parse_set_cookies(headers: list[str]) -> dict[str, dict]:
    """Set-Cookie headers as {name: {"value", attribute: value-or-True}} (attribute names lower-case)."""
    parsed = {}
    for header in headers:
        name_value, *attributes = [part.strip() for part in header.split(";")]
        name, _, value = name_value.partition("=")
        attrs = {"value": value}
        for attribute in attributes:
            key, sep, attr_value = attribute.partition("=")
            attrs[key.lower()] = attr_value if sep else True
        parsed[name] = attrs
    return parsed


def redis_snapshot(client, ignore_prefixes: tuple[str, ...] = ("ratelimit",)) -> dict:
    """Every key and its value, to prove a request changed nothing (or to search for secrets)."""
    snapshot = {}
    for key in client.scan_iter(count=1000):
        if key.startswith(ignore_prefixes):
            continue
        kind = client.type(key)
        if kind == "string":
            snapshot[key] = client.get(key)
        elif kind == "hash":
            snapshot[key] = client.hgetall(key)
        elif kind == "set":
            snapshot[key] = sorted(client.smembers(key))
        elif kind == "zset":
            snapshot[key] = client.zrange(key, 0, -1, withscores=True)
        elif kind == "list":
            snapshot[key] = client.lrange(key, 0, -1)
        elif kind == "stream":
            snapshot[key] = client.xrange(key)
    return snapshot
