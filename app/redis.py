"""The Redis client, every key name, and the Lua scripts that make multi-key changes atomic.

Every key a script touches is passed to it in KEYS (never built inside it), and the keys of one script
share a hash tag, so each script runs on one hash slot of a Redis Cluster as well as on one Redis.
"""

from __future__ import annotations

import logging
import os
import select
import time
from urllib.parse import urlsplit

import gevent
import gevent.event
import gevent.monkey
import redis
import redis._parsers.hiredis as hiredis_parser
from flask import Flask, current_app
from redis.backoff import NoBackoff
from redis.cluster import ClusterNode
from redis.commands.core import Script
from redis.exceptions import NoScriptError
from redis.retry import Retry


class Keys:
    """Every Redis key name, built in one place.

    Keys that one atomic step (a Lua script or a MULTI) touches together share a hash tag, so that on a
    Redis Cluster they live in one hash slot: everything of one user under `{<user id>}` (record,
    sessions and their refresh families, refresh tokens, MFA and mailed tokens, passkeys, leases, and
    the audit entries about them, which outlive them), a
    channel's history under `{<channel>}`, a webhook provider's deliveries under `{<provider>}`, an
    outgoing endpoint's keys under `{<endpoint id>}`. Global indexes (e-mail, OAuth identity, a trusted
    issuer's subject, passkey credential id, the list of users, the admins, API keys, the audit log and
    its indexes by actor and type) are single keys changed in ordered single-slot steps (see `app/auth/indexes.py`, and
    `app/auth/users.py` for the admins, `app/audit/store.py` for the audit log).
    """

    # One user: all under the user's hash tag.

    @staticmethod
    def user(user_id: str) -> str:
        """The user's record (a hash)."""
        return f"user:{{{user_id}}}"

    @staticmethod
    def user_sessions(user_id: str) -> str:
        """The ids of the user's sessions (a set)."""
        return f"user:{{{user_id}}}:sessions"

    @staticmethod
    def session(user_id: str, session_id: str) -> str:
        """One session (device): its record, also the head of its refresh family."""
        return f"user:{{{user_id}}}:session:{session_id}"

    @staticmethod
    def session_tokens(user_id: str, session_id: str) -> str:
        """Every refresh-token hash of one family (family id == session id), to delete them with the user."""
        return f"user:{{{user_id}}}:session:{session_id}:tokens"

    @staticmethod
    def session_live_tokens(user_id: str, session_id: str) -> str:
        """The family's refresh-token hashes not revoked yet: what ending the session revokes."""
        return f"user:{{{user_id}}}:session:{session_id}:live"

    @staticmethod
    def refresh_token(user_id: str, token_hash: str) -> str:
        """One refresh token's record, under its SHA-256 (the token names its user, see auth/sessions.py)."""
        return f"user:{{{user_id}}}:refresh:{token_hash}"

    @staticmethod
    def connection_leases(user_id: str) -> str:
        """The user's live connections across every worker and instance (a sorted set of leases)."""
        return f"user:{{{user_id}}}:connections"

    @staticmethod
    def user_recovery_codes(user_id: str) -> str:
        """SHA-256 hashes of the user's unused MFA recovery codes (a set)."""
        return f"user:{{{user_id}}}:recovery"

    @staticmethod
    def user_mail_token(user_id: str, purpose: str) -> str:
        """The user's newest mailed token of this purpose (a hash: its SHA-256, address, expiry); only it is valid."""
        return f"user:{{{user_id}}}:mailtoken:{purpose}"

    @staticmethod
    def verification_resent(user_id: str) -> str:
        """Set while a refused login's fresh verification mail is recent (one per cool-down)."""
        return f"user:{{{user_id}}}:verification-resent"

    @staticmethod
    def mfa_login(user_id: str, token_hash: str) -> str:
        """A half-finished login waiting for its second factor, under the mfa_token's SHA-256."""
        return f"user:{{{user_id}}}:mfa:{token_hash}"

    @staticmethod
    def user_identities(user_id: str) -> str:
        """The identity-index keys (`user_by_identity`) that name this user (a set), to release them on delete."""
        return f"user:{{{user_id}}}:identities"

    @staticmethod
    def user_passkeys(user_id: str) -> str:
        """The user's passkeys (a hash: credential id, base64url, -> its record as JSON; see auth/passkeys.py)."""
        return f"user:{{{user_id}}}:passkeys"

    @staticmethod
    def passkey_registration(user_id: str) -> str:
        """The challenge of the user's last passkey registration options (five minutes, used once)."""
        return f"user:{{{user_id}}}:passkey-registration"

    # Global indexes: single keys, each changed on its own (claim, write the record, commit).

    @staticmethod
    def user_by_email(email: str) -> str:
        """The id of the user with this e-mail (`pending:<id>` while that user is being created)."""
        return f"user:email:{email}"

    @staticmethod
    def user_by_identity(provider: str, subject: str) -> str:
        """The id of the user an OAuth provider knows by this subject (`pending:<id>` while being created)."""
        return f"user:identity:{provider}:{subject}"

    @staticmethod
    def user_by_external(issuer: str, subject: str) -> str:
        """The id of the user a trusted issuer (by its name) knows by this `sub` (`pending:<id>` while being
        created). The name holds no colon, so the subject after it is unambiguous."""
        return f"user:external:{issuer}:{subject}"

    @staticmethod
    def user_by_passkey(credential_id: str) -> str:
        """The id of the user who registered this passkey (its credential id, base64url; `pending:<id>` while
        it is being registered): a credential id belongs to one account only."""
        return f"user:passkey:{credential_id}"

    @staticmethod
    def passkey_login(login_hash: str) -> str:
        """A passkey login's challenge, under the SHA-256 of its login_id (five minutes, used once).

        Global: the login options come before anyone says who they are.
        """
        return f"passkey:login:{login_hash}"

    @staticmethod
    def users() -> str:
        """Every user id, scored by creation time (a sorted set), for listing."""
        return "users"

    @staticmethod
    def admins() -> str:
        """The ids of the users whose role is admin (a set, its own slot), with the member `*` once built.

        Kept a subset of the admins: a promotion adds the id after the record says admin, a demotion or
        deletion removes it first, in the step that refuses to remove the last one.
        """
        return "admins"

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
    def oauth_state_used(state_hash: str) -> str:
        """Marks an OAuth state as used, so a replayed state cookie cannot use it twice."""
        return f"oauth:state-used:{state_hash}"

    # Event history.

    @staticmethod
    def stream(channel: str) -> str:
        """A channel's event history (a stream)."""
        return f"events:{{{channel}}}"

    @staticmethod
    def stream_channel(key: str) -> str:
        """The channel whose history a stream key holds (the inverse of `stream`)."""
        return key.removeprefix("events:{").removesuffix("}")

    # Channels of namespaces: a channel's keys share its stream's hash tag, so one Lua step can change
    # its members or presence and publish to it.

    @staticmethod
    def namespaces() -> str:
        """Every namespace's rules, by name (a hash of JSON)."""
        return "namespaces"

    @staticmethod
    def channel_members(channel: str) -> str:
        """The users granted a channel: user id -> JSON {"info", "expires_at", "start", "source"?} (a hash)."""
        return f"members:{{{channel}}}"

    @staticmethod
    def user_grants(user_id: str) -> str:
        """The channels a user is granted: channel -> expiry in epoch seconds, or "" (a hash)."""
        return f"user:{{{user_id}}}:grants"

    # Organizations (app/orgs/): one organization's keys share its hash tag `{org:<org id>}`, so one Lua step
    # can check and change its members (the last-owner rule) and its invitations together.

    @staticmethod
    def org(org_id: str) -> str:
        """An organization's record: id, name, created_at (a hash)."""
        return f"org:{{org:{org_id}}}"

    @staticmethod
    def org_members(org_id: str) -> str:
        """An organization's members: user id -> JSON {"role", "joined_at"} (a hash)."""
        return f"org:{{org:{org_id}}}:members"

    @staticmethod
    def org_invitations(org_id: str) -> str:
        """An organization's open invitations: invitation id -> JSON with the token's hash (a hash)."""
        return f"org:{{org:{org_id}}}:invitations"

    @staticmethod
    def org_channels(org_id: str) -> str:
        """The channels of org namespaces naming the organization that someone subscribed to (a set): where a
        member's loss of access is announced, in order with each channel's events."""
        return f"org:{{org:{org_id}}}:channels"

    @staticmethod
    def orgs() -> str:
        """Every organization's id, scored by creation time in ms (a sorted set), for the admins' listing."""
        return "orgs"

    @staticmethod
    def user_orgs(user_id: str) -> str:
        """The organizations a user belongs to: org id -> role (a hash), in the user's slot."""
        return f"user:{{{user_id}}}:orgs"

    # Presence (app/channels/presence.py owns these keys).

    @staticmethod
    def presence(channel: str) -> str:
        """A channel's present connections: "<user id>|<connection id>" scored by lease expiry (ms)."""
        return f"presence:{{{channel}}}"

    @staticmethod
    def presence_users(channel: str) -> str:
        """A channel's present users: user id -> number of connections (a hash)."""
        return f"presence:{{{channel}}}:users"

    @staticmethod
    def presence_sorted(channel: str) -> str:
        """A channel's present users again, each scored 0 so they list in id order (a sorted set): a
        snapshot of a big channel reads its first 1,000 without sorting them all."""
        return f"presence:{{{channel}}}:sorted"

    @staticmethod
    def presence_lingering(channel: str) -> str:
        """A channel's users whose leave is pending, scored by when it is due (ms): PRESENCE_LINGER_SECONDS."""
        return f"presence:{{{channel}}}:lingering"

    @staticmethod
    def presence_diff(channel: str) -> str:
        """A channel's joins and leaves not sent yet (presence_diff namespaces): user id -> 'j' or 'l' (a hash)."""
        return f"presence:{{{channel}}}:diff"

    @staticmethod
    def presence_channels() -> str:
        """Channels with present connections, scored by their earliest lease end or due leave (ms), for the
        reaper."""
        return "presence:channels"

    # Received webhooks: one provider's keys share its hash tag.

    @staticmethod
    def webhook_delivery(provider: str, delivery_id: str) -> str:
        """One received webhook delivery, under its id."""
        return f"webhook:{{{provider}}}:delivery:{delivery_id}"

    @staticmethod
    def webhook_seen(provider: str, identity: str) -> str:
        """Marks a further identity of a recorded delivery (e.g. its body's hash) as seen."""
        return f"webhook:{{{provider}}}:seen:{identity}"

    @staticmethod
    def webhook_pending(provider: str) -> str:
        """The provider's recorded deliveries not yet published, scored by when they are due."""
        return f"webhook:{{{provider}}}:pending"

    @staticmethod
    def webhook_log(provider: str) -> str:
        """A provider's recent delivery ids, newest first."""
        return f"webhook:{{{provider}}}:log"

    # The mail queue: one hash tag, so a job and its place in the queue change together.

    @staticmethod
    def mail_job(job_id: str) -> str:
        """One queued mail (what to send and to whom, never a token)."""
        return f"mail:{{queue}}:job:{job_id}"

    @staticmethod
    def mail_queue() -> str:
        """Queued mail ids scored by when they are next due (claimed ones: when their lease ends)."""
        return "mail:{queue}"

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

    # The audit log (app/audit/): every entry in the log, and again in the index of its subject, of its
    # actor and of its type. The subject's index shares the user's hash tag, so a script that changes a
    # user records the entry there in the same step; deleting the user leaves it (entries outlive users).

    @staticmethod
    def audit_log() -> str:
        """Every audit entry (a sorted set of "<id> <entry JSON>", all scored 0, so ordered by id)."""
        return "audit"

    @staticmethod
    def audit_subject(user_id: str) -> str:
        """The audit entries about one user (as `audit_log`), in the user's hash slot."""
        return f"audit:{{{user_id}}}"

    @staticmethod
    def audit_actor(actor: str) -> str:
        """The audit entries one actor made: a user id, an API key id, `cli` or `system` (as `audit_log`)."""
        return f"audit:actor:{actor}"

    @staticmethod
    def audit_type(entry_type: str) -> str:
        """The audit entries of one type (as `audit_log`)."""
        return f"audit:type:{entry_type}"

    # Trusted issuers (app/issuers/): their records, and the users each one's exchanges made or found.

    @staticmethod
    def issuers() -> str:
        """Every trusted issuer's record, by name (a hash of JSON)."""
        return "issuers"

    @staticmethod
    def issuer_users(name: str) -> str:
        """The ids of the users an issuer's exchanges made or found (a set): whose sessions deleting it ends."""
        return f"issuer:{{{name}}}:users"

    # The OpenID provider's signing keys (app/oidc/keys.py): one hash tag, so one Lua step changes them all.

    @staticmethod
    def signing_keys() -> str:
        """Every signing key by kid (a hash of JSON: algorithm, creation, public JWK, sealed private JWK)."""
        return "oidc:{signing-keys}:records"

    @staticmethod
    def signing_keys_stopped() -> str:
        """When each key that no longer signs stopped signing: kid -> epoch seconds (a hash)."""
        return "oidc:{signing-keys}:stopped"

    @staticmethod
    def signing_key_current() -> str:
        """The kid of the key that signs now."""
        return "oidc:{signing-keys}:current"

    @staticmethod
    def signing_keys_version() -> str:
        """A random value changed with every change of the keys, so processes know to read them again."""
        return "oidc:{signing-keys}:version"

    # The OpenID provider's clients (app/oidc/clients.py).

    @staticmethod
    def oauth_clients() -> str:
        """Every OAuth client's record, by client id (a hash of JSON; a secret only as its SHA-256)."""
        return "oauth_clients"

    # The OpenID provider's authorizations (app/oidc/): a user's consents under the user's hash tag (and the
    # user's client sessions, below); codes, nonces and revoked access tokens each a single key, changed in
    # one-key steps.

    @staticmethod
    def user_consents(user_id: str) -> str:
        """The clients the user consented to: client id -> JSON {"scopes", "granted_at"} (a hash)."""
        return f"user:{{{user_id}}}:consents"

    @staticmethod
    def client_users(client_id: str) -> str:
        """The users who consented to a client or hold a session of it (a set): whom deleting it concerns."""
        return f"oidc:client:{client_id}:users"

    @staticmethod
    def authorization_code(code_hash: str) -> str:
        """One authorization code, under its SHA-256 (a hash: what it is bound to; once used, the session it
        started), kept a while after its use to recognise a second use."""
        return f"oidc:code:{code_hash}"

    @staticmethod
    def authorization_nonce(client_id: str, nonce_hash: str) -> str:
        """Set while a code carrying this nonce (its SHA-256) may be redeemed: a nonce serves one code."""
        return f"oidc:nonce:{client_id}:{nonce_hash}"

    @staticmethod
    def revoked_access_token(jti: str) -> str:
        """Set from a client access token's revocation until it expires (its `jti`)."""
        return f"oidc:revoked-access:{jti}"

    @staticmethod
    def client_sessions(user_id: str) -> str:
        """The user's client sessions (authorizations given to clients): session id -> client id (a hash in the
        user's slot), written when such a session starts; an entry goes once its back-channel logout is queued."""
        return f"user:{{{user_id}}}:client-sessions"

    @staticmethod
    def backchannel_targets() -> str:
        """The ids of the back-channel logout targets, one per client told of a logout (a set, its own slot).

        A target's keys are those of an outgoing endpoint (`outgoing_endpoint(target id)` ...), under its own
        hash tag; it is never one of `outgoing_endpoints`, so webhook matching and management never see it.
        """
        return "outgoing:backchannel-targets"


# Ending sessions, shared by every script that ends some (reuse detection, logout, logout-all, password
# change and reset, deleting a user). A script touches only keys passed in KEYS, so the caller reads
# first what ending will touch and lists it (`app/auth/sessions.py` `session_layout`): from KEYS[k], per
# session, its record, its family's token set, its live-token set and then one refresh-token record per
# listed token; from ARGV[a], the number of sessions, then per session its id, its token count and the
# tokens' hashes. The tokens listed are the live ones, or with `purge` every token of the family. When
# what is stored no longer matches the list (a login or refresh came in between), the script answers
# 'stale' before writing anything and the caller reads again.
SESSIONS_LUA = """
local function listed_sessions(k, a)
  local sessions, count = {}, tonumber(ARGV[a])
  a = a + 1
  for _ = 1, count do
    local s = {id = ARGV[a], record = KEYS[k], all = KEYS[k + 1], live = KEYS[k + 2], tokens = {}, hashes = {}}
    local n = tonumber(ARGV[a + 1])
    for j = 1, n do
      s.tokens[j] = KEYS[k + 2 + j]
      s.hashes[j] = ARGV[a + 1 + j]
    end
    k, a = k + 3 + n, a + 2 + n
    table.insert(sessions, s)
  end
  return sessions
end

local function set_is(key, members)
  if redis.call('SCARD', key) ~= #members then return false end
  for _, m in ipairs(members) do
    if redis.call('SISMEMBER', key, m) == 0 then return false end
  end
  return true
end

-- Whether the listed tokens are still the ones stored, and the listed sessions, with `keep`, every
-- session of the user (pass sessions_key=nil when only the listed sessions matter).
local function still_current(sessions, sessions_key, keep, purge)
  if sessions_key then
    local ids = {}
    for _, s in ipairs(sessions) do table.insert(ids, s.id) end
    if keep and keep ~= '' and redis.call('SISMEMBER', sessions_key, keep) == 1 then table.insert(ids, keep) end
    if not set_is(sessions_key, ids) then return false end
  end
  for _, s in ipairs(sessions) do
    if not set_is(purge and s.all or s.live, s.hashes) then return false end
  end
  return true
end

-- Revoke (or, with purge, delete) the listed tokens and delete the sessions. Returns the ended ids.
local function end_sessions(sessions, sessions_key, now, purge)
  local ended = {}
  for _, s in ipairs(sessions) do
    for _, t in ipairs(s.tokens) do
      if purge then
        redis.call('DEL', t)
      elseif redis.call('HGET', t, 'revoked_at') == '' then
        redis.call('HSET', t, 'revoked_at', now)
      end
    end
    redis.call('DEL', s.record, s.all, s.live)
    redis.call('SREM', sessions_key, s.id)
    table.insert(ended, s.id)
  end
  return ended
end
"""

#: The Lua helpers above, for feature scripts that end sessions as part of a larger step.
END_SESSION_FUNCTION_LUA = SESSIONS_LUA

# Recording an audit entry in the same step as the change it records (app/audit/store.py): a script that
# calls record_audit() gets its subject's index as its last KEYS entry and, as its last three ARGV, the
# member ("<id> <entry JSON>"), the oldest member to keep (older ones are past AUDIT_RETENTION_DAYS) and
# the index's lifetime in milliseconds. Callers append them after everything else, listings included.
AUDIT_LUA = """
local function record_audit()
  local key, n = KEYS[#KEYS], #ARGV
  redis.call('ZADD', key, 0, ARGV[n - 2])
  redis.call('ZREMRANGEBYLEX', key, '-', '(' .. ARGV[n - 1])
  redis.call('PEXPIRE', key, ARGV[n])
end
"""

# KEYS[1] user, KEYS[2] session. ARGV: user id, now, touch interval.
# One round trip for every authenticated request: the current tokenVersion, whether the session
# still exists and belongs to this user (touching last_used_at at most once a minute), and the
# user's public fields (`U`), so that most views need no second read.
VERIFY_ACCESS = """
local user = redis.call('HMGET', KEYS[1], 'token_version', 'email', 'role', 'email_verified', 'external_issuer',
  'external_sub')
local s = redis.call('HMGET', KEYS[2], 'user_id', 'last_used_at')
if s[1] ~= ARGV[1] then return {user[1], 0} end
if tonumber(ARGV[2]) - tonumber(s[2] or 0) >= tonumber(ARGV[3]) then
  redis.call('HSET', KEYS[2], 'last_used_at', ARGV[2])
end
return {user[1], 1, user[2], user[3], user[4] or '', redis.call('HEXISTS', KEYS[1], 'totp_secret'), user[5] or '',
  user[6] or ''}
"""

# KEYS: 1 the presented token's record, 2 the new token's record, 3 the session, 4 its token set, 5 its
# live-token set, 6 the user, 7 the user's session set, then (only when the presented token turns out to
# be reused) the session's listing as in SESSIONS_LUA, then the refresh.reuse_detected audit entry's
# (AUDIT_LUA), recorded only then. ARGV: now, new expiry (epoch s), ttl (s), grace (s), presented hash,
# new hash, session id, then the listing (0 sessions at first), then the entry's.
# Returns {outcome, user_id, session_id, role, token_version}; outcome is rotated | grace | reused |
# ended | invalid, or 'stale' when reuse was found and the session's live tokens must be listed (again).
# A revoked token is reuse only while its session lives: ending a session (logout, logout-all, ending it
# from another device, a password change or reset, reuse detection itself) revokes its tokens and deletes
# its record, so a revoked token without a session record is 'ended', with nothing left to revoke.
ROTATE_REFRESH = (
    SESSIONS_LUA
    + AUDIT_LUA
    + """
local now, expires, ttl, grace = tonumber(ARGV[1]), ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
local rec = redis.call('HMGET', KEYS[1], 'user_id', 'family_id', 'expires_at', 'revoked_at')
local uid, sid, exp, revoked = rec[1], rec[2], rec[3], rec[4]
if not uid or sid ~= ARGV[7] or tonumber(exp) <= now then return {'invalid'} end
local outcome = 'rotated'
if revoked ~= '' then
  if redis.call('EXISTS', KEYS[3]) == 0 then return {'ended', uid, sid} end
  local previous = redis.call('HGET', KEYS[3], 'previous_hash')
  if grace > 0 and previous == ARGV[5] and now - tonumber(revoked) <= grace then
    outcome = 'grace'
  else
    local sessions = listed_sessions(8, 8)
    if #sessions ~= 1 or sessions[1].record ~= KEYS[3] or not still_current(sessions, nil, nil, false) then
      return {'stale'}
    end
    end_sessions(sessions, KEYS[7], ARGV[1], false)
    record_audit()
    return {'reused', uid, sid}
  end
end
if redis.call('EXISTS', KEYS[3]) == 0 then return {'invalid'} end
if outcome == 'rotated' then
  redis.call('HSET', KEYS[1], 'revoked_at', ARGV[1])
  redis.call('SREM', KEYS[5], ARGV[5])
end
redis.call('HSET', KEYS[2], 'user_id', uid, 'family_id', sid, 'created_at', ARGV[1],
           'expires_at', expires, 'revoked_at', '')
redis.call('EXPIRE', KEYS[2], ttl)
redis.call('SADD', KEYS[4], ARGV[6])
redis.call('EXPIRE', KEYS[4], ttl)
redis.call('SADD', KEYS[5], ARGV[6])
redis.call('EXPIRE', KEYS[5], ttl)
if outcome == 'rotated' then redis.call('HSET', KEYS[3], 'previous_hash', ARGV[5]) end
redis.call('HSET', KEYS[3], 'current_hash', ARGV[6], 'last_used_at', ARGV[1], 'expires_at', expires)
redis.call('EXPIRE', KEYS[3], ttl)
local user = redis.call('HMGET', KEYS[6], 'role', 'token_version')
return {outcome, uid, sid, user[1], user[2]}
"""
)

# KEYS[1] the user's session set, then the session's listing, then the audit entry's (AUDIT_LUA: logout or
# session.revoked). ARGV: now, then the listing, then the entry's. 1 when the session existed (and now is
# ended, its entry recorded), 0 when it was already gone, or 'stale'.
END_SESSION = (
    SESSIONS_LUA
    + AUDIT_LUA
    + """
local sessions = listed_sessions(2, 2)
if not still_current(sessions, nil, nil, false) then return 'stale' end
local existed = redis.call('EXISTS', sessions[1].record)
end_sessions(sessions, KEYS[1], ARGV[1], false)
if existed == 1 then record_audit() end
return existed
"""
)

# KEYS[1] user, KEYS[2] the user's session set, then the listing of every session but the kept one.
# ARGV: now, session id to keep ('' for none), then the listing. Returns the ended session ids, or 'stale'.
END_OTHER_SESSIONS = (
    SESSIONS_LUA
    + """
local sessions = listed_sessions(3, 3)
if not still_current(sessions, KEYS[2], ARGV[2], false) then return 'stale' end
return end_sessions(sessions, KEYS[2], ARGV[1], false)
"""
)

# KEYS[1] user, KEYS[2] the user's session set, then the listing of every session, then the audit entry's
# (AUDIT_LUA: logout or session.revoked). ARGV: now, listing, the entry's. Logout from all devices:
# tokenVersion + 1 and every session ended, recorded in one step. {version, ended ids}.
LOGOUT_ALL = (
    SESSIONS_LUA
    + AUDIT_LUA
    + """
local sessions = listed_sessions(3, 2)
if not still_current(sessions, KEYS[2], nil, false) then return 'stale' end
local version = redis.call('HINCRBY', KEYS[1], 'token_version', 1)
record_audit()
return {version, end_sessions(sessions, KEYS[2], ARGV[1], false)}
"""
)


class OwnConnection:
    """A connection of a client's pool kept by one user that makes its round trips one at a time (a
    SharedRoundTrip), outside the pool's bound. Through the pool, each round trip paid for a connection's
    check-out and check-in, the client's instrumentation and its argument filters: a third more than writing
    the commands and reading their answers costs (bench/README.md, "A round trip's own cost"). A connection
    found holding stray bytes, or closed by the server, is replaced before a round trip, as the pool replaces
    one at check-out."""

    def __init__(self, client: redis.Redis):
        self.client = client
        self.connection = None
        self.pid = 0

    def exchange(self, commands: list[tuple[tuple, dict]]) -> list:
        """Each command's parsed answer, or its error (a ResponseError) as the value. A lost connection raises,
        as a pipeline's does, and is not used again."""
        connection = self._ready()
        try:
            connection.send_packed_command(connection.pack_commands([args for args, _ in commands]), False)
            answers = []
            for args, options in commands:
                try:
                    answers.append(self.client.parse_response(connection, args[0], **options))
                except redis.exceptions.ResponseError as error:
                    answers.append(error)
            return answers
        except BaseException:
            connection.disconnect()  # answers may be left unread: this stream of replies is lost
            raise

    def _ready(self):
        if self.connection is None or self.pid != os.getpid():  # none yet, or made before a fork
            self.connection, self.pid = self.client.connection_pool.make_connection(), os.getpid()
        connection = self.connection
        if not connection.is_connected:
            connection.connect()  # once: a Redis that does not answer costs one connect time-out, as in the pool
            return connection
        try:
            stale = connection.can_read(timeout=0)
        except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError):
            stale = True
        if stale:
            connection.disconnect()
            connection.connect()
        return connection


class SharedRoundTrip:
    """Calls that many greenlets make at once, sent together: callers that arrive while one round trip is
    out go in the next, as one pipeline. Each caller still gets its own answer or error.

    Alone, a caller waits one turn of the loop before it sends (see `_call`); under load the cost of a round trip
    (two system calls, a wait for the socket) is shared by every call in it. The round trips go one at a time over
    a connection of their own (`OwnConnection`), each bounded by its reads' time-out (READ_TIMEOUT: a silent Redis
    fails the round trip, whose connection is then closed, and holds up no later one); one that must connect first
    connects as the client does, with the client's retries (redis-py's three, with a random backoff, by default),
    so a Redis that accepts and never answers holds it for a few read time-outs. Only under gevent and on
    one Redis: on a Redis Cluster the callers' keys live on different nodes. Subclasses say how a batch of calls
    travels (`_round_trip`).
    """

    def __init__(self, client: redis.Redis):
        self.client = client
        self.line = OwnConnection(client)
        self.waiting: list[tuple[object, gevent.event.AsyncResult]] = []
        self.sending = False

    def _call(self, call):
        """The answer to `call` (its error, raised here). With no round trip out, the caller lets the greenlets
        ready in this turn of the loop run: alone then, it sends its call itself (a greenlet spawned and switched
        to for it cost about two thirds of what the round trip itself does); with callers that came along, a
        greenlet of their own sends them all, so that nothing ending one caller (a kill, a time-out of its own)
        fails the others. Callers that come while a round trip is out go together in the next."""
        if self.sending:
            return self._queued(call)
        self.sending = True
        try:
            gevent.sleep(0)
        except BaseException:
            self._done()
            raise
        if self.waiting:
            answer = gevent.event.AsyncResult()
            self.waiting.insert(0, (call, answer))
            gevent.spawn(self._send)
            return answer.get()  # bounded: the round trip's reads time out
        try:
            (value,) = self._round_trip([call])
        finally:
            self._done()
        if isinstance(value, Exception):
            raise value
        return value

    def _queued(self, call):
        answer = gevent.event.AsyncResult()
        self.waiting.append((call, answer))
        return answer.get()  # bounded: the round trip out and theirs, whose reads time out

    def _done(self) -> None:
        """After a caller's own round trip: those who came meanwhile go in the next."""
        if self.waiting:
            gevent.spawn(self._send)
        else:
            self.sending = False

    def _send(self) -> None:
        """Send what waits, batch after batch; whatever ends this greenlet answers those left waiting."""
        batch: list = []
        try:
            while self.waiting:
                batch, self.waiting = self.waiting, []
                try:
                    answers = self._round_trip([call for call, _ in batch])
                except Exception as error:  # noqa: BLE001 - every caller of the round trip gets its error
                    answers = [error] * len(batch)
                self._answer(batch, answers)
        finally:
            self.sending = False
            self._interrupted(batch + self.waiting)
            self.waiting = []

    @staticmethod
    def _answer(batch: list, answers: list) -> None:
        for (_, answer), value in zip(batch, answers, strict=True):
            if isinstance(value, Exception):
                answer.set_exception(value)
            else:
                answer.set(value)

    @staticmethod
    def _interrupted(batch: list) -> None:
        """Answer those of `batch` still waiting when the greenlet sending their round trip was interrupted."""
        for _, answer in batch:
            if not answer.ready():
                answer.set_exception(redis.exceptions.ConnectionError("The shared round trip was interrupted."))

    def _round_trip(self, calls: list) -> list:
        raise NotImplementedError


class SharedRoundTrips(SharedRoundTrip):
    """A script that many requests run at once (the session check of every authenticated request), each call
    with read commands of its own sent in the same round trip if it has some (`with_reads`)."""

    def __init__(self, client: redis.Redis, script: Script):
        super().__init__(client)
        self.script = script

    def __call__(self, keys: list, args: list):
        """The script's answer for these keys and arguments (its error, raised here)."""
        return self._call((keys, args, ()))[0]

    def with_reads(self, keys: list, args: list, reads: list[Command]) -> tuple:
        """The script's answer (its error, raised here), and each of `reads`' answers or its error as the value,
        all in one round trip."""
        return self._call((keys, args, reads))

    def _round_trip(self, calls: list[tuple[list, list, list[Command]]]) -> list:
        sha, commands, spans = self.script.sha, [], []
        for keys, args, reads in calls:
            staged = list(_staged(self.client, reads).command_stack) if reads else []
            commands += [(("EVALSHA", sha, len(keys), *keys, *args), {}), *staged]
            spans.append(len(staged))
        answers, at, results = self.line.exchange(commands), 0, []
        for span in spans:
            results.append((answers[at], answers[at + 1 : at + 1 + span]))
            at += 1 + span
        flushed = [n for n, (answer, _) in enumerate(results) if isinstance(answer, NoScriptError)]
        if flushed:  # after a script flush: EVAL runs them and loads the script again
            source = self.script.script
            again = [(("EVAL", source, len(calls[n][0]), *calls[n][0], *calls[n][1]), {}) for n in flushed]
            for n, answer in zip(flushed, self.line.exchange(again), strict=True):
                results[n] = (answer, results[n][1])
        return [answer if isinstance(answer, Exception) else (answer, reads) for answer, reads in results]


def shared_round_trips(client: redis.Redis, script: Script):
    """`script`, its concurrent calls sent together where that is possible (SharedRoundTrips)."""
    if is_cluster(client) or not gevent.monkey.is_module_patched("socket"):
        return script
    return SharedRoundTrips(client, script)


Command = tuple[str, tuple, dict]  # a pipeline method's name, its arguments and keyword arguments


def _staged(client: redis.Redis, commands: list[Command]):
    """A pipeline (no transaction) holding the commands, not yet sent."""
    pipe = client.pipeline(transaction=False)
    for name, args, kwargs in commands:
        getattr(pipe, name)(*args, **kwargs)
    return pipe


def run_pipeline(client: redis.Redis, commands: list[Command]) -> list:
    """The commands in one pipeline (no transaction); each one's answer, or its error as the value."""
    return _staged(client, commands).execute(raise_on_error=False)


class SharedPipelines(SharedRoundTrip):
    """Pipelines of read commands that many requests send at once, sent as one.

    After a deploy or a network blip thousands of readers resume at once, each reading its channels'
    history (a pipeline of a few commands): together they take one round trip per batch instead of one
    each, which is most of what opening a stream costs.
    """

    def __call__(self, commands: list[Command]) -> list:
        """Each command's answer, or its error as the value (as `run_pipeline`)."""
        return self._call(commands)

    def _round_trip(self, calls: list[list[Command]]) -> list:
        staged = _staged(self.client, [command for commands in calls for command in commands])
        answers = self.line.exchange(list(staged.command_stack))  # the pipeline only turned them into arguments
        split, start = [], 0
        for commands in calls:
            split.append(answers[start : start + len(commands)])
            start += len(commands)
        return split


def shared_pipelines(client: redis.Redis):
    """A function running a pipeline of commands: shared by concurrent callers where that is possible."""
    if is_cluster(client) or not gevent.monkey.is_module_patched("socket"):
        return lambda commands: run_pipeline(client, commands)
    return SharedPipelines(client)


# Each client's shared reads. The value holds its client, so an entry lives as long as the process: there is one
# client a worker, made with its app.
_shared_reads: dict = {}


def read_together(client: redis.Redis, commands: list[Command]) -> list:
    """The answers of read commands, sent with what other requests read meanwhile (one `shared_pipelines` per
    client); the first error is raised. Through redis-py's own call, a lone read paid for a pooled connection's
    check-out and its stray-bytes check on every request."""
    send = _shared_reads.get(client)
    if send is None:
        send = _shared_reads[client] = shared_pipelines(client)
    answers = send(commands)
    for answer in answers:
        if isinstance(answer, Exception):
            raise answer
    return answers


class Scripts:
    """Registered scripts: redis-py sends EVALSHA and falls back to EVAL after a script flush."""

    def __init__(self, client: redis.Redis):
        # The session check alone (every authenticated request), and as a script to send with other commands.
        self.verify_access_script = client.register_script(VERIFY_ACCESS)
        self.verify_access = shared_round_trips(client, self.verify_access_script)
        self.rotate_refresh = client.register_script(ROTATE_REFRESH)
        self.end_session = client.register_script(END_SESSION)
        self.end_other_sessions = client.register_script(END_OTHER_SESSIONS)
        self.logout_all = client.register_script(LOGOUT_ALL)


READ_TIMEOUT = 5  # seconds a read from Redis waits at most (redis-py's default, said here: round trips rely on it)


def connect(url: str, max_connections: int, mode: str = "standalone") -> redis.Redis:
    """A client whose pool is bounded, so thousands of greenlets share a few connections.

    In `cluster` mode `url` is one or more comma-separated seed nodes and the client is redis-py's
    cluster client, which routes each command to the node serving its hash slot (a bounded blocking
    pool per node).
    """
    options = {
        "decode_responses": True,
        "socket_connect_timeout": 3,
        "socket_timeout": READ_TIMEOUT,
        "socket_keepalive": True,
        "health_check_interval": 30,
    }
    if mode == "cluster":
        seeds = [seed.strip() for seed in url.split(",") if seed.strip()]
        # `url` (the first seed) gives credentials and TLS to every node, and makes redis-py build each
        # node's pool from `connection_pool_class` (without it the class is ignored).
        return _LazyCluster(
            lambda: redis.RedisCluster(
                url=seeds[0],
                startup_nodes=[ClusterNode(*_host_port(seed)) for seed in seeds],
                connection_pool_class=_NodePool,
                max_connections=max_connections,
                **options,
            )
        )
    pool = redis.BlockingConnectionPool.from_url(url, max_connections=max_connections, timeout=5, **options)
    return redis.Redis(connection_pool=pool)


class _NodePool(redis.BlockingConnectionPool):
    """A cluster node's pool: bounded, and a greenlet waits at most 5 s for a free connection."""

    def __init__(self, **kwargs):
        super().__init__(timeout=5, **kwargs)


class _LazyCluster(redis.RedisCluster):
    """redis-py's cluster client, built when first used (and an instance of it, for `isinstance`).

    Building it asks the seeds for the cluster's layout. Deferring that keeps start-up as it is on one
    Redis: the app starts while the cluster is unreachable, requests answer 503 and CLI commands say
    in one line what they cannot reach (a ConnectionError), and the next use tries again. Every
    attribute but the few below is the built client's.
    """

    _OWN = frozenset({"_build", "_client", "_real", "register_script", "get_encoder", "close"})

    def __init__(self, build):  # no super().__init__(): that would connect
        self._build = build
        self._client = None

    def __getattribute__(self, name: str):
        if name in _LazyCluster._OWN or name.startswith("__"):
            return object.__getattribute__(self, name)
        return getattr(object.__getattribute__(self, "_real")(), name)

    def _real(self) -> redis.RedisCluster:
        if self._client is None:
            try:
                self._client = self._build()
            except redis.exceptions.RedisClusterException as error:
                raise redis.exceptions.ConnectionError(str(error)) from None
        return self._client

    def register_script(self, script: str):
        """A script bound to this client (no round trip: the SHA is computed locally)."""
        return Script(self, script)

    def get_encoder(self):
        """What `Script` encodes its source with, before any connection exists."""
        return redis.connection.Encoder("utf-8", "strict", True)

    def close(self) -> None:
        if self._client is not None:
            self._client.close()

    def __del__(self):
        pass

    def __repr__(self) -> str:
        return f"<lazy {self._client!r}>"

    def __getitem__(self, name):
        return self._real()[name]

    def __setitem__(self, name, value):
        self._real()[name] = value

    def __delitem__(self, name):
        del self._real()[name]

    def __contains__(self, name):
        return name in self._real()

    def __enter__(self):
        return self._real()

    def __exit__(self, *exc):
        self.close()


def is_cluster(client) -> bool:
    """Whether `client` talks to a Redis Cluster."""
    return isinstance(client, redis.RedisCluster)


def _host_port(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    return parts.hostname or "127.0.0.1", parts.port or 6379


def redis_addresses(url: str) -> str:
    """host:port of a Redis URL, never its credentials; of every seed in a cluster's comma-separated list."""
    return ", ".join(_address(seed.strip()) for seed in url.split(",") if seed.strip())


def _address(url: str) -> str:
    parts = urlsplit(url)
    if parts.scheme == "unix":
        return parts.path
    try:
        port = parts.port or 6379
    except ValueError:  # not a number: shown as written (redis-py refuses it when it connects)
        return parts.netloc.rpartition("@")[2]
    host = parts.hostname or "127.0.0.1"
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


# The setting this process's Redis URL was read from, as its settings say (init_app): log lines from parts that
# are given a URL alone (a cluster node's, say) name it too. One Redis per process, so one setting.
_url_setting = "REDIS_URL"


def redis_url_setting() -> str:
    """The setting the service's Redis URL comes from: REDIS_TLS_URL when it is set (it wins over REDIS_URL)."""
    return _url_setting


def describe_redis(url: str) -> str:
    """Where a Redis is looked for, for a log line: `127.0.0.1:6390 (REDIS_URL)`, a cluster's seeds, or the one
    cluster node `url` names; never a password. The setting alone when `url` is empty (not given)."""
    addresses = redis_addresses(url)
    return f"{addresses} ({_url_setting})" if addresses else _url_setting


def redis_error(error: Exception) -> str:
    """An error from Redis in a few words: its type and its message's first line (which holds no password)."""
    text = str(error).strip()
    return f"{type(error).__name__}: {text.splitlines()[0]}" if text else type(error).__name__


class Outage:
    """A background task's Redis outage, told without flooding the log: when the task first fails to reach Redis
    (where it looked, and why), again at most once a minute while that lasts, and once Redis answers again."""

    REMIND_EVERY = 60.0  # seconds

    def __init__(self, logger: logging.Logger, what: str, url: str):
        self.log = logger
        self.what = what
        self.where = describe_redis(url)
        self.since: float | None = None
        self.told = 0.0

    def failed(self, error: Exception) -> None:
        """The task could not reach Redis (this time): tell it if it is news, or if a minute has passed."""
        now = time.monotonic()
        if self.since is None:
            self.since = self.told = now
            self.log.warning("%s cannot reach redis at %s (%s); retrying", self.what, self.where, redis_error(error))
        elif now - self.told >= self.REMIND_EVERY:
            self.told = now
            self.log.warning(
                "%s still cannot reach redis at %s (%s), for %.0f s now; retrying",
                self.what,
                self.where,
                redis_error(error),
                now - self.since,
            )

    def succeeded(self) -> None:
        """The task reached Redis: tell it if it had not."""
        if self.since is not None:
            self.log.info(
                "%s reaches redis at %s again, after %.0f s", self.what, self.where, time.monotonic() - self.since
            )
            self.since = None


class Failures:
    """Redis failing the requests or streams of one process, told without flooding the log: a failure at once
    when none was told in the last minute, else only counted, and the count told with the next line (a
    thousand streams ending together make one line, not a thousand)."""

    TELL_EVERY = 60.0  # seconds

    def __init__(self, logger: logging.Logger, url: str):
        self.log = logger
        self.where = describe_redis(url)
        self.told: float | None = None  # when the last line was written (monotonic)
        self.untold = 0  # failures since then

    def failed(self, what: str, error: Exception) -> None:
        """`what` (e.g. "sse stream ended") failed for Redis: tell it, unless a line was told less than a minute
        ago (then count it for the next)."""
        now = time.monotonic()
        if self.told is not None and now - self.told < self.TELL_EVERY:
            self.untold += 1
            return
        since = f"; {self.untold} more since the last such line, {now - self.told:.0f} s ago" if self.untold else ""
        self.told, self.untold = now, 0
        self.log.warning("%s: redis at %s unavailable (%s)%s", what, self.where, redis_error(error), since)


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


def _check_for_stray_bytes_without_yielding(socket_can_read):
    """redis-py's readiness check, with the real `poll` when it must not wait (a zero time-out).

    Before each command redis-py asks, with a zero time-out, whether the pooled connection holds
    stray bytes. gevent's `poll` answers that only after a turn of the event loop, so every Redis
    command waited for one loop turn before it was sent. The real `poll` with a zero time-out
    answers at once and never blocks. Waits with a time-out keep gevent's `poll`.
    """
    real_poll = gevent.monkey.get_original("select", "poll")

    def can_read(sock, timeout: float) -> bool:
        if timeout != 0 or hasattr(sock, "pending"):  # a wait, or TLS (bytes buffered above the socket)
            return socket_can_read(sock, timeout)
        poller = real_poll()
        poller.register(sock, select.POLLIN)
        return bool(poller.poll(0))

    return can_read


hiredis_parser._socket_can_read = _check_for_stray_bytes_without_yielding(hiredis_parser._socket_can_read)


def init_app(app: Flask) -> None:
    """Connect to Redis with a bounded pool and register the Lua scripts."""
    global _url_setting
    settings = app.config["SETTINGS"]
    _url_setting = settings.redis_url_setting
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
