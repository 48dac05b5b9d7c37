"""The Redis client, every key name, and the Lua scripts that make multi-key changes atomic.

The Lua scripts build a few key names themselves (a record names its family or owner only at run time);
they follow the same patterns as `Keys` below, which is the one place to change them.
"""

from __future__ import annotations

import os
from urllib.parse import urlsplit

import redis
from flask import Flask, current_app
from redis.backoff import NoBackoff
from redis.cluster import ClusterNode
from redis.retry import Retry


class Keys:
    """Every Redis key name, built in one place."""

    @staticmethod
    def user(user_id: str) -> str:
        """The user's record (a hash)."""
        return f"user:{user_id}"

    @staticmethod
    def user_by_email(email: str) -> str:
        """The id of the user with this e-mail."""
        return f"user:email:{email}"

    @staticmethod
    def user_by_identity(provider: str, subject: str) -> str:
        """The id of the user an OAuth provider knows by this subject."""
        return f"user:identity:{provider}:{subject}"

    @staticmethod
    def user_sessions(user_id: str) -> str:
        """The ids of the user's sessions (a set)."""
        return f"user:{user_id}:sessions"

    @staticmethod
    def session(session_id: str) -> str:
        """One session (device): its record, also the head of its refresh family."""
        return f"session:{session_id}"

    @staticmethod
    def session_tokens(session_id: str) -> str:
        """Every refresh-token hash of one family (family id == session id)."""
        return f"session:{session_id}:tokens"

    @staticmethod
    def refresh_token(token_hash: str) -> str:
        """One refresh token's record, under its SHA-256."""
        return f"refresh:{token_hash}"

    @staticmethod
    def connection_leases(user_id: str) -> str:
        """The user's live connections across every worker and instance (a sorted set of leases)."""
        return f"user:{user_id}:connections"

    @staticmethod
    def api_key(key_hash: str) -> str:
        """One API key's record, under the key's SHA-256."""
        return f"apikey:{key_hash}"

    @staticmethod
    def api_key_hash(key_id: str) -> str:
        """The SHA-256 of the API key with this id (to delete it by id)."""
        return f"apikey:id:{key_id}"

    @staticmethod
    def api_keys() -> str:
        """The ids of every API key (a set)."""
        return "apikeys"

    @staticmethod
    def stream(channel: str) -> str:
        """A channel's event history (a stream)."""
        return f"events:{{{channel}}}"

    @staticmethod
    def stream_channel(key: str) -> str:
        """The channel whose history a stream key holds (the inverse of `stream`)."""
        return key.removeprefix("events:{").removesuffix("}")

    @staticmethod
    def webhook_delivery(provider: str, delivery_id: str) -> str:
        """One received webhook delivery, under its id."""
        return f"webhook:{provider}:delivery:{delivery_id}"

    @staticmethod
    def webhook_seen(provider: str, identity: str) -> str:
        """Marks a further identity of a recorded delivery (e.g. its body's hash) as seen."""
        return f"webhook:{provider}:seen:{identity}"

    @staticmethod
    def webhook_pending() -> str:
        """Recorded deliveries not yet published, scored by when they are due."""
        return "webhook:pending"

    @staticmethod
    def oauth_state_used(state_hash: str) -> str:
        """Marks an OAuth state as used, so a replayed state cookie cannot use it twice."""
        return f"oauth:state-used:{state_hash}"

    @staticmethod
    def users() -> str:
        """Every user id, scored by creation time (a sorted set), for listing."""
        return "users"

    @staticmethod
    def users_indexed() -> str:
        """Set once the users created before the list existed have been added to it."""
        return "users:indexed"

    @staticmethod
    def user_recovery_codes(user_id: str) -> str:
        """SHA-256 hashes of the user's unused MFA recovery codes (a set)."""
        return f"user:{user_id}:recovery"

    @staticmethod
    def user_mail_token(user_id: str, purpose: str) -> str:
        """The hash of the user's newest mailed token of this purpose (only the newest is valid)."""
        return f"user:{user_id}:mailtoken:{purpose}"

    @staticmethod
    def mail_token(purpose: str, token_hash: str) -> str:
        """One mailed token (verification or reset), under its SHA-256."""
        return f"mailtoken:{purpose}:{token_hash}"

    @staticmethod
    def verification_resent(user_id: str) -> str:
        """Set while a refused login's fresh verification mail is recent (one per cool-down)."""
        return f"user:{user_id}:verification-resent"

    @staticmethod
    def mfa_login(token_hash: str) -> str:
        """A half-finished login waiting for its second factor, under the mfa_token's SHA-256."""
        return f"mfa:{token_hash}"

    @staticmethod
    def mail_job(job_id: str) -> str:
        """One queued mail (what to send and to whom, never a token)."""
        return f"mail:job:{job_id}"

    @staticmethod
    def mail_queue() -> str:
        """Queued mail ids scored by when they are next due (claimed ones: when their lease ends)."""
        return "mail:queue"

    @staticmethod
    def webhook_log(provider: str) -> str:
        """A provider's recent delivery ids, newest first."""
        return f"webhook:{provider}:log"

    # Outgoing webhooks (app/outgoing/). Each endpoint's keys share the endpoint's hash tag.

    @staticmethod
    def outgoing_endpoints() -> str:
        """The ids of every outgoing endpoint (a set, its own slot); the feed is fed only while it exists.

        An id is added after its endpoint's record is written and removed after the record is deleted,
        so an id whose record is missing is a deletion interrupted half-way: it counts as gone.
        """
        return "outgoing:endpoints"

    @staticmethod
    def outgoing_endpoints_version() -> str:
        """Bumped on every endpoint change, so delivery processes know to reload their copy."""
        return "outgoing:endpoints:version"

    @staticmethod
    def outgoing_endpoint(endpoint_id: str) -> str:
        """One endpoint's record (a hash): url, filters, secrets, state."""
        return f"outgoing:{{{endpoint_id}}}:endpoint"

    @staticmethod
    def outgoing_queue(endpoint_id: str) -> str:
        """The endpoint's messages due now (a stream with the `deliver` consumer group)."""
        return f"outgoing:{{{endpoint_id}}}:queue"

    @staticmethod
    def outgoing_messages(endpoint_id: str) -> str:
        """The endpoint's recent message ids, scored by creation time."""
        return f"outgoing:{{{endpoint_id}}}:messages"

    @staticmethod
    def outgoing_pending(endpoint_id: str) -> str:
        """The endpoint's messages not yet delivered or failed, scored by creation time (its backlog)."""
        return f"outgoing:{{{endpoint_id}}}:pending"

    @staticmethod
    def outgoing_message(endpoint_id: str, message_id: str) -> str:
        """One message (a hash): the body sent, its status and schedule."""
        return f"outgoing:{{{endpoint_id}}}:message:{message_id}"

    @staticmethod
    def outgoing_attempts(endpoint_id: str, message_id: str) -> str:
        """One message's attempts, oldest first (a list of JSON objects)."""
        return f"outgoing:{{{endpoint_id}}}:attempts:{message_id}"

    @staticmethod
    def outgoing_feed() -> str:
        """Events waiting to be matched against the endpoints (a stream with the `dispatch` group).

        Standalone: the publish script appends to it. Cluster: app.outgoing.feed.feed_events does, as a
        step of its own after the event is stored and before the publish is answered.
        """
        return "outgoing:feed"

    @staticmethod
    def outgoing_retries(endpoint_id: str) -> str:
        """The endpoint's messages waiting for their next attempt (message ids), scored by when it is due."""
        return f"outgoing:{{{endpoint_id}}}:retries"

    @staticmethod
    def outgoing_legacy_retries() -> str:
        """The one retry set of earlier versions ("<endpoint>\\n<message>"); delivery drains it into the above."""
        return "outgoing:retries"

    @staticmethod
    def outgoing_consumer(name: str) -> str:
        """A delivery process's heartbeat; its entries are claimed by others once this expires."""
        return f"outgoing:consumer:{name}"


# Shared Lua: revoke every live token of a family and end its session. Used by reuse detection,
# per-device logout and logout-all so that all three end a session the same way.
_END_SESSION_LUA = """
local function end_session(sid, now)
  local skey = 'session:' .. sid
  local uid = redis.call('HGET', skey, 'user_id')
  local tkey = skey .. ':tokens'
  for _, h in ipairs(redis.call('SMEMBERS', tkey)) do
    local rkey = 'refresh:' .. h
    if redis.call('HGET', rkey, 'revoked_at') == '' then
      redis.call('HSET', rkey, 'revoked_at', now)
    end
  end
  redis.call('DEL', skey, tkey)
  if uid then redis.call('SREM', 'user:' .. uid .. ':sessions', sid) end
  return uid
end
"""

#: The Lua function `end_session(sid, now)`, for feature scripts that end sessions as part of a larger step.
END_SESSION_FUNCTION_LUA = _END_SESSION_LUA

# KEYS[1] user, KEYS[2] session. ARGV: user id, now, touch interval.
# One round trip for every authenticated request: the current tokenVersion, whether the session
# still exists and belongs to this user (touching last_used_at at most once a minute), and the
# user's public fields (`U`), so that most views need no second read.
VERIFY_ACCESS = """
local user = redis.call('HMGET', KEYS[1], 'token_version', 'email', 'role', 'email_verified')
local s = redis.call('HMGET', KEYS[2], 'user_id', 'last_used_at')
if s[1] ~= ARGV[1] then return {user[1], 0} end
if tonumber(ARGV[2]) - tonumber(s[2] or 0) >= tonumber(ARGV[3]) then
  redis.call('HSET', KEYS[2], 'last_used_at', ARGV[2])
end
return {user[1], 1, user[2], user[3], user[4] or '', redis.call('HEXISTS', KEYS[1], 'totp_secret')}
"""

# KEYS[1] the presented token's record, KEYS[2] the new token's record.
# ARGV: now, new expiry (epoch s), ttl (s), grace (s), presented hash, new hash.
# Returns {outcome, user_id, session_id, role, token_version}; outcome is
# rotated | grace | reused | invalid.
ROTATE_REFRESH = (
    _END_SESSION_LUA
    + """
local now, expires, ttl, grace = tonumber(ARGV[1]), ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
local rec = redis.call('HMGET', KEYS[1], 'user_id', 'family_id', 'expires_at', 'revoked_at')
local uid, sid, exp, revoked = rec[1], rec[2], rec[3], rec[4]
if not uid or tonumber(exp) <= now then return {'invalid'} end
local skey = 'session:' .. sid
local outcome = 'rotated'
if revoked ~= '' then
  local previous = redis.call('HGET', skey, 'previous_hash')
  if grace > 0 and previous == ARGV[5] and now - tonumber(revoked) <= grace then
    outcome = 'grace'
  else
    end_session(sid, ARGV[1])
    return {'reused', uid, sid}
  end
end
if redis.call('EXISTS', skey) == 0 then return {'invalid'} end
if outcome == 'rotated' then redis.call('HSET', KEYS[1], 'revoked_at', ARGV[1]) end
redis.call('HSET', KEYS[2], 'user_id', uid, 'family_id', sid, 'created_at', ARGV[1],
           'expires_at', expires, 'revoked_at', '')
redis.call('EXPIRE', KEYS[2], ttl)
local tkey = skey .. ':tokens'
redis.call('SADD', tkey, ARGV[6])
redis.call('EXPIRE', tkey, ttl)
if outcome == 'rotated' then redis.call('HSET', skey, 'previous_hash', ARGV[5]) end
redis.call('HSET', skey, 'current_hash', ARGV[6], 'last_used_at', ARGV[1], 'expires_at', expires)
redis.call('EXPIRE', skey, ttl)
local user = redis.call('HMGET', 'user:' .. uid, 'role', 'token_version')
return {outcome, uid, sid, user[1], user[2]}
"""
)

# ARGV: session id, now. Returns the owner's user id (or nil if the session was already gone).
END_SESSION = (
    _END_SESSION_LUA
    + """
return end_session(ARGV[1], ARGV[2])
"""
)

# KEYS[1] user, KEYS[2] the user's session set. ARGV: now, session id to keep ('' for none).
# Ends every session but the kept one; returns the ended session ids.
END_OTHER_SESSIONS = (
    _END_SESSION_LUA
    + """
local ended = {}
for _, sid in ipairs(redis.call('SMEMBERS', KEYS[2])) do
  if sid ~= ARGV[2] then
    end_session(sid, ARGV[1])
    table.insert(ended, sid)
  end
end
return ended
"""
)

# KEYS[1] user, KEYS[2] the user's session set. ARGV: now.
# Logout from all devices: tokenVersion + 1 and every session ended, in one step.
LOGOUT_ALL = (
    _END_SESSION_LUA
    + """
local version = redis.call('HINCRBY', KEYS[1], 'token_version', 1)
local ended = {}
for _, sid in ipairs(redis.call('SMEMBERS', KEYS[2])) do
  end_session(sid, ARGV[1])
  table.insert(ended, sid)
end
return {version, ended}
"""
)


# KEYS: index keys (e-mail, provider identity) then, last, the user record. ARGV: user id, then the
# record's field/value pairs. Creates the user only if no index key is taken; returns the position
# (1-based) of the first taken index key, or 0 on success. No half-written user on a conflict. The
# record needs a `created_at` field: the list of users (`Keys.users()`) is ordered by it.
CREATE_USER = """
local user_key = KEYS[#KEYS]
for i = 1, #KEYS - 1 do
  if redis.call('EXISTS', KEYS[i]) == 1 then return i end
end
for i = 1, #KEYS - 1 do redis.call('SET', KEYS[i], ARGV[1]) end
redis.call('HSET', user_key, unpack(ARGV, 2))
redis.call('ZADD', 'users', redis.call('HGET', user_key, 'created_at'), ARGV[1])
return 0
"""


class Scripts:
    """Registered scripts: redis-py sends EVALSHA and falls back to EVAL after a script flush."""

    def __init__(self, client: redis.Redis):
        self.create_user = client.register_script(CREATE_USER)
        self.verify_access = client.register_script(VERIFY_ACCESS)
        self.rotate_refresh = client.register_script(ROTATE_REFRESH)
        self.end_session = client.register_script(END_SESSION)
        self.end_other_sessions = client.register_script(END_OTHER_SESSIONS)
        self.logout_all = client.register_script(LOGOUT_ALL)


def connect(url: str, max_connections: int, mode: str = "standalone") -> redis.Redis:
    """A client whose pool is bounded, so thousands of greenlets share a few connections.

    In `cluster` mode `url` is one or more comma-separated seed nodes and the client is redis-py's
    cluster client, which routes each command to the node serving its hash slot (a bounded blocking
    pool per node).
    """
    options = {
        "decode_responses": True,
        "socket_connect_timeout": 3,
        "socket_keepalive": True,
        "health_check_interval": 30,
    }
    if mode == "cluster":
        seeds = [seed.strip() for seed in url.split(",") if seed.strip()]
        first = redis.connection.parse_url(seeds[0])
        nodes = [ClusterNode(*_host_port(seed)) for seed in seeds]
        extra = {k: v for k, v in first.items() if k in {"username", "password", "ssl", "ssl_cert_reqs"}}
        if urlsplit(seeds[0]).scheme == "rediss":
            extra["ssl"] = True
        return redis.RedisCluster(
            startup_nodes=nodes,
            connection_pool_class=_NodePool,
            max_connections=max_connections,
            **extra,
            **options,
        )
    pool = redis.BlockingConnectionPool.from_url(url, max_connections=max_connections, timeout=5, **options)
    return redis.Redis(connection_pool=pool)


class _NodePool(redis.BlockingConnectionPool):
    """A cluster node's pool: bounded, and a greenlet waits at most 5 s for a free connection."""

    def __init__(self, **kwargs):
        super().__init__(timeout=5, **kwargs)


def is_cluster(client) -> bool:
    """Whether `client` talks to a Redis Cluster."""
    return isinstance(client, redis.RedisCluster)


def _host_port(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    return parts.hostname or "127.0.0.1", parts.port or 6379


def connect_pubsub(url: str) -> redis.Redis:
    """A client for the event hub's one pub/sub connection, apart from the shared pool.

    No health-check PINGs (redis-py writes them from the listening greenlet, unsynchronised with the
    SUBSCRIBE another greenlet may be writing) and no reconnect inside redis-py: the hub itself
    reconnects, subscribes again and resynchronises its readers. Named `auth-rt-hub:<pid>` in
    `CLIENT LIST`, so each worker's subscriptions can be seen from Redis.
    """
    pool = redis.ConnectionPool.from_url(
        url,
        client_name=f"auth-rt-hub:{os.getpid()}",
        max_connections=1,
        decode_responses=True,
        socket_connect_timeout=3,
        socket_keepalive=True,
        health_check_interval=0,
        retry=Retry(NoBackoff(), 0, supported_errors=()),
    )
    return redis.Redis(connection_pool=pool)


def init_app(app: Flask) -> None:
    """Connect to Redis with a bounded pool and register the Lua scripts."""
    settings = app.config["SETTINGS"]
    client = connect(settings.redis_url, settings.redis_max_connections, settings.redis_mode)
    app.extensions["redis"] = client
    app.extensions["redis_scripts"] = Scripts(client)


def get_redis() -> redis.Redis:
    """This app's Redis client."""
    return current_app.extensions["redis"]


def get_script(source: str):
    """A script registered once per app (features keep their Lua beside their code)."""
    cache = current_app.extensions.setdefault("redis_script_cache", {})
    if source not in cache:
        cache[source] = get_redis().register_script(source)
    return cache[source]


def get_scripts() -> Scripts:
    """This app's registered Lua scripts."""
    return current_app.extensions["redis_scripts"]
