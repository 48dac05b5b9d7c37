"""Organizations in Redis: the record, its members, its invitations, and each member's index.

An organization's three keys share its hash tag, so one Lua step reads and changes them together: who
acts, with what role, on whom, and whether an owner remains are decided in the step that writes. Two
owners demoting (or removing) each other at the same moment therefore leave exactly one owner, on a
cluster too.

The members hash is the authority; the user's index (`user_orgs`, in the user record's slot) lists their
organizations for `GET /orgs` and for the deletion of the account. An addition writes the members hash,
then the index (only while the user record exists); a removal the members hash, then the index, and puts
the entry back when the user became a member again in between. Readers of the index check each entry
against the members hash.

Invitation tokens are `<org id>.<invitation id>.<secret>`; only the secret's SHA-256 is kept, in the
invitation, and only from the moment its mail is built (no token sits in the mail queue).
"""

from __future__ import annotations

import hashlib
import json
import re
import secrets
import time
import uuid
from datetime import UTC, datetime

from ..http import rfc3339
from ..redis import Keys, get_redis, get_script

ROLES = ("member", "admin", "owner")  # ascending: an existing member keeps the higher of two roles
ORG_ID_PATTERN = r"[0-9a-f]{32}"
ORG_ID = re.compile(ORG_ID_PATTERN)
INVITATION_ID = re.compile(r"[0-9a-f]{32}")
INVITATION_LIFETIME = 7 * 24 * 3600
NAME_LIMIT = 100
CURSOR = re.compile(r"([0-9]{13})-([0-9a-f]{32})")
SUPERUSER = ""  # the acting user id of an administrator or API key: an owner of every organization

# Shared by the scripts: KEYS[1] the organization, KEYS[2] its members.
COMMON_LUA = """
local rank = {member = 1, admin = 2, owner = 3}
local function role_of(user_id)
  if user_id == '' then return 'owner' end
  local held = redis.call('HGET', KEYS[2], user_id)
  if not held then return nil end
  return cjson.decode(held)['role']
end
local function owners()
  local n = 0
  for _, held in ipairs(redis.call('HVALS', KEYS[2])) do
    local ok, member = pcall(cjson.decode, held)
    if ok and type(member) == 'table' and member['role'] == 'owner' then n = n + 1 end
  end
  return n
end
"""

# KEYS[1] the organization, KEYS[2] its members. ARGV: id, name, created_at, creator, the creator's JSON.
CREATE_LUA = """
redis.call('HSET', KEYS[1], 'id', ARGV[1], 'name', ARGV[2], 'created_at', ARGV[3])
redis.call('HSET', KEYS[2], ARGV[4], ARGV[5])
return 1
"""

# KEYS[1] the user's record, KEYS[2] the user's index. ARGV: org id, role. Indexes the membership while
# the user exists: 1, or 0 when the account is gone (or being deleted).
INDEX_LUA = """
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
return 1
"""

# KEYS[1] the user's index. ARGV: org id, role. Updates the role an entry names, never adds one.
REINDEX_LUA = """
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 0 then return 0 end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
return 1
"""

# KEYS: organization, members. ARGV: actor ('' for an administrator or key), new name.
# {'ok'} | {'gone'} | {'outsider'} | {'forbidden'}: owners and admins rename.
RENAME_LUA = (
    COMMON_LUA
    + """
if redis.call('EXISTS', KEYS[1]) == 0 then return {'gone'} end
local acting = role_of(ARGV[1])
if not acting then return {'outsider'} end
if rank[acting] < rank['admin'] then return {'forbidden'} end
redis.call('HSET', KEYS[1], 'name', ARGV[2])
return {'ok'}
"""
)

# KEYS: organization, members, invitations. ARGV: actor. {'deleted', member ids...} | {'gone'} |
# {'outsider'} | {'forbidden'}: owners delete.
DELETE_LUA = (
    COMMON_LUA
    + """
if redis.call('EXISTS', KEYS[1]) == 0 then return {'gone'} end
local acting = role_of(ARGV[1])
if not acting then return {'outsider'} end
if acting ~= 'owner' then return {'forbidden'} end
local members = redis.call('HKEYS', KEYS[2])
redis.call('DEL', KEYS[1], KEYS[2], KEYS[3])
table.insert(members, 1, 'deleted')
return members
"""
)

# KEYS: organization, members. ARGV: actor, target, role. The last owner is never demoted (whoever asks: of
# two owners demoting each other at once, the later one gets this answer); owners set any role; admins only
# between member and admin. {'changed', before} | {'same', before} | {'gone'} |
# {'outsider'} | {'not_member'} | {'forbidden'} | {'last_owner'}.
SET_ROLE_LUA = (
    COMMON_LUA
    + """
if redis.call('EXISTS', KEYS[1]) == 0 then return {'gone'} end
local acting = role_of(ARGV[1])
if not acting then return {'outsider'} end
local held = redis.call('HGET', KEYS[2], ARGV[2])
if not held then return {'not_member'} end
local member = cjson.decode(held)
local before = member['role']
if before == 'owner' and ARGV[3] ~= 'owner' and owners() <= 1 then return {'last_owner'} end
if acting ~= 'owner' and not (acting == 'admin' and before ~= 'owner' and ARGV[3] ~= 'owner') then
  return {'forbidden'}
end
if before == ARGV[3] then return {'same', before} end
member['role'] = ARGV[3]
redis.call('HSET', KEYS[2], ARGV[2], cjson.encode(member))
return {'changed', before}
"""
)

# KEYS: organization, members. ARGV: actor, target. Never the last owner (whoever asks); owners remove
# anyone, admins members, anyone itself. {'removed', role} | {'gone'} | {'outsider'} | {'not_member'} | {'forbidden'} |
# {'last_owner'}.
REMOVE_LUA = (
    COMMON_LUA
    + """
if redis.call('EXISTS', KEYS[1]) == 0 then return {'gone'} end
local acting = role_of(ARGV[1])
if not acting then return {'outsider'} end
local held = redis.call('HGET', KEYS[2], ARGV[2])
if not held then return {'not_member'} end
local role = cjson.decode(held)['role']
if role == 'owner' and owners() <= 1 then return {'last_owner'} end
if ARGV[1] ~= ARGV[2] and acting ~= 'owner' and not (acting == 'admin' and role == 'member') then
  return {'forbidden'}
end
redis.call('HDEL', KEYS[2], ARGV[2])
return {'removed', role}
"""
)

# KEYS: organization, members, invitations. ARGV: user id, '1' to only say what would happen. What the
# deletion of a user's account does to one membership: {'none'} (not a member), {'deleted'} (the only
# member: the organization goes with it), {'last_owner'} (the only owner among others: refused),
# {'removed', role}.
LEAVE_WITH_ACCOUNT_LUA = (
    COMMON_LUA
    + """
if redis.call('EXISTS', KEYS[1]) == 0 then return {'none'} end
local held = redis.call('HGET', KEYS[2], ARGV[1])
if not held then return {'none'} end
local role = cjson.decode(held)['role']
if redis.call('HLEN', KEYS[2]) == 1 then
  if ARGV[2] ~= '1' then redis.call('DEL', KEYS[1], KEYS[2], KEYS[3]) end
  return {'deleted', role}
end
if role == 'owner' and owners() <= 1 then return {'last_owner'} end
if ARGV[2] ~= '1' then redis.call('HDEL', KEYS[2], ARGV[1]) end
return {'removed', role}
"""
)

# KEYS: organization, members, invitations. ARGV: actor, invitation id, its JSON, its role, now.
# Owners and admins invite, an admin not an owner; expired invitations are dropped on the way.
# {'ok'} | {'gone'} | {'outsider'} | {'forbidden'}.
INVITE_LUA = (
    COMMON_LUA
    + """
if redis.call('EXISTS', KEYS[1]) == 0 then return {'gone'} end
local acting = role_of(ARGV[1])
if not acting then return {'outsider'} end
if rank[acting] < rank['admin'] or rank[ARGV[4]] > rank[acting] then return {'forbidden'} end
local stored = redis.call('HGETALL', KEYS[3])
for i = 1, #stored, 2 do
  local ok, invitation = pcall(cjson.decode, stored[i + 1])
  if not ok or type(invitation) ~= 'table' or tonumber(invitation['expires']) <= tonumber(ARGV[5]) then
    redis.call('HDEL', KEYS[3], stored[i])
  end
end
redis.call('HSET', KEYS[3], ARGV[2], ARGV[3])
return {'ok'}
"""
)

# KEYS: organization, members, invitations. ARGV: actor, invitation id. Owners and admins revoke.
# {'ok'} | {'gone'} | {'outsider'} | {'forbidden'} | {'unknown'}.
REVOKE_INVITATION_LUA = (
    COMMON_LUA
    + """
if redis.call('EXISTS', KEYS[1]) == 0 then return {'gone'} end
local acting = role_of(ARGV[1])
if not acting then return {'outsider'} end
if rank[acting] < rank['admin'] then return {'forbidden'} end
if redis.call('HDEL', KEYS[3], ARGV[2]) == 0 then return {'unknown'} end
return {'ok'}
"""
)

# KEYS[1] the invitations. ARGV: invitation id, the new token's hash, now. Keeps the hash of the token a
# mail is about to carry (a later mail of the same invitation replaces it): 1, or 0 when the invitation is
# gone or expired.
LINK_HASH_LUA = """
local held = redis.call('HGET', KEYS[1], ARGV[1])
if not held then return 0 end
local invitation = cjson.decode(held)
if tonumber(invitation['expires']) <= tonumber(ARGV[3]) then return 0 end
invitation['token_hash'] = ARGV[2]
redis.call('HSET', KEYS[1], ARGV[1], cjson.encode(invitation))
return 1
"""

# KEYS: organization, members, invitations. ARGV: invitation id, the token's hash, now, user id, the user's
# address, joined_at. Uses the invitation (once) and makes the user a member with its role, an existing
# member keeping the higher role. {'invalid'} (used, expired, revoked, unknown) | {'wrong_email'} (left
# unused) | {outcome, role now, role before ('' for none), invited role}, outcome 'added' | 'upgraded' | 'kept'.
ACCEPT_LUA = (
    COMMON_LUA
    + """
if redis.call('EXISTS', KEYS[1]) == 0 then return {'invalid'} end
local held = redis.call('HGET', KEYS[3], ARGV[1])
if not held then return {'invalid'} end
local invitation = cjson.decode(held)
if tonumber(invitation['expires']) <= tonumber(ARGV[3]) then
  redis.call('HDEL', KEYS[3], ARGV[1])
  return {'invalid'}
end
if type(invitation['token_hash']) ~= 'string' or invitation['token_hash'] ~= ARGV[2] then return {'invalid'} end
if invitation['email'] ~= ARGV[5] then return {'wrong_email'} end
redis.call('HDEL', KEYS[3], ARGV[1])
local invited = invitation['role']
local current = redis.call('HGET', KEYS[2], ARGV[4])
if not current then
  redis.call('HSET', KEYS[2], ARGV[4], cjson.encode({role = invited, joined_at = ARGV[6]}))
  return {'added', invited, '', invited}
end
local member = cjson.decode(current)
local before = member['role']
if rank[invited] <= rank[before] then return {'kept', before, before, invited} end
member['role'] = invited
redis.call('HSET', KEYS[2], ARGV[4], cjson.encode(member))
return {'upgraded', invited, before, invited}
"""
)


def _org_keys(org_id: str) -> list[str]:
    return [Keys.org(org_id), Keys.org_members(org_id), Keys.org_invitations(org_id)]


def _run(source: str, org_id: str, *args) -> list:
    return get_script(source)(keys=_org_keys(org_id), args=list(args))


def moment(epoch: float) -> str:
    """A time as answers show when a member joined: RFC 3339 in UTC, with milliseconds (so members who
    joined within one second keep their order)."""
    return datetime.fromtimestamp(epoch, tz=UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def answer(record: dict, role: str | None = None) -> dict:
    """O: an organization as answers show it, with the caller's role when it has one."""
    shown = {"id": record["id"], "name": record["name"], "created_at": rfc3339(record["created_at"])}
    if role is not None:
        shown["role"] = role
    return shown


def member_role(held: str | None) -> str | None:
    """The role a members-hash entry names, or None for no entry."""
    return json.loads(held)["role"] if held else None


# Organizations


def create(name: str, user_id: str) -> dict | None:
    """A new organization whose owner is `user_id`; None (nothing kept) when that user no longer exists."""
    client = get_redis()
    org_id, now = uuid.uuid4().hex, time.time()
    client.zadd(Keys.orgs(), {org_id: int(now * 1000)})  # first: an entry without its record counts as absent
    owner = json.dumps({"role": "owner", "joined_at": moment(now)})
    get_script(CREATE_LUA)(keys=_org_keys(org_id)[:2], args=[org_id, name, f"{now:.3f}", user_id, owner])
    if not index(user_id, org_id, "owner"):
        client.delete(*_org_keys(org_id))
        client.zrem(Keys.orgs(), org_id)
        return None
    return {"id": org_id, "name": name, "created_at": f"{now:.3f}"}


def get(org_id: str, user_id: str | None = None) -> tuple[dict | None, str | None]:
    """The organization's record (None when there is none) and `user_id`'s role in it (None for none)."""
    pipe = get_redis().pipeline(transaction=False)  # one hash slot
    pipe.hgetall(Keys.org(org_id))
    pipe.hget(Keys.org_members(org_id), user_id or "-")
    record, held = pipe.execute()
    return record or None, member_role(held)


def rename(org_id: str, actor: str, name: str) -> str:
    """Rename the organization: 'ok', or the refusal (see RENAME_LUA)."""
    return _run(RENAME_LUA, org_id, actor, name)[0]


def delete(org_id: str, actor: str) -> tuple[str, list[str]]:
    """Delete the organization and its invitations ('deleted' and the former members), or the refusal;
    then its members' index entries and its place in the admins' listing."""
    outcome, *members = _run(DELETE_LUA, org_id, actor)
    if outcome == "deleted":
        forget(org_id, members)
    return outcome, members


def forget(org_id: str, members: list[str]) -> None:
    """Once an organization's keys are gone: its members' index entries and its listing entry."""
    pipe = get_redis().pipeline(transaction=False)  # one key each: fine across hash slots
    for user_id in members:
        pipe.hdel(Keys.user_orgs(user_id), org_id)
    pipe.zrem(Keys.orgs(), org_id)
    pipe.execute()


def orgs_of(user_id: str) -> list[dict]:
    """O for each organization the user belongs to (the index, checked against each members hash), by name."""
    client = get_redis()
    org_ids = sorted(client.hkeys(Keys.user_orgs(user_id)))
    if not org_ids:
        return []
    pipe = client.pipeline(transaction=False)
    for org_id in org_ids:
        pipe.hgetall(Keys.org(org_id))
        pipe.hget(Keys.org_members(org_id), user_id)
    found = pipe.execute()
    shown = [
        answer(record, member_role(held))
        for record, held in zip(found[::2], found[1::2], strict=True)
        if record and held
    ]
    return sorted(shown, key=lambda org: (org["name"].casefold(), org["id"]))


def page(before: str | None, limit: int) -> tuple[list[dict], str | None]:
    """Organizations newest first, older than the cursor `before` (`<ms>-<org id>`), at most `limit`; and
    the cursor of the next page, None when nothing older is left."""
    client = get_redis()
    if before is None:
        ids = client.zrevrangebyscore(Keys.orgs(), "+inf", "-inf", start=0, num=limit + 1, withscores=True)
    else:
        ms, last_id = CURSOR.fullmatch(before).groups()
        # Newest first is by score, then by id (descending): the same millisecond's older ids come first.
        same = [(i, s) for i, s in client.zrangebyscore(Keys.orgs(), ms, ms, withscores=True) if i < last_id]
        older = client.zrevrangebyscore(Keys.orgs(), f"({ms}", "-inf", start=0, num=limit + 1, withscores=True)
        ids = sorted(same, reverse=True) + older
    listed = ids[: limit + 1]
    pipe = client.pipeline(transaction=False)
    for org_id, _ in listed[:limit]:
        pipe.hgetall(Keys.org(org_id))
    records = pipe.execute() if listed else []
    orgs = [answer(record) for record in records if record]
    following = None
    if len(listed) > limit:
        org_id, score = listed[limit - 1]
        following = f"{int(score):013d}-{org_id}"
    return orgs, following


# Members


def index(user_id: str, org_id: str, role: str) -> bool:
    """Put the membership in the user's index; False when the account is gone."""
    return bool(get_script(INDEX_LUA)(keys=[Keys.user(user_id), Keys.user_orgs(user_id)], args=[org_id, role]))


def members(org_id: str) -> list[dict]:
    """The organization's members with their addresses, oldest first."""
    client = get_redis()
    held = client.hgetall(Keys.org_members(org_id))
    user_ids = sorted(held)
    pipe = client.pipeline(transaction=False)  # one key each: fine across hash slots
    for user_id in user_ids:
        pipe.hget(Keys.user(user_id), "email")
    found = [
        {"user_id": user_id, "email": email or None, **_membership(held[user_id])}
        for user_id, email in zip(user_ids, pipe.execute(), strict=True)
    ]
    return sorted(found, key=lambda member: (member["joined_at"], member["user_id"]))


def member(org_id: str, user_id: str) -> dict | None:
    """One member as `members` shows it, or None."""
    client = get_redis()
    held = client.hget(Keys.org_members(org_id), user_id)
    if held is None:
        return None
    return {"user_id": user_id, "email": client.hget(Keys.user(user_id), "email") or None, **_membership(held)}


def _membership(held: str) -> dict:
    stored = json.loads(held)
    return {"role": stored["role"], "joined_at": stored["joined_at"]}


def set_role(org_id: str, actor: str, user_id: str, role: str) -> tuple[str, str | None]:
    """Change a member's role: ('changed' | 'same', the role before), or the refusal (see SET_ROLE_LUA)."""
    outcome, *before = _run(SET_ROLE_LUA, org_id, actor, user_id, role)
    if outcome == "changed":
        get_script(REINDEX_LUA)(keys=[Keys.user_orgs(user_id)], args=[org_id, role])
    return outcome, before[0] if before else None


def remove(org_id: str, actor: str, user_id: str) -> tuple[str, str | None]:
    """Remove a member (also itself): ('removed', its role), or the refusal (see REMOVE_LUA)."""
    outcome, *role = _run(REMOVE_LUA, org_id, actor, user_id)
    if outcome == "removed":
        unindex(org_id, user_id)
    return outcome, role[0] if role else None


def unindex(org_id: str, user_id: str) -> None:
    """Drop the membership from the user's index, unless the user became a member again meanwhile."""
    client = get_redis()
    client.hdel(Keys.user_orgs(user_id), org_id)
    role = member_role(client.hget(Keys.org_members(org_id), user_id))
    if role is not None:
        index(user_id, org_id, role)


def memberships(user_id: str) -> list[str]:
    """The organizations the user's index names (some may have ended meanwhile), sorted."""
    return sorted(get_redis().hkeys(Keys.user_orgs(user_id)))


def leave_with_account(org_id: str, user_id: str, dry_run: bool) -> tuple[str, str | None]:
    """What deleting the user's account does to one membership (see LEAVE_WITH_ACCOUNT_LUA); with
    `dry_run`, only what it would do."""
    outcome, *role = _run(LEAVE_WITH_ACCOUNT_LUA, org_id, user_id, "1" if dry_run else "0")
    if not dry_run and outcome == "deleted":
        forget(org_id, [user_id])
    elif not dry_run and outcome == "removed":
        get_redis().hdel(Keys.user_orgs(user_id), org_id)
    return outcome, role[0] if role else None


# Invitations


def invite(org_id: str, actor: str, email: str, role: str) -> tuple[str, dict]:
    """Record an invitation of `email` with `role`: ('ok', V), or the refusal (see INVITE_LUA)."""
    now = time.time()
    invitation = {
        "id": uuid.uuid4().hex,
        "email": email,
        "role": role,
        "created_at": moment(now),
        "expires_at": moment(now + INVITATION_LIFETIME),
        "expires": int(now) + INVITATION_LIFETIME,
        "token_hash": "",
    }
    outcome = _run(INVITE_LUA, org_id, actor, invitation["id"], json.dumps(invitation), role, int(now))[0]
    return outcome, invitation_answer(invitation)


def invitation_answer(invitation: dict) -> dict:
    """V: an invitation as answers show it (never its token's hash)."""
    return {name: invitation[name] for name in ("id", "email", "role", "created_at", "expires_at")}


def invitations(org_id: str) -> list[dict]:
    """V for each open invitation (not expired), oldest first."""
    now = time.time()
    held = [json.loads(value) for value in get_redis().hvals(Keys.org_invitations(org_id))]
    live = [invitation for invitation in held if invitation["expires"] > now]
    return [invitation_answer(i) for i in sorted(live, key=lambda i: (i["created_at"], i["id"]))]


def invitation(org_id: str, invitation_id: str) -> dict | None:
    """The stored invitation (with its `expires` epoch), or None."""
    held = get_redis().hget(Keys.org_invitations(org_id), invitation_id)
    return json.loads(held) if held else None


def revoke_invitation(org_id: str, actor: str, invitation_id: str) -> str:
    """Delete an invitation: 'ok', or the refusal (see REVOKE_INVITATION_LUA)."""
    return _run(REVOKE_INVITATION_LUA, org_id, actor, invitation_id)[0]


def _hash(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def issue_token(org_id: str, invitation_id: str) -> str | None:
    """A new token for an invitation's mail (its hash replaces any earlier one); None when it is gone."""
    secret = secrets.token_urlsafe(32)
    issued = get_script(LINK_HASH_LUA)(
        keys=[Keys.org_invitations(org_id)], args=[invitation_id, _hash(secret), int(time.time())]
    )
    return f"{org_id}.{invitation_id}.{secret}" if issued else None


def parse_token(token: str) -> tuple[str, str, str] | None:
    """(org id, invitation id, secret) of a token of the right shape, else None."""
    parts = token.split(".")
    if len(parts) != 3 or not ORG_ID.fullmatch(parts[0]) or not INVITATION_ID.fullmatch(parts[1]):
        return None
    if not re.fullmatch(r"[A-Za-z0-9_-]{43,100}", parts[2]):
        return None
    return parts[0], parts[1], parts[2]


def accept(org_id: str, invitation_id: str, secret: str, user_id: str, email: str) -> list[str]:
    """Use an invitation for the user with address `email` (see ACCEPT_LUA for what is answered)."""
    return _run(ACCEPT_LUA, org_id, invitation_id, _hash(secret), int(time.time()), user_id, email, moment(time.time()))
