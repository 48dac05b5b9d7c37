"""Namespaces: the rules of the channels `<namespace>:<name>`, every namespace's JSON in one hash."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import asdict, dataclass

from ..errors import validation_failed
from ..redis import Keys

RESERVED = frozenset({"user", "broadcast", "webhooks", "admin"})
NAMESPACE_PATTERN = r"[a-z0-9_-]{1,32}"
CHANNEL_NAME_PATTERN = r"[A-Za-z0-9_.=@-]{1,95}"
NAMED_CHANNEL = re.compile(rf"({NAMESPACE_PATTERN}):({CHANNEL_NAME_PATTERN})")
SUBSCRIBE_RULES = ("members", "authenticated")
PUBLISH_RULES = ("server", "subscribers")


@dataclass(frozen=True)
class Namespace:
    """Who may subscribe to and publish on a namespace's channels, and whether presence is kept."""

    name: str
    subscribe: str = "members"
    publish: str = "server"
    presence: bool = False
    join_leave: bool = False

    def as_json(self) -> dict:
        """`N`: the namespace as answers show it."""
        return asdict(self)


def split_channel(channel: str) -> tuple[str, str] | None:
    """(namespace, name) of a named channel `<ns>:<name>` (ns 1-32 of a-z0-9_-, name 1-95 of
    A-Za-z0-9_.=@-), None when `channel` is not of that shape (caller decides 400)."""
    matched = NAMED_CHANNEL.fullmatch(channel)
    return (matched[1], matched[2]) if matched else None


def validate_namespace(namespace: Namespace) -> Namespace:
    """The namespace, or 422 naming what is wrong with its name or rules."""
    if not re.fullmatch(NAMESPACE_PATTERN, namespace.name):
        raise validation_failed("A namespace name must be 1-32 of a-z, 0-9, '_' and '-'.")
    if namespace.name in RESERVED:
        raise validation_failed(f"The namespace name {namespace.name!r} is reserved.")
    if namespace.subscribe not in SUBSCRIBE_RULES or namespace.publish not in PUBLISH_RULES:
        raise validation_failed(f"subscribe must be one of {SUBSCRIBE_RULES}, publish one of {PUBLISH_RULES}.")
    if namespace.join_leave and not namespace.presence:
        raise validation_failed("join_leave needs presence.")
    return namespace


def parse_namespace(name: str, stored: str | None) -> Namespace | None:
    """A namespace as its rules are stored (None when nothing is)."""
    return Namespace(**{**json.loads(stored), "name": name}) if stored else None


def get_namespaces(client, names: Iterable[str]) -> dict[str, Namespace | None]:
    """Each named namespace, None for one that does not exist (one HMGET)."""
    names = sorted(set(names))
    stored = client.hmget(Keys.namespaces(), names) if names else []
    return {name: parse_namespace(name, value) for name, value in zip(names, stored, strict=True)}


def get_namespace(client, name: str) -> Namespace | None:
    """One namespace, or None."""
    return parse_namespace(name, client.hget(Keys.namespaces(), name))


def put_namespace(client, namespace: Namespace) -> None:
    """Create or replace a namespace (422 for a bad name or rules)."""
    validate_namespace(namespace)
    client.hset(Keys.namespaces(), namespace.name, json.dumps(namespace.as_json(), separators=(",", ":")))


def delete_namespace(client, name: str) -> bool:
    """Delete a namespace; False if there was none. Grants in it stay, and count again if it is re-created."""
    return client.hdel(Keys.namespaces(), name) == 1


def list_namespaces(client) -> list[Namespace]:
    """Every namespace, by name."""
    return [parse_namespace(name, value) for name, value in sorted(client.hgetall(Keys.namespaces()).items())]
