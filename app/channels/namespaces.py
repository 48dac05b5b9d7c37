"""Namespaces: the rules of the channels `<namespace>:<name>`, every namespace's JSON in one hash.

A namespace whose subscribers the application's backend decides (`subscribe: proxy`) also keeps the URL it
is asked at and the secret its requests are signed with. The secret is made by the write that makes the
namespace a proxy one (or rotates it), kept by every later write, and never answered by a listing.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from ..errors import validation_failed
from ..outgoing.signing import new_secret
from ..redis import Keys, read_together

RESERVED = frozenset({"user", "broadcast", "webhooks", "admin"})
NAMESPACE_PATTERN = r"[a-z0-9_-]{1,32}"
CHANNEL_NAME_PATTERN = r"[A-Za-z0-9_.=@-]{1,95}"
NAMED_CHANNEL = re.compile(rf"({NAMESPACE_PATTERN}):({CHANNEL_NAME_PATTERN})")
SUBSCRIBE_RULES = ("members", "authenticated", "proxy", "org_members", "org_admins")
BY_GRANT = ("members", "proxy")  # the rules under which a user needs a grant in force to read a channel
# The rules under which a channel `<ns>:<org id>` or `<ns>:<org id>.<name>` is read by the organization's
# members, with the roles each admits.
BY_ORG = {"org_members": ("owner", "admin", "member"), "org_admins": ("owner", "admin")}
RULES = ("subscribe", "publish", "presence", "join_leave")
PUBLISH_RULES = ("server", "subscribers")


@dataclass(frozen=True)
class Namespace:
    """Who may subscribe to and publish on a namespace's channels, and whether presence is kept."""

    name: str
    subscribe: str = "members"
    publish: str = "server"
    presence: bool = False
    join_leave: bool = False
    proxy_url: str | None = None  # subscribe: proxy only
    # What a proxy namespace's requests are signed with (when storing: the one to take if none is kept).
    # Never compared nor in a repr.
    proxy_secret: str | None = field(default=None, compare=False, repr=False)
    rotate_secret: bool = field(default=False, compare=False, repr=False)  # asked, not stored
    # Joins and leaves go out together, as one `presence.diff` every PRESENCE_DIFF_SECONDS (needs join_leave).
    presence_diff: bool = False

    @property
    def by_grant(self) -> bool:
        """Whether a user (not an admin) reads its channels only under a grant in force."""
        return self.subscribe in BY_GRANT

    @property
    def by_org(self) -> bool:
        """Whether a user (not an admin) reads its channels only as a member of the organization they name."""
        return self.subscribe in BY_ORG

    def admits_role(self, role: str | None) -> bool:
        """Whether a member with `role` in a channel's organization may read it (org namespaces only)."""
        return role in BY_ORG.get(self.subscribe, ())

    def as_json(self) -> dict:
        """The name and rules, as audit entries record them: never the proxy's URL (it may hold a credential)
        nor its secret."""
        shown = {"name": self.name, **{rule: getattr(self, rule) for rule in RULES}}
        if self.presence_diff:  # only where it is set: every other namespace's N stays as it was
            shown["presence_diff"] = True
        return shown

    def answer(self) -> dict:
        """`N`: the namespace as answers show it, a proxy namespace's URL included (its secret never)."""
        shown = self.as_json()
        if self.subscribe == "proxy":
            shown["proxy_url"] = self.proxy_url
        return shown

    def stored(self) -> dict:
        """What the namespaces hash keeps (without the secret, which the storing script adds)."""
        return self.answer()


def split_channel(channel: str) -> tuple[str, str] | None:
    """(namespace, name) of a named channel `<ns>:<name>` (ns 1-32 of a-z0-9_-, name 1-95 of
    A-Za-z0-9_.=@-), None when `channel` is not of that shape (caller decides 400)."""
    matched = NAMED_CHANNEL.fullmatch(channel)
    return (matched[1], matched[2]) if matched else None


def org_of_channel(name: str) -> str:
    """The organization a channel name of an org namespace names: `<org id>` or `<org id>.<name>` ('' for none)."""
    return name.partition(".")[0]


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
    if namespace.presence_diff and not namespace.join_leave:
        raise validation_failed("presence_diff needs join_leave.")
    if (namespace.subscribe == "proxy") != bool(namespace.proxy_url):
        raise validation_failed("proxy_url is needed with subscribe: proxy, and only then.")
    if namespace.rotate_secret and namespace.subscribe != "proxy":
        raise validation_failed("rotate_proxy_secret needs subscribe: proxy.")
    return namespace


@functools.lru_cache(maxsize=1024)
def parse_namespace(name: str, stored: str | None) -> Namespace | None:
    """A namespace as its rules are stored (None when nothing is). The same stored text always makes the same
    (frozen) namespace, so the last ones made are kept: nothing is kept but what Redis answered."""
    return Namespace(**{**json.loads(stored), "name": name}) if stored else None


def get_namespaces(client, names: Iterable[str], read: dict | None = None) -> dict[str, Namespace | None]:
    """Each named namespace, None for one that does not exist (one HMGET, sent with other requests' reads). `read`:
    the stored texts this request has read already, by name (`namespaces_read`); used when it holds every name."""
    names = sorted(set(names))
    if not names:
        return {}
    if read is not None and all(name in read for name in names):
        stored = [read[name] for name in names]
    else:
        (stored,) = read_together(client, [read_namespaces(names)])
    return {name: parse_namespace(name, value) for name, value in zip(names, stored, strict=True)}


def namespaces_named(channels: Iterable[str]) -> set[str]:
    """The namespaces the well-formed named channels among `channels` name (never a reserved one)."""
    return {split[0] for channel in channels if (split := split_channel(channel)) and split[0] not in RESERVED}


def read_namespaces(names: list[str]) -> tuple:
    """The command (name, args, kwargs) that reads the stored texts of the namespaces `names`."""
    return ("hmget", (Keys.namespaces(), names), {})


def get_namespace(client, name: str) -> Namespace | None:
    """One namespace, or None."""
    return parse_namespace(name, client.hget(Keys.namespaces(), name))


# KEYS[1] the namespaces hash. ARGV: the name, its JSON without its closing brace, a fresh secret ('' for a
# namespace that is not a proxy one), '1' to store that secret whatever is stored. A proxy namespace keeps the
# secret stored with it unless asked to rotate; one that becomes a proxy namespace takes the fresh one.
# In one step, so two writes at once agree on one secret (the one each reads back).
PUT_NAMESPACE_LUA = """
local secret = ARGV[3]
if secret ~= '' and ARGV[4] ~= '1' then
  local held = redis.call('HGET', KEYS[1], ARGV[1])
  if held then
    local ok, stored = pcall(cjson.decode, held)
    if ok and type(stored) == 'table' and stored['subscribe'] == 'proxy' then
      if type(stored['proxy_secret']) == 'string' then secret = stored['proxy_secret'] end
    end
  end
end
local value = ARGV[2] .. '}'
if secret ~= '' then value = ARGV[2] .. ',"proxy_secret":' .. cjson.encode(secret) .. '}' end
redis.call('HSET', KEYS[1], ARGV[1], value)
return 1
"""


def put_namespace(client, namespace: Namespace) -> None:
    """Create or replace a namespace (422 for a bad name or rules). A proxy namespace keeps its stored secret,
    unless it rotates it or has none: then it takes `namespace.proxy_secret` (a fresh one when that is None;
    whoever shows the secret passes its own and reads back whether it was taken)."""
    validate_namespace(namespace)
    head = json.dumps(namespace.stored(), separators=(",", ":"))[:-1]  # the script adds the secret, if any
    secret = (namespace.proxy_secret or new_secret()) if namespace.subscribe == "proxy" else ""
    rotate = "1" if namespace.rotate_secret else "0"
    client.register_script(PUT_NAMESPACE_LUA)(keys=[Keys.namespaces()], args=[namespace.name, head, secret, rotate])


def delete_namespace(client, name: str) -> bool:
    """Delete a namespace; False if there was none. Grants in it stay, and count again if it is re-created."""
    return client.hdel(Keys.namespaces(), name) == 1


def list_namespaces(client) -> list[Namespace]:
    """Every namespace, by name."""
    return [parse_namespace(name, value) for name, value in sorted(client.hgetall(Keys.namespaces()).items())]
