"""User records: creation, look-up, the public view (`U` in docs/api.md) and password changes.

A user from a trusted issuer (an external user) is an ordinary record with `external_issuer` and
`external_sub`, found by that pair alone (`Keys.user_by_external`). Its e-mail, as the issuer's token
gave it (or empty), is never in the e-mail index: no password login, reset or OAuth login finds it, and
it is never linked to or merged with another account by its address.
"""

from __future__ import annotations

import contextlib
import re
import time
import uuid

import gevent
import redis
from flask import current_app

from .. import audit
from ..channels.grants import forget_user as forget_user_grants
from ..errors import ApiError, validation_failed
from ..http import rfc3339
from ..redis import AUDIT_LUA, END_SESSION_FUNCTION_LUA, Keys, get_redis, get_script
from . import emails, indexes, passwords
from .sessions import run_listed, sessions_ended

PASSWORD_MIN, PASSWORD_MAX = 8, 1024
ROLES = ("user", "admin")
BUILD_WAIT_SECONDS = 3  # how long a search waits for another one filling the e-mail search index
USER_ID = re.compile(r"[0-9a-f]{32}")


def normalise_email(email: str) -> str:
    """The form e-mail addresses are compared and stored in."""
    return emails.normalise(email)


def validate_email(email: str) -> str:
    """The normalised address, or 422 when it is not one plain address (emails.py)."""
    try:
        return emails.plain_address(email)
    except emails.NotPlainAddress as error:
        raise validation_failed(f"The e-mail address is not valid: {error}.") from None


def validate_password(password: str) -> str:
    """The password, or 422 when its length is outside what accounts accept."""
    if not PASSWORD_MIN <= len(password) <= PASSWORD_MAX:
        raise validation_failed(f"The password must have {PASSWORD_MIN} to {PASSWORD_MAX} characters.")
    return password


def create_user(
    email: str,
    password: str | None,
    role: str = "user",
    identities: tuple[str, ...] = (),
    email_verified: bool = False,
) -> dict:
    """Create a user (password hashed off the hub); 409 if the e-mail or an identity is taken."""
    email = validate_email(email)
    if role not in ROLES:
        raise validation_failed(f"The role must be one of {', '.join(ROLES)}.")
    # No password: an account that only logs in through an OAuth provider (password login always fails).
    password_hash = passwords.hash_password(validate_password(password)) if password is not None else ""
    user = {
        "id": uuid.uuid4().hex,
        "email": email,
        "role": role,
        "password_hash": password_hash,
        "token_version": "0",
        "created_at": f"{time.time():.3f}",
        "email_verified": "1" if email_verified else "0",
    }
    _store_new_user(user, [Keys.user_by_email(email), *identities], identities)
    if role == "admin":
        _index_admin(user["id"])
    # After the last index is committed (an account exists only from then on): a step of its own.
    method = "oauth" if identities else "password"
    audit.record("user.registered", subject=user["id"], details={"method": method, "role": role})
    return user


def find_or_create_external_user(issuer: str, subject: str, email: str | None) -> dict:
    """The user a trusted issuer knows by `subject`, made with role `user` at its first exchange; its e-mail
    (a plain address, or None) kept as the issuer's latest token gives it."""
    index = Keys.user_by_external(issuer, subject)
    for _ in range(2):  # a creation for the same subject at the same moment wins once; then it is found
        user_id = indexes.holder(get_redis().get(index))
        user = get_user(user_id) if user_id else None
        if user is not None:
            if user.get("email", "") != (email or ""):
                get_redis().hset(Keys.user(user["id"]), "email", email or "")
                user["email"] = email or ""
            return user
        try:
            return _create_external_user(index, issuer, subject, email)
        except ApiError as refused:
            if refused.status != 409:
                raise
    raise _conflict()


def _create_external_user(index: str, issuer: str, subject: str, email: str | None) -> dict:
    user = {
        "id": uuid.uuid4().hex,
        "email": email or "",
        "role": "user",
        "password_hash": "",  # no password: it logs in through its issuer only
        "token_version": "0",
        "created_at": f"{time.time():.3f}",
        "email_verified": "0",
        "external_issuer": issuer,
        "external_sub": subject,
    }
    _store_new_user(user, [index], (index,))  # the index is also an identity: deleting the user releases it
    details = {"method": "token_exchange", "issuer": issuer, "role": "user"}
    audit.record("user.registered", subject=user["id"], details=details)
    return user


def is_external(user: dict) -> bool:
    """Whether the user comes from a trusted issuer (and logs in through it only)."""
    return bool(user.get("external_issuer"))


def _conflict() -> ApiError:
    return ApiError(409, "conflict", "An account with this e-mail address already exists.")


def _store_new_user(user: dict, index_keys: list[str], identities: tuple[str, ...]) -> None:
    """Claim the indexes, write the record, commit the claims: ordered single-slot steps (see indexes.py).

    On a conflict, or any failure, whatever this creation wrote is undone (as far as Redis lets us);
    a crash in between leaves claims and a list entry whose record is missing, which count as free.
    """
    client = get_redis()
    user_id = user["id"]
    searchable = None if is_external(user) else indexes.email_order_member(user["email"], user_id)
    claimed: list[str] = []
    written = False
    try:
        for key in index_keys:
            if indexes.claim(key, user_id) is not None:
                raise _conflict()
            claimed.append(key)
        listed = client.pipeline(transaction=False)  # two keys, perhaps two nodes: one round trip
        listed.zadd(Keys.users(), {user_id: float(user["created_at"])})
        if searchable:  # before the record: a crash leaves a member whose record is missing, never the reverse
            listed.zadd(indexes.EMAIL_ORDER, {searchable: 0})
        listed.execute()
        pipe = client.pipeline(transaction=True)
        pipe.hset(Keys.user(user_id), mapping=user)
        if identities:
            pipe.sadd(Keys.user_identities(user_id), *identities)
        pipe.execute()
        written = True
        for key in index_keys:
            if not indexes.commit(key, user_id):
                raise _conflict()  # a concurrent creation took the claim over before our record existed
    except BaseException:
        with contextlib.suppress(redis.exceptions.RedisError):
            if written:
                client.delete(Keys.user(user_id), Keys.user_identities(user_id))
            unlisted = client.pipeline(transaction=False)
            unlisted.zrem(Keys.users(), user_id)
            if searchable:
                unlisted.zrem(indexes.EMAIL_ORDER, searchable)
            unlisted.execute()
            for key in claimed:
                indexes.release(key, user_id)
        raise


def store_imported_users(records: list[dict]) -> dict[str, str]:
    """Create many users at once (an import): the ordered steps of one creation, each pipelined over the batch.

    `records` are complete user records (as `create_user` makes them) with distinct e-mails and ids. Returns
    each record's outcome by its id: `created`; `present` when an account has its e-mail already (or its id,
    with that e-mail), left unchanged; `id_taken` when another account has its id. Each created user gets its
    `user.registered` entry (method `import`).
    """
    client = get_redis()
    outcomes: dict[str, str] = {}
    pipe = client.pipeline(transaction=False)
    for record in records:
        pipe.hget(Keys.user(record["id"]), "email")
    for record, held in zip(records, pipe.execute(), strict=True):
        if held is not None:
            outcomes[record["id"]] = "present" if held == record["email"] else "id_taken"
    claimed = _claim_imported(client, [record for record in records if record["id"] not in outcomes], outcomes)
    created = _write_imported(client, claimed, outcomes)
    # Only once committed: an admin indexed before its creation is undone would be counted by the last-admin
    # rule. An import that stops before this point is repaired by running it again (its admins are present).
    for record in created:
        if record["role"] == "admin":
            _index_admin(record["id"])
    _index_present_admins(client, [record for record in records if outcomes[record["id"]] == "present"])
    for record in created:
        details = {"method": "import", "role": record["role"]}
        audit.record("user.registered", subject=record["id"], details=details)
    return outcomes


def _claim_imported(client, records: list[dict], outcomes: dict[str, str]) -> list[dict]:
    """Claim each record's e-mail; the records claimed. A held address whose account exists is `present`
    (a pending claim of an existing record is committed for its creator, as `indexes.claim` does); one whose
    account is missing was left by a crash and is taken over, one at a time."""
    answers = indexes.claim_many([(Keys.user_by_email(record["email"]), record["id"]) for record in records])
    claimed = [record for record, value in zip(records, answers, strict=True) if value is None]
    held = [(record, value) for record, value in zip(records, answers, strict=True) if value is not None]
    if not held:
        return claimed
    pipe = client.pipeline(transaction=False)
    for _, value in held:
        pipe.exists(Keys.user(indexes.holder(value)))
    unfinished = []
    for (record, value), exists in zip(held, pipe.execute(), strict=True):
        key = Keys.user_by_email(record["email"])
        if exists:
            outcomes[record["id"]] = "present"
            if value != indexes.holder(value):
                unfinished.append((key, indexes.holder(value)))
        elif indexes.claim(key, record["id"]) is None:
            claimed.append(record)
        else:
            outcomes[record["id"]] = "present"
    if unfinished:
        indexes.commit_many(unfinished)
    return claimed


def _write_imported(client, claimed: list[dict], outcomes: dict[str, str]) -> list[dict]:
    """List, index for search, write and commit the claimed records, in that order; the ones created."""
    if not claimed:
        return []
    try:
        client.zadd(Keys.users(), {record["id"]: float(record["created_at"]) for record in claimed})
        members = {indexes.email_order_member(record["email"], record["id"]): 0 for record in claimed}
        client.zadd(indexes.EMAIL_ORDER, members)
        pipe = client.pipeline(transaction=False)
        for record in claimed:
            pipe.hset(Keys.user(record["id"]), mapping=record)
        pipe.execute()
        committed = indexes.commit_many([(Keys.user_by_email(record["email"]), record["id"]) for record in claimed])
    except BaseException:
        _undo_imported(client, claimed)
        raise
    # A claim taken over before our record existed: a creation of that address at the same moment won.
    lost = [record for record, ok in zip(claimed, committed, strict=True) if not ok]
    _undo_imported(client, lost)
    for record, ok in zip(claimed, committed, strict=True):
        outcomes[record["id"]] = "created" if ok else "present"
    return [record for record, ok in zip(claimed, committed, strict=True) if ok]


def _index_present_admins(client, records: list[dict]) -> None:
    """Index the admins among the accounts that lines asking for an admin found present: an import that stopped
    after writing its records and before indexing its admins is repaired by running it again."""
    asked = [record for record in records if record["role"] == "admin"]
    if not asked:
        return
    pipe = client.pipeline(transaction=False)
    for record in asked:
        pipe.get(Keys.user_by_email(record["email"]))
    holders = [indexes.holder(value) for value in pipe.execute()]
    for user_id in _admins_among([user_id for user_id in holders if user_id]):
        _index_admin(user_id)


def _undo_imported(client, records: list[dict]) -> None:
    """Remove whatever an import wrote for these records (as far as Redis lets us; leftovers count as free)."""
    if not records:
        return
    with contextlib.suppress(redis.exceptions.RedisError):
        pipe = client.pipeline(transaction=False)
        for record in records:
            pipe.delete(Keys.user(record["id"]))
        pipe.execute()
        client.zrem(Keys.users(), *(record["id"] for record in records))
        client.zrem(indexes.EMAIL_ORDER, *(indexes.email_order_member(r["email"], r["id"]) for r in records))
        indexes.release_many([(Keys.user_by_email(record["email"]), record["id"]) for record in records])


def find_user_id_by_email(email: str) -> str | None:
    """The id of the account with this e-mail, if any (its record may be missing: check it)."""
    return indexes.holder(get_redis().get(Keys.user_by_email(normalise_email(email))))


def get_user(user_id: str) -> dict | None:
    """The stored user record, or None."""
    record = get_redis().hgetall(Keys.user(user_id))
    return record or None


def public_user(user: dict) -> dict:
    """U: the fields of a user that answers may show (an external user's issuer and subject too)."""
    shown = {
        "id": user["id"],
        "email": user["email"],
        "role": user["role"],
        "email_verified": user.get("email_verified") == "1",
        "mfa_enabled": bool(user.get("totp_secret")),
    }
    if is_external(user):
        shown["email"] = user["email"] or None
        shown["external"] = {"issuer": user["external_issuer"], "sub": user["external_sub"]}
    return shown


def admin_view(user: dict) -> dict:
    """U with what administrators also see: when the account was created."""
    return {**public_user(user), "created_at": rfc3339(user.get("created_at"))}


def find_user(id_or_email: str) -> dict | None:
    """A user by id or by e-mail address (for operators)."""
    if "@" in id_or_email:
        user_id = find_user_id_by_email(id_or_email)
        return get_user(user_id) if user_id else None
    return get_user(id_or_email) if USER_ID.fullmatch(id_or_email) else None


def list_users(email: str | None = None, limit: int = 100, offset: int = 0) -> list[dict]:
    """Users newest first, or the one with this e-mail address (records as stored)."""
    client = get_redis()
    if email is not None:
        user_id = find_user_id_by_email(email)
        user = get_user(user_id) if user_id else None
        return [user] if user else []
    ids = client.zrevrange(Keys.users(), offset, offset + limit - 1)
    pipe = client.pipeline(transaction=False)
    for user_id in ids:
        pipe.hgetall(Keys.user(user_id))
    return [record for record in pipe.execute() if record]  # an entry left by a crashed creation: no record


def find_users_by_email_prefix(prefix: str, limit: int = 50) -> list[dict]:
    """Users (records as stored) whose e-mail starts with `prefix`, any case, in ascending e-mail order.

    External users are not found (they have no e-mail index). Members of the e-mail search index whose
    record is missing are skipped, and removed once no creation can still finish them.
    """
    prefix = normalise_email(prefix)
    if limit < 1 or "\x00" in prefix:
        return []
    client = get_redis()
    if not client.exists(indexes.EMAIL_ORDER_BUILT):
        _build_email_order_once(client)
    low, high = indexes.email_prefix_range(prefix)
    found: list[dict] = []
    while len(found) < limit:
        wanted = limit - len(found)
        members = client.zrangebylex(indexes.EMAIL_ORDER, low, high, start=0, num=wanted)
        found += _users_of_members(client, members)
        if len(members) < wanted:
            break
        low = b"(" + members[-1].encode()  # after the last one read: members removed meanwhile move nothing
    return found


def _build_email_order_once(client) -> None:
    """Fill the e-mail search index for the users from before it, once however many search at that moment.

    One search builds (it reads every user); the others wait for it a little, then answer from what is there
    so far. A builder that dies leaves its guard to expire, and a later search builds.
    """
    if client.set(indexes.EMAIL_ORDER_BUILDING, "1", nx=True, ex=indexes.BUILD_GUARD_SECONDS):
        try:
            indexes.build_email_order(client, pause=lambda: gevent.sleep(0))
        finally:
            client.delete(indexes.EMAIL_ORDER_BUILDING)
        return
    deadline = time.monotonic() + BUILD_WAIT_SECONDS
    while time.monotonic() < deadline and not client.exists(indexes.EMAIL_ORDER_BUILT):
        gevent.sleep(0.05)


def _users_of_members(client, members: list[str]) -> list[dict]:
    """The live users that members of the e-mail search index name; the others are skipped or removed."""
    pipe = client.pipeline(transaction=False)
    for member in members:
        pipe.hgetall(Keys.user(indexes.split_email_order_member(member)[1]))
    records = pipe.execute()
    found, missing, wrong = [], [], []
    for member, record in zip(members, records, strict=True):
        email, user_id = indexes.split_email_order_member(member)
        if not record:
            missing.append(member)
        elif record.get("email") != email or is_external(record):
            wrong.append(member)  # never true of a member written by a creation (an address never changes)
        else:
            found.append(record)
    if missing or wrong:
        _drop_stale(client, missing, wrong)
    return found


def _drop_stale(client, missing: list[str], wrong: list[str]) -> None:
    """Remove members whose record is missing for good, and those that do not match their record.

    A member whose record was missing is kept while the e-mail index names its user: pending, its creation
    may still write the record; committed, the record was written before the commit (a creation that
    finished since the record was read), so it is removed only if the record is missing still, read after
    the claim (a deletion removes the record before it releases the claim, and a record never comes back).
    Any other value (another user's, none) means that creation failed or the user is gone.
    """
    pipe = client.pipeline(transaction=False)
    for member in missing:
        pipe.get(Keys.user_by_email(indexes.split_email_order_member(member)[0]))
    claims = pipe.execute() if missing else []
    stale = list(wrong)
    committed = []
    for member, value in zip(missing, claims, strict=True):
        user_id = indexes.split_email_order_member(member)[1]
        if value == user_id:
            committed.append(member)
        elif value != indexes.PENDING + user_id:
            stale.append(member)
    if committed:  # after the claims were read, in a round trip of its own: the order is what makes it safe
        pipe = client.pipeline(transaction=False)
        for member in committed:
            pipe.exists(Keys.user(indexes.split_email_order_member(member)[1]))
        stale += [member for member, exists in zip(committed, pipe.execute(), strict=True) if not exists]
    if stale:
        client.zrem(indexes.EMAIL_ORDER, *stale)


# KEYS[1] user, then the role.changed audit entry's (AUDIT_LUA). ARGV: role, then the entry's. 1 when the
# user exists and had the role already, 2 when the role changed (and the entry is recorded), 0 otherwise.
SET_ROLE_LUA = (
    AUDIT_LUA
    + """
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
local before = redis.call('HGET', KEYS[1], 'role')
redis.call('HSET', KEYS[1], 'role', ARGV[1])
if before == ARGV[1] then return 1 end
record_audit()
return 2
"""
)

# The admins index (Keys.admins): `*` marks it built. Building reads every record, so it happens once.
# KEYS[1] the index. ARGV: user id. 'ok' once the id is out of the index, 'last' when that would leave
# no indexed admin but this one, 'unbuilt'.
DROP_ADMIN_LUA = """
if redis.call('SISMEMBER', KEYS[1], '*') == 0 then return 'unbuilt' end
local member = redis.call('SISMEMBER', KEYS[1], ARGV[1])
if redis.call('SCARD', KEYS[1]) - 1 - member < 1 then return 'last' end
redis.call('SREM', KEYS[1], ARGV[1])
return 'ok'
"""

# KEYS[1] the index. ARGV: user id. Adds an admin once the index is built (building finds it by its record).
ADD_ADMIN_LUA = """
if redis.call('SISMEMBER', KEYS[1], '*') == 0 then return 0 end
return redis.call('SADD', KEYS[1], ARGV[1])
"""

# KEYS[1] the index. ARGV: the ids of every admin. Builds the index unless it is built already.
BUILD_ADMINS_LUA = """
if redis.call('SISMEMBER', KEYS[1], '*') == 1 then return 0 end
redis.call('SADD', KEYS[1], '*', unpack(ARGV))
return 1
"""


def last_admin() -> ApiError:
    """409: the change would leave the service without an administrator."""
    return ApiError(409, "conflict", "This is the last administrator: make another one before demoting or deleting it.")


def _index_admin(user_id: str) -> None:
    get_script(ADD_ADMIN_LUA)(keys=[Keys.admins()], args=[user_id])


def _release_admin(user_id: str) -> None:
    """Take an admin out of the index before its role or record goes; 409 when it is the last one.

    The check and the removal are one step on one key, so two administrators demoting each other
    at the same moment, on any instances, cannot both succeed.
    """
    _forget_former_admins()
    drop = get_script(DROP_ADMIN_LUA)
    outcome = drop(keys=[Keys.admins()], args=[user_id])
    if outcome == "unbuilt":
        get_script(BUILD_ADMINS_LUA)(keys=[Keys.admins()], args=_find_admins())
        outcome = drop(keys=[Keys.admins()], args=[user_id])
    if outcome != "ok":
        raise last_admin()


def _find_admins() -> list[str]:
    """Every user whose record says admin, read in batches that let other greenlets run in between."""
    client, admins = get_redis(), []
    batch: list[str] = []
    for user_id, _ in client.zscan_iter(Keys.users(), count=500):
        batch.append(user_id)
        if len(batch) == 500:
            admins += _admins_among(batch)
            batch = []
            gevent.sleep(0)
    return admins + _admins_among(batch)


def _admins_among(user_ids: list[str]) -> list[str]:
    pipe = get_redis().pipeline(transaction=False)
    for user_id in user_ids:
        pipe.hget(Keys.user(user_id), "role")
    return [user_id for user_id, role in zip(user_ids, pipe.execute(), strict=True) if role == "admin"]


def _forget_former_admins() -> None:
    """Take out of the index whoever's record no longer says admin (a promotion and a demotion of one user
    at the same moment can leave one behind), so that the index never counts an admin who is not one.
    Only ever removes: an admin left out makes the last-admin rule stricter, never looser."""
    client = get_redis()
    indexed = sorted(client.smembers(Keys.admins()) - {"*"})
    former = sorted(set(indexed) - set(_admins_among(indexed))) if indexed else []
    if former:
        client.srem(Keys.admins(), *former)


def set_role(user_id: str, role: str) -> dict | None:
    """Change a user's role; it applies from the user's next request (checks read the stored role).

    Live connections are closed so that they reconnect with the channels of the new role. Demoting
    the last administrator is 409.
    """
    if role not in ROLES:
        raise validation_failed(f"The role must be one of {', '.join(ROLES)}.")
    client = get_redis()
    before = client.hget(Keys.user(user_id), "role")
    if role != "admin" and before == "admin":
        _release_admin(user_id)
    entry = audit.new_entry("role.changed", subject=user_id, details={"role": role, "previous_role": before})
    changed = get_script(SET_ROLE_LUA)(
        keys=[Keys.user(user_id), *audit.script_keys(entry)], args=[role, *audit.script_args(entry)]
    )
    if not changed:
        return None
    if role == "admin":
        _index_admin(user_id)
    if changed == 2:
        audit.complete(entry)
        # No session ends; the hub's message closes the user's connections and clients resume by cursor.
        sessions_ended.send(current_app._get_current_object(), user_id=user_id, session_ids=[], whole_user=True)
    return get_user(user_id)


# KEYS: 1 user, 2 the user's session set, then ARGV[2] further keys of the user to delete, then the
# listing of every session with every token (SESSIONS_LUA, purge), then the user.deleted audit entry's
# (AUDIT_LUA). ARGV: now, that count, the listing, the entry's. Ends every session (deleting its
# refresh-token records too), deletes the keys and the user, and records the entry, which outlives them.
# {1, {ended session ids}}, nil for an unknown user, or 'stale'.
DELETE_USER_LUA = (
    END_SESSION_FUNCTION_LUA
    + AUDIT_LUA
    + """
if redis.call('EXISTS', KEYS[1]) == 0 then return false end
local n = tonumber(ARGV[2])
local sessions = listed_sessions(3 + n, 3)
if not still_current(sessions, KEYS[2], nil, true) then return 'stale' end
local ended = end_sessions(sessions, KEYS[2], ARGV[1], true)
for i = 3, 2 + n do redis.call('DEL', KEYS[i]) end
redis.call('DEL', KEYS[1], KEYS[2])
record_audit()
return {1, ended}
"""
)


def delete_user(user_id: str) -> bool:
    """Delete a user and every record of theirs; their sessions and live connections end at once.

    Deleting the last administrator is 409, and so is deleting the last owner of an organization that has
    other members (checked before anything changes); an organization the user alone belongs to is deleted
    with them, and their other memberships end.

    The user's own keys go in one step; then the global indexes that name the user are released and
    the user's event history deleted (other hash slots: if this stops in between, indexes naming a
    missing record count as free).
    """
    from ..events.bus import user_channel
    from ..orgs import manage as orgs
    from . import mailtokens

    client = get_redis()
    user = get_user(user_id)
    if user is None:
        return False
    orgs.leave_all(user_id)
    if user.get("role") == "admin":
        _release_admin(user_id)
    identities = sorted(client.smembers(Keys.user_identities(user_id)))
    passkeys = [Keys.user_by_passkey(credential_id) for credential_id in client.hkeys(Keys.user_passkeys(user_id))]
    keys = [
        Keys.user_recovery_codes(user_id),
        Keys.connection_leases(user_id),
        Keys.verification_resent(user_id),
        Keys.user_identities(user_id),
        Keys.user_passkeys(user_id),
        Keys.passkey_registration(user_id),
        *(Keys.user_mail_token(user_id, purpose) for purpose in (mailtokens.VERIFY, mailtokens.RESET)),
    ]
    entry = audit.new_entry("user.deleted", subject=user_id, details={"role": user.get("role")})
    script = get_script(DELETE_USER_LUA)
    result = run_listed(
        lambda listing, args: script(
            keys=[Keys.user(user_id), Keys.user_sessions(user_id), *keys, *listing, *audit.script_keys(entry)],
            args=[f"{time.time():.3f}", len(keys), *args, *audit.script_args(entry)],
        ),
        user_id,
        lambda: sorted(client.smembers(Keys.user_sessions(user_id))),
        purge=True,
    )
    if not result:
        return False
    audit.complete(entry)
    forget_user_grants(client, user_id)  # after the record is gone: no grant can be indexed again
    orgs.leave_all(user_id, gone=True)  # memberships made while it was being deleted: none can be made now
    by_email = [] if is_external(user) else [Keys.user_by_email(user["email"])]  # never indexed by address
    for index in [*by_email, *identities, *passkeys]:
        indexes.release(index, user_id)
    if is_external(user):
        client.srem(Keys.issuer_users(user["external_issuer"]), user_id)
    unlisted = client.pipeline(transaction=False)
    unlisted.zrem(Keys.users(), user_id)
    if not is_external(user):
        unlisted.zrem(indexes.EMAIL_ORDER, indexes.email_order_member(user["email"], user_id))
    unlisted.delete(Keys.stream(user_channel(user_id)))
    unlisted.execute()
    sessions_ended.send(
        current_app._get_current_object(), user_id=user_id, session_ids=list(result[1]), whole_user=True
    )
    return True


# KEYS[1] user. ARGV: the hash a login verified, the hash to store in its place. 1 when stored: only while the
# user exists and its hash is still the one verified (a password change made meanwhile stays).
REHASH_LUA = """
if redis.call('HGET', KEYS[1], 'password_hash') ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], 'password_hash', ARGV[2])
return 1
"""


def store_rehashed_password(user_id: str, verified_hash: str, new_hash: str) -> bool:
    """Replace the hash a login verified with a fresh one, unless it changed (or the user went) meanwhile."""
    return bool(get_script(REHASH_LUA)(keys=[Keys.user(user_id)], args=[verified_hash, new_hash]))


def change_password_hash(user_id: str, password_hash: str) -> None:
    """The user's new password (as its hash), stored in one transaction with its password.changed entry."""
    entry = audit.new_entry("password.changed", subject=user_id)
    pipe = get_redis().pipeline(transaction=True)
    pipe.hset(Keys.user(user_id), "password_hash", password_hash)
    audit.add_to_transaction(pipe, entry)
    pipe.execute()
    audit.complete(entry)


def password_matches(user: dict | None, password: str) -> bool:
    """Whether `password` is the user's; costs one hash verification whether or not the user exists.

    No stored password is longer than PASSWORD_MAX, so a longer one is refused without hashing (the
    hasher refuses such input itself). A match on outdated hash parameters stores a fresh hash.
    """
    if len(password) > PASSWORD_MAX:
        return False
    if not user or not user.get("password_hash"):
        passwords.spend_verification_time(password)
        return False
    ok, new_hash = passwords.verify_password(password, user["password_hash"])
    if ok and new_hash:
        store_rehashed_password(user["id"], user["password_hash"], new_hash)
    return ok
