"""Presence: who reads a channel now, on any worker or instance, and the channel's join and leave events.

Each live connection reading a channel counts as an entry of the channel's sorted set `presence:{C}`:
`<user id>|<connection id>`, scored by the end of its lease (ms, the channel's Redis node's clock). Beside
it `presence:{C}:users` counts each present user's entries and `presence:{C}:sorted` lists the present
users in id order. All of them share the channel's hash tag with its members hash and its stream, so each
change is one Lua step that also publishes the user's `presence.join` (0 -> 1 entries) or
`presence.leave` exactly as the bus publishes an event: XADD to `events:{C}` and the wake-up
PUBLISH (SPUBLISH on a cluster), and the outgoing-webhook feed in the same step on one Redis (a second
step on a cluster). A connection id starts with `j` when its namespace has join_leave (else `q`), so
whoever drops the user's last entry, its own worker or a reaper, knows whether a leave is owed.

Lingering: presence itself (the count, the list) follows connections at once, but a user whose last
announcing entry goes is only put in `presence:{C}:lingering`, scored by when its leave is due
(PRESENCE_LINGER_SECONDS on). A user present again before then is taken out of it by the step that
enters it, and neither event is published; one still absent when it is due gets its leave from a settling
step, which checks and publishes in one step. The keeper whose step made the user linger settles the
channel when it is due; the channel's index score (below) is its earliest lease end or due leave, so if
that worker dies the reapers publish the leave instead. With the linger 0 the leave goes out at once.

Diffs: in a namespace with presence_diff the steps do not publish each join and leave; they note it in
`presence:{C}:diff` (a join and a leave of one user within one diff cancel out) and schedule the diff, a member
NUL in the lingering set, PRESENCE_DIFF_SECONDS on. When it is due, a settling step (the keeper whose step
scheduled it, or the reapers if that worker died) publishes them all as one event `presence.diff`. Such a
channel's lingering users are listed with a 0x01 byte before their id, so the settling step knows where their
leave goes.

Leases: the keeper of each worker renews the leases of its entries together (one script per channel)
every fifth of PRESENCE_TIMEOUT_SECONDS, for 0.6 of it. Entries whose lease ran out (their worker died)
are dropped by the reapers: every worker runs one, every tenth of the timeout, on the channels that
`presence:channels` (its own hash slot) says have a lease ending (or a leave due) by now, so a dead
worker's users stop counting within about 0.7 of the timeout (0.9 if the reaper that took their channel
died too), and their leave follows the linger later. Every step that changes a channel drops its lapsed
entries first, so reapers may run side by side; a reaper's step also publishes the channel's due leaves.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
import uuid
from collections import defaultdict
from dataclasses import dataclass

import gevent
import gevent.event
import gevent.monkey
import redis
from flask import Flask

from ..clock import utc_millis
from ..events.bus import DEFAULT_HISTORY_TTL
from ..outgoing.feed import feed_events
from ..redis import Keys, Outage, is_cluster

log = logging.getLogger(__name__)

JOIN = "presence.join"
LEAVE = "presence.leave"
SNAPSHOT_LIMIT = 1000
LEASE_SHARE = 0.6  # of the timeout: a lease outlives two missed renewals
RENEW_SHARE = 0.2
REAP_SHARE = 0.1
CLAIM_SHARE = 0.2  # how long a reaper keeps a due channel from the others
REAP_BATCH = 1000  # lapsed entries dropped per step (the reaper comes back for more)
DUE_BATCH = 100  # channels a reaper takes per step
RENEW_BATCH = 1000  # entries of one channel renewed per script
SETTLE_GAP = 0.05  # seconds: a channel is settled at most this often by one keeper (leaves due together go together)
SETTLE_SLACK = 0.005  # seconds added to a settling time: gevent's cached loop clock may wake a timer early
# What Redis being away looks like through redis-py (a cluster's slot map may be unknown, too).
REDIS_ERRORS = (redis.exceptions.RedisError, redis.exceptions.RedisClusterException)

# Helpers of the channel steps. KEYS: 1 presence:{C}, 2 presence:{C}:users, 3 presence:{C}:sorted,
# 4 members:{C}, 5 events:{C}, 6 presence:{C}:lingering; on one Redis also 7 presence:channels,
# 8 outgoing:endpoints, 9 outgoing:feed. ARGV: 1 channel, 2 its wake-up channel, 3 PUBLISH or SPUBLISH,
# 4 history maxlen, 5 ts, 6 lease ms, 7 key ttl ms, 8 batch, 9 linger ms, 10 history ttl ms, then the
# step's own.
# Each step returns {when the reapers should next look at the channel (its earliest lease end or due leave,
# ms) or false, {{id, event, data, ts}, ...} (what it published), ms until its next leave is due or false,
# 1 if the step made a user linger else 0}, and for a snapshot more.
CHANNEL_STEP_LUA = r"""
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
local linger = tonumber(ARGV[9])
local indexed = #KEYS >= 8
local feed = #KEYS >= 10 and redis.call('EXISTS', KEYS[9]) == 1
local diff_ms = tonumber(ARGV[11])
local published = {}
local lingered = 0
local DIFF_DUE = '\0'  -- in the lingering set, scored by when the pending joins and leaves go out (never a user id)
local BATCHED = '\1'  -- before a user id in the lingering set: the user of a presence_diff channel

-- The raw text of a member of a JSON object (nil when absent): info reaches events as it was granted
-- (decoding and encoding again would turn [] into {} and round long numbers).
local function skip_string(s, i)
  local j = i + 1
  while true do
    local k = string.find(s, '["\\]', j)
    if not k then return #s + 1 end
    if string.sub(s, k, k) == '"' then return k + 1 end
    j = k + 2
  end
end
local function skip_space(s, i) return string.find(s, '[^ \t\r\n]', i) or #s + 1 end
local function skip_value(s, i)
  local c = string.sub(s, i, i)
  if c == '"' then return skip_string(s, i) end
  if c ~= '{' and c ~= '[' then return string.find(s, '[,}%]]', i) or #s + 1 end
  local depth, j = 0, i
  while true do
    local k = string.find(s, '[%[%]{}"]', j)
    if not k then return #s + 1 end
    local ch = string.sub(s, k, k)
    if ch == '"' then
      j = skip_string(s, k)
    else
      depth = depth + ((ch == '{' or ch == '[') and 1 or -1)
      j = k + 1
      if depth == 0 then return j end
    end
  end
end
local function raw_member(s, name)
  local i = skip_space(s, 1)
  if string.sub(s, i, i) ~= '{' then return nil end
  i = skip_space(s, i + 1)
  while string.sub(s, i, i) == '"' do
    local after = skip_string(s, i)
    local key = string.sub(s, i, after - 1)
    i = skip_space(s, after)
    if string.sub(s, i, i) ~= ':' then return nil end
    i = skip_space(s, i + 1)
    local stop = skip_value(s, i)
    if key == '"' .. name .. '"' then return (string.gsub(string.sub(s, i, stop - 1), '%s+$', '')) end
    i = skip_space(s, stop)
    if string.sub(s, i, i) ~= ',' then return nil end
    i = skip_space(s, i + 1)
  end
  return nil
end

-- The info of the user's grant in force, as JSON text ('null' without one).
local function granted_info(user)
  local grant = redis.call('HGET', KEYS[4], user)
  if not grant then return 'null' end
  local expires = tonumber(raw_member(grant, 'expires_at') or '')
  if expires and expires * 1000 <= now then return 'null' end
  local info = raw_member(grant, 'info')
  if not info or info == '' then return 'null' end
  return info
end

local function emit(event, data)
  local id = redis.call('XADD', KEYS[5], 'MAXLEN', '~', ARGV[4], '*', 'event', event, 'data', data, 'ts', ARGV[5])
  redis.call('PEXPIRE', KEYS[5], ARGV[10])  -- as every publication: EVENT_HISTORY_TTL_SECONDS from now
  redis.call(ARGV[3], ARGV[2], cjson.encode({id = id, channel = ARGV[1], event = event, data = data, ts = ARGV[5]}))
  if feed then
    redis.call('XADD', KEYS[10], '*', 'id', id, 'channel', ARGV[1], 'event', event, 'data', data, 'ts', ARGV[5])
  end
  published[#published + 1] = {id, event, data, ARGV[5]}
end

local function user_entry(user)
  return '{"user_id":' .. cjson.encode(user) .. ',"info":' .. granted_info(user) .. '}'
end

-- A presence_diff channel's join or leave waits for the next diff; a join and a leave of one user within
-- one diff cancel out (the user was, or still is, present for every reader of the diffs).
local function pend(event, user)
  local change = event == 'presence.join' and 'j' or 'l'
  local held = redis.call('HGET', KEYS[7], user)
  if held and held ~= change then
    redis.call('HDEL', KEYS[7], user)
  else
    redis.call('HSET', KEYS[7], user, change)
  end
  if not redis.call('ZSCORE', KEYS[6], DIFF_DUE) then
    redis.call('ZADD', KEYS[6], now + diff_ms, DIFF_DUE)
    lingered = 1
  end
end

local function publish(event, user, batched)
  if batched then return pend(event, user) end
  emit(event, user_entry(user))
end

-- The pending joins and leaves as one event, each list in user id order.
local function send_diff()
  redis.call('ZREM', KEYS[6], DIFF_DUE)
  local pending = redis.call('HGETALL', KEYS[7])
  if #pending == 0 then return end
  redis.call('DEL', KEYS[7])
  local users, change = {}, {}
  for i = 1, #pending, 2 do
    users[#users + 1] = pending[i]
    change[pending[i]] = pending[i + 1]
  end
  table.sort(users)
  local joins, leaves = {}, {}
  for _, user in ipairs(users) do
    local list = change[user] == 'j' and joins or leaves
    list[#list + 1] = user_entry(user)
  end
  emit('presence.diff', '{"joins":[' .. table.concat(joins, ',') .. '],"leaves":[' .. table.concat(leaves, ',') .. ']}')
end

local function user_of(member) return string.match(member, '^(.*)|') end
local function kind_of(member, user) return string.sub(member, #user + 2, #user + 2) end
local function announces(member, user) local kind = kind_of(member, user) return kind == 'j' or kind == 'd' end
local function batches(member, user) return kind_of(member, user) == 'd' end
local function lingering_name(user, batched) return batched and (BATCHED .. user) or user end

-- A user present again: back within the linger, its pending leave is forgotten and no join is owed;
-- later (not settled yet), the leave goes out first.
local function arrive(member, user)
  local batched = batches(member, user)
  local name = lingering_name(user, batched)
  local due = redis.call('ZSCORE', KEYS[6], name)
  if due then
    redis.call('ZREM', KEYS[6], name)
    if tonumber(due) > now then return end
    publish('presence.leave', user, batched)
  end
  if announces(member, user) then publish('presence.join', user, batched) end
end

local function add(member)
  if redis.call('ZADD', KEYS[1], now + tonumber(ARGV[6]), member) == 0 then return end
  local user = user_of(member)
  if redis.call('HINCRBY', KEYS[2], user, 1) == 1 then
    redis.call('ZADD', KEYS[3], 0, user)
    arrive(member, user)
  end
end

local function drop(member)
  if redis.call('ZREM', KEYS[1], member) == 0 then return end
  local user = user_of(member)
  if redis.call('HINCRBY', KEYS[2], user, -1) <= 0 then
    redis.call('HDEL', KEYS[2], user)
    redis.call('ZREM', KEYS[3], user)
    if announces(member, user) then
      local batched = batches(member, user)
      if linger > 0 then
        redis.call('ZADD', KEYS[6], now + linger, lingering_name(user, batched))
        lingered = 1
      else
        publish('presence.leave', user, batched)
      end
    end
  end
end

-- The leaves that are due: each user still absent (as it always is: arriving takes it out) leaves now; and
-- the pending joins and leaves of a presence_diff channel, when their diff is due, go out (after those leaves).
local function settle()
  local due = redis.call('ZRANGEBYSCORE', KEYS[6], '-inf', now, 'LIMIT', 0, tonumber(ARGV[8]))
  if #due == 0 then return end
  redis.call('ZREM', KEYS[6], unpack(due))
  local diff_due = false
  for _, name in ipairs(due) do
    if name == DIFF_DUE then
      diff_due = true
    else
      local batched = string.sub(name, 1, 1) == BATCHED
      local user = batched and string.sub(name, 2) or name
      if redis.call('HEXISTS', KEYS[2], user) == 0 then publish('presence.leave', user, batched) end
    end
  end
  if diff_due then send_diff() end
end

local function reap()
  for _, member in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, tonumber(ARGV[8]))) do
    drop(member)
  end
end

-- Keys live a timeout past the last change or renewal (pending leaves also the linger); on one Redis the
-- index is kept exact here.
local function finish(...)
  local lease_end = tonumber(redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')[2])
  local due = tonumber(redis.call('ZRANGE', KEYS[6], 0, 0, 'WITHSCORES')[2])
  if lease_end then
    for k = 1, 3 do redis.call('PEXPIRE', KEYS[k], ARGV[7]) end
  end
  if due then redis.call('PEXPIRE', KEYS[6], math.max(due - now, 0) + tonumber(ARGV[7])) end
  local look = lease_end or due
  if lease_end and due then look = math.min(lease_end, due) end
  if due and redis.call('EXISTS', KEYS[7]) == 1 then
    redis.call('PEXPIRE', KEYS[7], math.max(due - now, 0) + tonumber(ARGV[7]))
  end
  if indexed then
    if look then redis.call('ZADD', KEYS[8], look, ARGV[1]) else redis.call('ZREM', KEYS[8], ARGV[1]) end
  end
  return {look or false, published, due and (due - now) or false, lingered, ...}
end
"""

ENTER_LUA = CHANNEL_STEP_LUA + "reap()\nadd(ARGV[12])\nreturn finish()\n"
LEAVE_LUA = CHANNEL_STEP_LUA + "reap()\ndrop(ARGV[12])\nreturn finish()\n"
# The reapers' step and the settling step: due leaves, then lapsed entries.
REAP_LUA = CHANNEL_STEP_LUA + "settle()\nreap()\nreturn finish()\n"
# ARGV[12]: how many users to list. Returns also the number of present users and, per listed user,
# {user id, connections, info as JSON text}.
SNAPSHOT_LUA = (
    CHANNEL_STEP_LUA
    + """
reap()
local rows = {}
if tonumber(ARGV[12]) > 0 then
  for _, user in ipairs(redis.call('ZRANGE', KEYS[3], 0, tonumber(ARGV[12]) - 1)) do
    rows[#rows + 1] = {user, redis.call('HGET', KEYS[2], user) or '0', granted_info(user)}
  end
end
return finish(redis.call('ZCARD', KEYS[3]), rows)
"""
)

# KEYS: 1 presence:{C}, 2 presence:{C}:users, 3 presence:{C}:sorted. ARGV: lease ms, key ttl ms, then
# entries. Pushes the leases of the entries still there forward; returns those that are gone (their lease
# ran out and a reaper dropped them, or Redis lost them): the keeper enters them again.
RENEW_LUA = """
local clock = redis.call('TIME')
local ends = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000) + tonumber(ARGV[1])
local missing = {}
for i = 3, #ARGV do
  if redis.call('ZSCORE', KEYS[1], ARGV[i]) then
    redis.call('ZADD', KEYS[1], 'XX', ends, ARGV[i])
  else
    missing[#missing + 1] = ARGV[i]
  end
end
if #missing < #ARGV - 2 then
  for k = 1, 3 do redis.call('PEXPIRE', KEYS[k], ARGV[2]) end
end
return missing
"""

# KEYS: 1 presence:{C}, 2 presence:{C}:lingering. When the reapers should next look at the channel (as a
# step's first answer), or false.
NEXT_LOOK_LUA = """
local lease_end = tonumber(redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')[2])
local due = tonumber(redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')[2])
if lease_end and due then return math.min(lease_end, due) end
return lease_end or due or false
"""

# KEYS[1] presence:channels. ARGV: how many, claim ms. The channels with a lease ending by now, each
# kept from other reapers for a while (if this one dies, another takes them when the claim ends).
CLAIM_DUE_LUA = """
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, tonumber(ARGV[1]))
for _, channel in ipairs(due) do redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), channel) end
return due
"""


@dataclass(slots=True)
class Published:
    """A join or leave event a channel step published (what the outgoing feed takes)."""

    id: str
    channel: str
    event: str
    data: str
    ts: str


@dataclass(slots=True)
class _Entry:
    channel: str
    member: str  # "<user id>|<connection id>"
    reviving: bool = False  # the renewer is entering it again
    left: bool = False


class PresenceKeeper:
    """One per worker: counts this worker's connections in channels, renews their leases, reaps lapsed ones,
    and publishes the leaves its steps left lingering once they are due."""

    def __init__(
        self,
        client,
        timeout_seconds: float,
        feed=feed_events,
        *,
        history_maxlen: int = 1000,
        history_ttl: int = DEFAULT_HISTORY_TTL,
        linger_seconds: float = 0.0,
        diff_seconds: float = 0.5,
        redis_url: str = "",
    ):
        """`redis_url`: where `client` connects (REDIS_URL), for the log lines of an outage."""
        self.client = client
        self.timeout = timeout_seconds
        self.linger = linger_seconds
        self.linger_ms = round(linger_seconds * 1000)
        self.diff_ms = max(1, round(diff_seconds * 1000))  # presence_diff channels: how often joins and leaves go out
        self.feed = feed  # feed(client, events): hands events to outgoing webhooks on a cluster
        self.history_maxlen = history_maxlen
        self.history_ttl_ms = history_ttl * 1000
        self.cluster = is_cluster(client)
        self.lease_ms = max(1, round(timeout_seconds * LEASE_SHARE * 1000))
        self.key_ttl_ms = self.lease_ms + round(timeout_seconds * 1000)
        self.claim_ms = max(1, round(timeout_seconds * CLAIM_SHARE * 1000))
        self.renew_interval = timeout_seconds * RENEW_SHARE
        self.reap_interval = timeout_seconds * REAP_SHARE
        self._enter = client.register_script(ENTER_LUA)
        self._leave = client.register_script(LEAVE_LUA)
        self._reap = client.register_script(REAP_LUA)
        self._snapshot = client.register_script(SNAPSHOT_LUA)
        self._renew = client.register_script(RENEW_LUA)
        self._claim_due = client.register_script(CLAIM_DUE_LUA)
        self._next_look = client.register_script(NEXT_LOOK_LUA)
        self.held: dict[str, _Entry] = {}  # entry id -> entry, this process's
        self.settle_at: dict[str, float] = {}  # channel -> when (monotonic) to publish its due leaves
        self._pid = os.getpid()
        self._renewer: gevent.Greenlet | None = None
        self._reaper: gevent.Greenlet | None = None
        self._settler: gevent.Greenlet | None = None
        self._settle_sooner = gevent.event.Event()
        # Each background task tells an outage once, at most once a minute while it lasts, and when it is over.
        self._renewing = Outage(log, "presence: renewing leases", redis_url)
        self._reaping = Outage(log, "presence: reaping lapsed leases", redis_url)
        self._leaving = Outage(log, "presence: leaving", redis_url)
        self._settling = Outage(log, "presence: publishing due leaves", redis_url)

    # The interface of the transports and views.

    def enter(self, channel: str, user_id: str, join_leave: bool, diff: bool = False) -> str:
        """Count one more connection of `user_id` in `channel`, with a lease this keeper renews while it is
        held; the user's first publishes `presence.join` (when `join_leave`) in the same step, or (`diff`: a
        presence_diff namespace) puts it in the channel's next `presence.diff`. Returns the entry id for
        `leave`. Raises Redis errors (the caller answers 503)."""
        self.start()
        kind = ("d" if diff else "j") if join_leave else "q"
        entry_id = kind + uuid.uuid4().hex[:20]
        entry = _Entry(channel, f"{user_id}|{entry_id}")
        self._enter_step(entry)
        self.held[entry_id] = entry
        if self._renewer is None or self._renewer.dead:
            self._renewer = gevent.spawn(self._renew_forever)
        return entry_id

    def leave(self, entry_id: str) -> None:
        """Stop counting the connection at once. When it was the user's last, `presence.leave` follows at once
        with no linger, else once the linger is over and the user is still absent. Never raises: on a failure
        the lease runs out instead, and a reaper drops it."""
        entry = self.held.pop(entry_id, None)
        if entry is None:
            return
        entry.left = True
        if entry.reviving:  # the renewer leaves it once its entering is done
            return
        self._leave_quietly(entry)

    def snapshot(self, channel: str, limit: int = SNAPSHOT_LIMIT) -> dict:
        """`{"channel", "count", "users": [{"user_id", "info", "connections"}]}`: the first `limit` present
        users by id, `count` all of them. Lapsed entries are dropped first."""
        self.start()
        result = self._step(self._snapshot, channel, [max(0, int(limit))])
        count, rows = result[4], result[5]
        users = [{"user_id": user, "info": json.loads(info), "connections": int(n)} for user, n, info in rows]
        return {"channel": channel, "count": int(count), "users": users}

    def start(self) -> None:
        """Run the reaper in this process (idempotent, cheap): at first use, after the worker's fork."""
        if self._pid != os.getpid():  # a forked copy: the parent's entries and greenlets are not ours
            self._pid, self.held, self._renewer, self._reaper = os.getpid(), {}, None, None
            self.settle_at, self._settler, self._settle_sooner = {}, None, gevent.event.Event()
        if self._reaper is None or self._reaper.dead:
            self._reaper = gevent.spawn(self._reap_forever)

    def start_in_request(self) -> None:
        """`start` before a request of a gevent worker, so every serving worker reaps."""
        if gevent.monkey.is_module_patched("socket"):
            self.start()

    def stop(self) -> None:
        """Stop renewing, reaping and settling in this process (entries held lapse, and other reapers drop
        them and publish the leaves this one would have)."""
        for greenlet in (self._renewer, self._reaper, self._settler):
            if greenlet is not None:
                greenlet.kill(block=False)
        self._renewer = self._reaper = self._settler = None

    # One pass of each background task (their loops below; tests may call them).

    def renew(self) -> None:
        """Push the leases of every held entry forward: one script per channel, pipelined per node. Entries
        Redis no longer has (lapsed and reaped, or lost) are entered again."""
        by_channel: dict[str, list[tuple[str, _Entry]]] = defaultdict(list)
        for entry_id, entry in list(self.held.items()):
            by_channel[entry.channel].append((entry_id, entry))
        calls = []
        for channel, entries in by_channel.items():
            for start in range(0, len(entries), RENEW_BATCH):
                calls.append((channel, entries[start : start + RENEW_BATCH]))
        keys = [[Keys.presence(c), Keys.presence_users(c), Keys.presence_sorted(c)] for c, _ in calls]
        args = [[self.lease_ms, self.key_ttl_ms, *(entry.member for _, entry in group)] for _, group in calls]
        results = self._pipelined(self._renew, keys, args)
        failure = next((result for result in results if isinstance(result, Exception)), None)
        for (_, group), result in zip(calls, results, strict=True):
            if isinstance(result, Exception):
                continue
            gone = set(result)
            for entry_id, entry in group:
                if entry.member in gone and self.held.get(entry_id) is entry and not entry.reviving:
                    try:
                        self._revive(entry)
                    except REDIS_ERRORS as error:
                        failure = failure or error
        if failure is not None:
            raise failure

    def reap(self) -> int:
        """Publish the due leaves and drop the lapsed entries of every channel due; how many channels were due."""
        due = self._claim_due(keys=[Keys.presence_channels()], args=[DUE_BATCH, self.claim_ms])
        if not due:
            return 0
        keys, args = [self._channel_keys(c) for c in due], [self._channel_args(c) for c in due]
        results = self._pipelined(self._reap, keys, args)
        failure = next((result for result in results if isinstance(result, Exception)), None)
        done = [
            (channel, result) for channel, result in zip(due, results, strict=True) if not isinstance(result, Exception)
        ]
        self._settled(done)
        if failure is not None:
            raise failure
        return len(due)

    def settle(self) -> int:
        """Publish the due leaves of every channel this keeper's timer says is due (and drop lapsed entries);
        how many channels it looked at. A channel whose step failed is tried again a reaper's pass later."""
        now = time.monotonic()
        due = [channel for channel, at in self.settle_at.items() if at <= now]
        if not due:
            return 0
        for channel in due:
            del self.settle_at[channel]
        keys, args = [self._channel_keys(c) for c in due], [self._channel_args(c) for c in due]
        results = self._pipelined(self._reap, keys, args)
        failure = None
        done = []
        for channel, result in zip(due, results, strict=True):
            if isinstance(result, Exception):
                failure = failure or result
                self._schedule(channel, self.reap_interval)
            else:
                done.append((channel, result))
        self._settled(done)
        if failure is not None:
            raise failure
        return len(due)

    def _settled(self, done: list[tuple[str, list]]) -> None:
        """After reaping or settling steps: on a cluster, feed what they published to the outgoing webhooks
        and index the channels again; leaves still pending are settled when they are due."""
        for channel, result in done:
            if result[2] is not None:
                self._schedule(channel, result[2] / 1000)
        if self.cluster:
            self.feed(self.client, [event for channel, result in done for event in self._published(channel, result)])
            self._reindex(done)

    def _schedule(self, channel: str, seconds: float) -> None:
        """Settle `channel` in `seconds` (not sooner than SETTLE_GAP), unless it is already due sooner."""
        at = time.monotonic() + max(seconds, SETTLE_GAP) + SETTLE_SLACK
        current = self.settle_at.get(channel)
        if current is not None and current <= at:
            return
        self.settle_at[channel] = at
        if self._settler is None or self._settler.dead:
            self._settler = gevent.spawn(self._settle_forever)
        else:
            self._settle_sooner.set()

    # Steps on one channel.

    def _enter_step(self, entry: _Entry) -> None:
        if not self.cluster:
            self._step(self._enter, entry.channel, [entry.member])
            return
        result = self._step(self._enter, entry.channel, [entry.member], fed=False)
        try:  # the second steps: index the channel for the reapers, feed the join to outgoing webhooks
            self.client.zadd(Keys.presence_channels(), {entry.channel: int(result[0])}, lt=True)
            self._feed(entry.channel, result)
        except REDIS_ERRORS:
            self._leave_quietly(entry)  # the caller fails; unindexed, no reaper would find it
            raise

    def _leave_quietly(self, entry: _Entry) -> None:
        try:
            result = self._step(self._leave, entry.channel, [entry.member])
            if self.cluster and result[3]:  # the index is in another slot: the reapers look when the leave is due
                self.client.zadd(Keys.presence_channels(), {entry.channel: int(result[0])}, lt=True)
        except REDIS_ERRORS as error:
            self._leaving.failed(error)
        else:
            self._leaving.succeeded()

    def _revive(self, entry: _Entry) -> None:
        entry.reviving = True
        try:
            self._enter_step(entry)
        finally:
            entry.reviving = False
            if entry.left:
                self._leave_quietly(entry)

    def _step(self, script, channel: str, extra: list, fed: bool = True) -> list:
        """Run one channel step; on a cluster, hand what it published to the outgoing feed (second step)
        unless the caller does (`fed=False`)."""
        result = script(keys=self._channel_keys(channel), args=self._channel_args(channel) + extra)
        if result[3]:  # a user lingers: this keeper publishes its leave when due; if it dies, the reapers do
            self._schedule(channel, result[2] / 1000)
        if fed:
            self._feed(channel, result)
        return result

    def _feed(self, channel: str, result: list) -> None:
        if self.cluster and result[1]:
            self.feed(self.client, self._published(channel, result))

    def _channel_keys(self, channel: str) -> list[str]:
        keys = [
            Keys.presence(channel),
            Keys.presence_users(channel),
            Keys.presence_sorted(channel),
            Keys.channel_members(channel),
            Keys.stream(channel),
            Keys.presence_lingering(channel),
            Keys.presence_diff(channel),
        ]
        if not self.cluster:  # one Redis: the index and the feed change in the same step
            keys += [Keys.presence_channels(), Keys.outgoing_endpoints(), Keys.outgoing_feed()]
        return keys

    def _channel_args(self, channel: str) -> list:
        publish = "SPUBLISH" if self.cluster else "PUBLISH"
        return [
            channel,
            f"wake:{{{channel}}}",
            publish,
            self.history_maxlen,
            utc_millis(),
            self.lease_ms,
            self.key_ttl_ms,
            REAP_BATCH,
            self.linger_ms,
            self.history_ttl_ms,
            self.diff_ms,
        ]

    @staticmethod
    def _published(channel: str, result: list) -> list[Published]:
        """What a channel step published, as events for the outgoing feed."""
        return [Published(event_id, channel, event, data, ts) for event_id, event, data, ts in result[1]]

    def _reindex(self, done: list[tuple[str, list]]) -> None:
        """On a cluster, after reaping: each channel's index score becomes when the reapers should look at it
        next (its earliest lease end or due leave); a channel left with neither is removed, then looked at
        again, so an entry or a pending leave that came meanwhile is indexed."""
        index = Keys.presence_channels()
        empty = [channel for channel, result in done if not result[0]]
        pipe = self.client.pipeline(transaction=False)
        for channel, result in done:
            if result[0]:
                pipe.zadd(index, {channel: int(result[0])})
        for channel in empty:
            pipe.zrem(index, channel)
        pipe.execute()
        if not empty:
            return
        keys = [[Keys.presence(channel), Keys.presence_lingering(channel)] for channel in empty]
        looks = self._pipelined(self._next_look, keys, [[] for _ in empty])
        again = {}
        for channel, look in zip(empty, looks, strict=True):
            if isinstance(look, Exception):
                raise look
            if look is not None:
                again[channel] = int(look)
        if again:
            pipe = self.client.pipeline(transaction=False)
            for channel, score in again.items():
                pipe.zadd(index, {channel: score}, lt=True)
            pipe.execute()

    def _pipelined(self, script, keys: list[list[str]], args: list[list]) -> list:
        """Per call, the script's answer or its error, in order: one pipeline on one Redis, one per node on
        a cluster."""
        groups: dict[str, tuple] = {}
        for position, call_keys in enumerate(keys):
            node = self.client.get_node_from_key(call_keys[0]) if self.cluster else None
            groups.setdefault(node.name if node else "", (node, []))[1].append(position)
        results: list = [None] * len(keys)
        for node, positions in groups.values():
            target = self.client.get_redis_connection(node) if node else self.client
            pipe = target.pipeline(transaction=False)
            for position in positions:
                script(keys=keys[position], args=args[position], client=pipe)
            try:
                answers = pipe.execute(raise_on_error=False)
            except REDIS_ERRORS as error:
                answers = [error] * len(positions)
                self._refresh_topology()
            for position, answer in zip(positions, answers, strict=True):
                results[position] = answer
        if any(isinstance(answer, redis.exceptions.MovedError) for answer in results):
            self._refresh_topology()
        return results

    def _refresh_topology(self) -> None:
        if self.cluster:
            with contextlib.suppress(*REDIS_ERRORS):
                self.client.nodes_manager.initialize()

    # The background loops.

    def _renew_forever(self) -> None:
        while self.held:
            gevent.sleep(self.renew_interval)
            self._run_quietly(self.renew, self._renewing)

    def _reap_forever(self) -> None:
        while True:
            gevent.sleep(self.reap_interval)
            self._run_quietly(self._reap_all_due, self._reaping)

    def _settle_forever(self) -> None:
        while self.settle_at:
            wait = min(self.settle_at.values()) - time.monotonic()
            if wait > 0:
                self._settle_sooner.clear()
                self._settle_sooner.wait(wait)  # or sooner, when a channel is due before
                continue
            self._run_quietly(self.settle, self._settling)

    def _reap_all_due(self) -> None:
        while self.reap() == DUE_BATCH:
            gevent.sleep(0)

    @staticmethod
    def _run_quietly(task, outage: Outage) -> None:
        """One pass of a background task: a failure is logged (once per outage), and the loop goes on."""
        try:
            task()
        except REDIS_ERRORS as error:
            outage.failed(error)
        except Exception:  # noqa: BLE001 - a background task outlives a bug's one pass; the log says where
            log.exception("%s failed unexpectedly", outage.what)
        else:
            outage.succeeded()


def init_app(app: Flask) -> None:
    """Bind this worker's presence keeper; its reaper starts at the worker's first request (after the fork)."""
    settings = app.config["SETTINGS"]
    keeper = PresenceKeeper(
        app.extensions["redis"],
        settings.presence_timeout,
        history_maxlen=settings.event_history_maxlen,
        history_ttl=settings.event_history_ttl,
        linger_seconds=settings.presence_linger,
        diff_seconds=settings.presence_diff_seconds,
        redis_url=settings.redis_url,
    )
    app.extensions["presence"] = keeper
    app.before_request(keeper.start_in_request)
