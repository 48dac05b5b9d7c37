"""Imported users that can never break a login or a listing: hashes refused at import unless a login can verify
them within bounded cost, dates within reason, a NUL in a password that simply does not match, a rehash that
never undoes a concurrent reset, admins indexed across an interrupted import, and a search index that never
drops a live user nor is rebuilt by every first search at once."""

from __future__ import annotations

import uuid

import argon2
import pytest
from passlib.hash import bcrypt, django_pbkdf2_sha256

from app.auth import indexes, passwords, transfer, users
from app.redis import Keys
from tests.auth.test_user_import import write_lines
from tests.utils import DEFAULT_PASSWORD, bearer

BCRYPT_4 = bcrypt.using(rounds=4, ident="2b")
ARGON2 = argon2.PasswordHasher(time_cost=1, memory_cost=1024, parallelism=1).hash("x")
ARGON2_PARAMS, ARGON2_SALT, ARGON2_SUM = ARGON2.rsplit("$", 2)


def refusal(password_hash) -> str:
    """Why parse_line refuses a line with this hash ('' when it accepts it)."""
    try:
        transfer.parse_line(f'{{"email": "a@example.com", "password_hash": "{password_hash}"}}')
    except transfer.Refused as refused:
        return str(refused)
    return ""


@pytest.mark.parametrize(
    ("password_hash", "reason"),
    [
        (ARGON2_PARAMS + ",data=YWJj$" + ARGON2_SALT + "$" + ARGON2_SUM, "argon2 hash with a data= parameter"),
        (f"$argon2id$v=19$m=16,t=1,p=4${ARGON2_SALT}${ARGON2_SUM}", "argon2 memory cost 16 is below 8 per lane"),
        (f"{ARGON2_PARAMS}${ARGON2_SALT}$YWJj", "malformed argon2 hash"),
    ],
    ids=["data", "memory-per-lane", "short-checksum"],  # the hashes hold random salts: xdist needs stable ids
)
def test_argon2_hashes_that_no_login_could_verify_are_refused_at_import(password_hash, reason):
    assert refusal(password_hash).startswith(reason), refusal(password_hash)


def test_every_hash_the_import_accepts_verifies_without_an_error():
    """A hash that passes import must answer True or False at a login, never raise."""
    accepted = [
        ARGON2,
        argon2.PasswordHasher(time_cost=1, memory_cost=64, parallelism=4).hash("x"),
        argon2.PasswordHasher(time_cost=1, memory_cost=64, parallelism=1, type=argon2.Type.I).hash("x"),
        argon2.PasswordHasher(time_cost=1, memory_cost=64, parallelism=1, type=argon2.Type.D).hash("x"),
        BCRYPT_4.hash("x"),
        django_pbkdf2_sha256.using(rounds=1000).hash("x"),
    ]
    for password_hash in accepted:
        assert refusal(password_hash) == "", password_hash
        assert passwords._verify_and_update(passwords.MINIMAL_CONTEXT, "x", password_hash)[0] is True
        assert passwords._verify_and_update(passwords.MINIMAL_CONTEXT, "y\x00z", password_hash) == (False, None)


@pytest.mark.parametrize(
    ("password_hash", "reason"),
    [
        ("$2b$13$" + BCRYPT_4.hash("x")[7:], "bcrypt cost 13 is above 12"),
        (
            "pbkdf2_sha256$1000001$" + django_pbkdf2_sha256.using(rounds=1000).hash("x").split("$", 2)[2],
            "pbkdf2_sha256 iterations 1000001 are above 1,000,000",
        ),
        (f"$argon2id$v=19$m=65537,t=1,p=1${ARGON2_SALT}${ARGON2_SUM}", "argon2 costs above m=65536,t=4,p=4"),
        (f"$argon2id$v=19$m=1024,t=5,p=1${ARGON2_SALT}${ARGON2_SUM}", "argon2 costs above m=65536,t=4,p=4"),
        (f"$argon2id$v=19$m=1024,t=1,p=5${ARGON2_SALT}${ARGON2_SUM}", "argon2 costs above m=65536,t=4,p=4"),
    ],
    ids=["bcrypt-cost", "pbkdf2-iterations", "argon2-memory", "argon2-time", "argon2-lanes"],
)
def test_costs_that_would_stall_a_worker_at_one_wrong_guess_are_refused(password_hash, reason):
    assert refusal(password_hash) == reason


def test_the_highest_costs_allowed_are_accepted():
    assert refusal("$2b$12$" + BCRYPT_4.hash("x")[7:]) == ""
    assert refusal(f"$argon2id$v=19$m=65536,t=4,p=4${ARGON2_SALT}${ARGON2_SUM}") == ""


@pytest.mark.parametrize(
    "created_at",
    ["9999-12-31T23:59:59-01:00", "0001-01-01T00:00:00+01:00", "1969-12-31T23:59:59Z", "2999-01-01T00:00Z"],
)
def test_a_creation_date_before_1970_or_in_the_future_is_refused(created_at):
    line = f'{{"email": "a@example.com", "password_hash": null, "created_at": "{created_at}"}}'
    with pytest.raises(transfer.Refused, match="created_at must be between 1970-01-01 and now"):
        transfer.parse_line(line)
    accepted, _ = transfer.parse_line(line.replace(created_at, "1970-01-01T00:00:00Z"))
    assert accepted["created_at"] == "0.000"


def test_a_nul_in_the_password_of_an_imported_bcrypt_user_is_a_wrong_password_like_any_other(cli, auth, rdb, tmp_path):
    """Not a 500 (an unknown address answers 401, so that would tell which addresses have accounts); the same at
    re-authentication and at a password change, which check the password through the same function."""
    kept = BCRYPT_4.hash("abcdefghij")
    line = {"email": "nul@example.com", "password_hash": kept}
    assert cli("users", "import", write_lines(tmp_path / "users.jsonl", [line])).returncode == 0
    assert auth.login("nul@example.com", "a\x00bcdefghij").status_code == 401
    assert auth.login("nobody@example.com", "a\x00bcdefghij").status_code == 401
    tokens = auth.login_body("nul@example.com", "abcdefghij")
    user_key = Keys.user(tokens["user"]["id"])
    rdb.hset(user_key, "password_hash", kept)  # as imported again (the login stored an Argon2id hash)
    headers = bearer(tokens["access_token"])
    again = auth.client.post("/auth/reauthenticate", json={"password": "a\x00bcdefghij"}, headers=headers)
    assert again.status_code == 401 and again.get_json()["error"]["code"] == "invalid_credentials"
    change = {"current_password": "a\x00bcdefghij", "new_password": "something new"}
    changed = auth.client.post("/auth/password", json=change, headers=headers)
    assert changed.status_code == 401 and changed.get_json()["error"]["code"] == "invalid_credentials"
    assert rdb.hget(user_key, "password_hash") == kept
    right = auth.client.post("/auth/reauthenticate", json={"password": "abcdefghij"}, headers=headers)
    assert right.status_code == 204


def test_a_rehash_never_undoes_a_password_change_made_while_it_verified(app, rdb):
    """A login verifies the hash it read (slow for an imported one); meanwhile a reset stores another hash: the
    login's Argon2id hash of the old password must not replace it. A user deleted meanwhile stays deleted."""
    old_hash = BCRYPT_4.hash("old password")
    with app.app_context():
        user = users.create_user("rehash@example.com", DEFAULT_PASSWORD)
        rdb.hset(Keys.user(user["id"]), "password_hash", old_hash)
        read_at_login = users.get_user(user["id"])
        reset_hash = passwords.hash_password("new password")
        users.change_password_hash(user["id"], reset_hash)
        assert users.password_matches(read_at_login, "old password")
        assert rdb.hget(Keys.user(user["id"]), "password_hash") == reset_hash

        rdb.hset(Keys.user(user["id"]), "password_hash", old_hash)  # unchanged: the rehash is stored
        assert users.password_matches(users.get_user(user["id"]), "old password")
        assert rdb.hget(Keys.user(user["id"]), "password_hash").startswith("$argon2id$")

        rdb.hset(Keys.user(user["id"]), "password_hash", old_hash)
        read_at_login = users.get_user(user["id"])
        assert users.delete_user(user["id"])
        assert users.password_matches(read_at_login, "old password")
        assert not rdb.exists(Keys.user(user["id"]))


def _search_member(rdb, email: str, user_id: str, claim: str | None, record: bool) -> str:
    member = indexes.email_order_member(email, user_id)
    rdb.zadd(indexes.EMAIL_ORDER, {member: 0})
    if claim is not None:
        rdb.set(Keys.user_by_email(email), claim)
    if record:
        rdb.hset(Keys.user(user_id), mapping={"id": user_id, "email": email, "role": "user", "created_at": "1"})
    return member


def test_a_search_that_races_a_creation_never_drops_the_new_user(app, rdb):
    """The search read no record (the creation was under way); by the time it reads the claim, the creation
    has written its record and committed its claim. The member stays; only members of users gone are removed."""
    racing, gone, failed = uuid.uuid4().hex, uuid.uuid4().hex, uuid.uuid4().hex
    kept = [
        _search_member(rdb, "racing@example.com", racing, racing, record=True),  # committed, record now there
        _search_member(rdb, "pending@example.com", uuid.uuid4().hex, None, record=False),
    ]
    pending_id = indexes.split_email_order_member(kept[1])[1]
    rdb.set(Keys.user_by_email("pending@example.com"), indexes.PENDING + pending_id)
    removed = [
        _search_member(rdb, "gone@example.com", gone, gone, record=False),  # deletion died before the release
        _search_member(rdb, "failed@example.com", failed, None, record=False),
    ]
    with app.app_context():
        users._drop_stale(users.get_redis(), [*kept, *removed], [])
    assert sorted(rdb.zrange(indexes.EMAIL_ORDER, 0, -1)) == sorted(kept)


def test_only_one_first_search_rebuilds_the_index_the_others_answer_from_what_is_there(app, rdb, monkeypatch):
    with app.app_context():
        made = users.create_user("kim@example.com", DEFAULT_PASSWORD)
    rdb.delete(indexes.EMAIL_ORDER, indexes.EMAIL_ORDER_BUILT)
    rdb.set(indexes.EMAIL_ORDER_BUILDING, "another worker", ex=60)
    monkeypatch.setattr(users, "BUILD_WAIT_SECONDS", 0.2)
    with app.app_context():
        assert users.find_users_by_email_prefix("kim") == []  # being built elsewhere: not scanned again
    assert rdb.zcard(indexes.EMAIL_ORDER) == 0 and not rdb.exists(indexes.EMAIL_ORDER_BUILT)
    rdb.delete(indexes.EMAIL_ORDER_BUILDING)  # that builder died: its guard expires, the next search builds
    with app.app_context():
        assert [user["id"] for user in users.find_users_by_email_prefix("kim")] == [made["id"]]
    assert rdb.get(indexes.EMAIL_ORDER_BUILT) == "1" and not rdb.exists(indexes.EMAIL_ORDER_BUILDING)


def test_admins_of_an_import_that_died_are_indexed_by_the_next_run(app, cli, rdb, tmp_path):
    """An import that stopped after writing its records (claims pending or committed) but before indexing its
    admins: the next run reports them present and indexes them, so the first admin can then be deleted."""
    with app.app_context():
        first = users.create_user("first-admin@example.com", DEFAULT_PASSWORD, role="admin")
        users.create_user("helper@example.com", DEFAULT_PASSWORD, role="admin")
        users.set_role(users.find_user("helper@example.com")["id"], "user")  # builds the admins index
    assert rdb.sismember(Keys.admins(), "*") and rdb.sismember(Keys.admins(), first["id"])
    lines = []
    for email, claim in (("pending-admin@example.com", "pending"), ("committed-admin@example.com", "committed")):
        user_id = uuid.uuid4().hex
        rdb.set(Keys.user_by_email(email), (indexes.PENDING if claim == "pending" else "") + user_id)
        rdb.hset(Keys.user(user_id), mapping={"id": user_id, "email": email, "role": "admin", "created_at": "1"})
        rdb.zadd(Keys.users(), {user_id: 1})
        lines.append({"email": email, "password_hash": None, "role": "admin"})
    lines.append({"email": "new-admin@example.com", "password_hash": None, "role": "admin"})
    done = cli("users", "import", write_lines(tmp_path / "users.jsonl", lines))
    assert done.stdout.splitlines()[-1] == "imported 1 users (1 no password), 2 already present, 0 refused"
    indexed = rdb.smembers(Keys.admins()) - {"*", first["id"]}
    expected = {rdb.get(Keys.user_by_email(line["email"])) for line in lines}
    assert indexed == expected
    with app.app_context():  # two admins remain after these, so neither is refused as the last one
        assert users.delete_user(first["id"])
        assert users.delete_user(rdb.get(Keys.user_by_email("new-admin@example.com")))
