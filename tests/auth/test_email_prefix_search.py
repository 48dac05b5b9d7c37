"""Finding users by the start of their e-mail address: one lex-ordered index that survives crashes between
the steps of a creation or deletion, never holds external users, and is filled for users from before it."""

from __future__ import annotations

import uuid

import pytest

from app.auth import indexes, users
from app.redis import Keys
from tests.utils import DEFAULT_PASSWORD


def create(app, *emails: str) -> list[dict]:
    with app.app_context():
        return [users.create_user(email, DEFAULT_PASSWORD) for email in emails]


def search(app, prefix: str, limit: int = 50) -> list[str]:
    with app.app_context():
        return [user["email"] for user in users.find_users_by_email_prefix(prefix, limit)]


def test_a_prefix_finds_addresses_starting_with_it_in_any_case_in_ascending_order(app):
    assert search(app, "bob") == []  # the index is built (empty): creations add themselves from here on
    create(app, "Bob.b@example.com", "bob@example.org", "bobby@example.com", "alice@example.com", "rob@bob.example")
    assert search(app, "BOB") == ["bob.b@example.com", "bob@example.org", "bobby@example.com"]
    assert search(app, "bob@") == ["bob@example.org"]
    assert search(app, "bob", limit=2) == ["bob.b@example.com", "bob@example.org"]
    assert search(app, "") == [
        "alice@example.com",
        "bob.b@example.com",
        "bob@example.org",
        "bobby@example.com",
        "rob@bob.example",
    ]
    assert search(app, "carol") == [] and search(app, "bob\x00") == [] and search(app, "bob", limit=0) == []
    with app.app_context():
        found = users.find_users_by_email_prefix("alice")
        assert found == [users.get_user(found[0]["id"])]  # the records as stored


def test_a_deleted_user_is_no_longer_found_and_leaves_no_member(app, rdb):
    kept, deleted = create(app, "dora@example.com", "dorian@example.com")
    with app.app_context():
        assert users.delete_user(deleted["id"])
    assert rdb.zrange(indexes.EMAIL_ORDER, 0, -1) == [indexes.email_order_member(kept["email"], kept["id"])]
    assert search(app, "dor") == ["dora@example.com"]


def test_external_users_are_never_in_the_index(app, rdb):
    create(app, "erin@example.com")
    with app.app_context():
        external = users.find_or_create_external_user("corp", "subject-1", "erin.external@example.com")
    assert users.is_external(external)
    assert search(app, "erin") == ["erin@example.com"]
    rdb.delete(indexes.EMAIL_ORDER, indexes.EMAIL_ORDER_BUILT)  # filling it again skips them too
    assert search(app, "erin") == ["erin@example.com"]
    assert rdb.zcard(indexes.EMAIL_ORDER) == 1


def test_a_member_left_by_a_crashed_step_is_skipped_and_removed(app, rdb):
    """A creation that died after adding its member (its claim released or taken over), a deletion that died
    after deleting the record (its committed claim still there): skipped, removed, and the limit still filled."""
    live = create(app, "fay@example.com", "fay.z@example.com")
    crashed_creation = indexes.email_order_member("fay.a@example.com", uuid.uuid4().hex)
    gone_id = uuid.uuid4().hex
    crashed_deletion = indexes.email_order_member("fay.b@example.com", gone_id)
    rdb.set(Keys.user_by_email("fay.b@example.com"), gone_id)
    rdb.zadd(indexes.EMAIL_ORDER, {crashed_creation: 0, crashed_deletion: 0})
    assert search(app, "fay", limit=2) == ["fay.z@example.com", "fay@example.com"]
    expected = sorted(indexes.email_order_member(user["email"], user["id"]) for user in live)
    assert rdb.zrange(indexes.EMAIL_ORDER, 0, -1) == expected


def test_a_member_whose_creation_may_still_finish_is_skipped_but_kept(app, rdb):
    """Between adding its member and writing its record, a creation holds the address's pending claim: a search
    then must not remove the member, or the user, once written, would never be found."""
    user_id, email = uuid.uuid4().hex, "gil@example.com"
    with app.app_context():
        assert indexes.claim(Keys.user_by_email(email), user_id) is None
    member = indexes.email_order_member(email, user_id)
    rdb.zadd(indexes.EMAIL_ORDER, {member: 0})
    assert search(app, "gil") == []
    assert rdb.zscore(indexes.EMAIL_ORDER, member) == 0
    rdb.hset(Keys.user(user_id), mapping={"id": user_id, "email": email, "role": "user", "created_at": "1"})
    assert search(app, "gil") == [email]


def test_users_from_before_the_index_are_added_at_the_first_search(app, rdb):
    created = create(app, "hal@example.com", "hana@example.com")
    rdb.delete(indexes.EMAIL_ORDER, indexes.EMAIL_ORDER_BUILT)
    assert search(app, "ha") == ["hal@example.com", "hana@example.com"]
    assert rdb.get(indexes.EMAIL_ORDER_BUILT) == "1"
    assert rdb.zcard(indexes.EMAIL_ORDER) == len(created)


@pytest.mark.not_on_cluster("redis migrate-keys runs on the one Redis an old database was written to")
def test_migrate_keys_fills_the_index(app, cli, rdb):
    create(app, "ida@example.com")
    rdb.delete(indexes.EMAIL_ORDER, indexes.EMAIL_ORDER_BUILT)
    assert cli("redis", "migrate-keys").returncode == 0
    assert [indexes.split_email_order_member(m)[0] for m in rdb.zrange(indexes.EMAIL_ORDER, 0, -1)] == [
        "ida@example.com"
    ]
    assert rdb.get(indexes.EMAIL_ORDER_BUILT) == "1"
