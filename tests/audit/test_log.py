"""The audit log itself: pages newest first, filters, who may read it, retention, the JSON line."""

from __future__ import annotations

import time
import uuid
from datetime import datetime

import pytest
import redis

from app import audit
from app.audit import store
from app.redis import Keys
from app.settings import SettingsError, load_settings
from tests.audit.conftest import CLIENT_ADDRESS
from tests.utils import bearer


def ids(entries: list[dict]) -> list[str]:
    return [entry["id"] for entry in entries]


@pytest.fixture
def recorded(app, admin):
    """Twelve entries about two users, by an admin, an API key and the CLI, of three types (oldest first)."""
    alice, bob, key_id, admin_id = (uuid.uuid4().hex for _ in range(4))
    by_admin, by_key = audit.user_actor(admin_id), {"kind": "api_key", "id": key_id}
    plan = [
        ("role.changed", alice, by_admin),
        ("mfa.reset", alice, by_admin),
        ("role.changed", bob, by_key),
        ("session.revoked", alice, audit.CLI),
    ] * 3
    entries = []
    with app.app_context():
        for entry_type, subject, actor in plan:
            entries.append(audit.record(entry_type, subject=subject, actor=actor, details={"n": len(entries)}))
    return {"entries": entries, "alice": alice, "bob": bob, "admin": admin_id, "key": key_id}


def test_pages_are_newest_first_and_next_is_the_before_of_the_following_page(client, admin, recorded):
    made = [entry.id for entry in reversed(recorded["entries"])]
    first = client.get("/admin/audit?limit=5&type=role.changed", headers=admin["headers"]).get_json()
    role_changes = [entry.id for entry in reversed(recorded["entries"]) if entry.type == "role.changed"]
    assert ids(first["entries"]) == role_changes[:5] and first["next"] == role_changes[4]
    second = client.get(f"/admin/audit?limit=5&type=role.changed&before={first['next']}", headers=admin["headers"])
    assert ids(second.get_json()["entries"]) == role_changes[5:] and second.get_json()["next"] is None
    # Unfiltered: every entry, the admin's own registration and login among the older ones.
    everything = client.get("/admin/audit?limit=12", headers=admin["headers"]).get_json()
    assert ids(everything["entries"]) == made and everything["next"] == made[-1]
    exact = client.get(f"/admin/audit?limit=12&subject={recorded['alice']}", headers=admin["headers"]).get_json()
    assert len(exact["entries"]) == 9 and exact["next"] is None  # nothing older matches: null, not a cursor
    last = client.get(f"/admin/audit?before={made[-1]}", headers=admin["headers"]).get_json()
    assert [entry["type"] for entry in last["entries"]] == ["login.succeeded", "user.registered"]
    assert last["next"] is None


def test_an_entry_has_the_shape_of_a(client, admin, recorded):
    (entry,) = client.get("/admin/audit?limit=1", headers=admin["headers"]).get_json()["entries"]
    newest = recorded["entries"][-1]
    assert entry == {
        "id": newest.id,
        "at": entry["at"],
        "type": "session.revoked",
        "actor": {"kind": "cli", "id": None},
        "subject": recorded["alice"],
        "details": {"n": 11},
    }
    at = datetime.fromisoformat(entry["at"])
    assert entry["at"].endswith("Z") and abs(at.timestamp() - time.time()) < 60
    assert int(entry["id"][:13]) == round(at.timestamp() * 1000)  # `at` is the id's milliseconds


@pytest.mark.parametrize(
    "filters, expected",
    [
        ({"subject": "alice"}, lambda e, r: e.subject == r["alice"]),
        ({"subject": "bob"}, lambda e, r: e.subject == r["bob"]),
        ({"type": "mfa.reset"}, lambda e, r: e.type == "mfa.reset"),
        ({"actor": "admin"}, lambda e, r: e.actor["id"] == r["admin"]),
        ({"actor": "key"}, lambda e, r: e.actor["id"] == r["key"]),
        ({"actor": "cli"}, lambda e, r: e.actor["kind"] == "cli"),
        (
            {"subject": "alice", "type": "role.changed"},
            lambda e, r: e.subject == r["alice"] and e.type == "role.changed",
        ),
        ({"subject": "alice", "actor": "cli"}, lambda e, r: e.subject == r["alice"] and e.actor["kind"] == "cli"),
        ({"type": "role.changed", "actor": "key"}, lambda e, r: e.type == "role.changed" and e.actor["id"] == r["key"]),
        ({"subject": "bob", "type": "mfa.reset"}, lambda e, r: False),
    ],
)
def test_filters_by_subject_type_and_actor_alone_or_together(audit_log, admin, recorded, filters, expected):
    query = {name: recorded.get(value, value) for name, value in filters.items()}
    wanted = [entry.id for entry in reversed(recorded["entries"]) if expected(entry, recorded)]
    if query == {"actor": "cli"}:  # the administrator's account was made outside a request too
        wanted += ids(audit_log(subject=admin["id"], type="user.registered"))
    assert ids(audit_log(**query)) == wanted
    assert ids(audit_log(limit=2, **query)) == wanted  # the same, two at a time


def test_a_filtered_page_that_reads_too_far_ends_early_with_a_cursor(app, client, admin, recorded, monkeypatch):
    monkeypatch.setattr(store, "SCAN_LIMIT", 4)
    monkeypatch.setattr(store, "FILTERED_CHUNK", 2)
    query = f"subject={recorded['alice']}&type=mfa.reset&limit=3"
    resets = [entry.id for entry in reversed(recorded["entries"]) if entry.type == "mfa.reset"]
    pages, before = [], None
    while before is not None or not pages:
        cursor = f"&before={before}" if before else ""
        page = client.get(f"/admin/audit?{query}{cursor}", headers=admin["headers"]).get_json()
        pages.append(ids(page["entries"]))
        before = page["next"]
    # Alice's nine entries, four read a page: one reset, two, then none among the oldest one.
    assert pages == [resets[:1], resets[1:], []]


@pytest.mark.parametrize(
    "query",
    [
        "limit=0",
        "limit=501",
        "limit=x",
        "limit=1.5",
        "before=123",
        "before=1712345678901-0",
        "before=x",
        "subject=not-a-user",
        "type=user.hacked",
        "actor=someone",
        "limit=1&limit=2",
    ],
)
def test_bad_paging_and_filters_are_400(client, admin, query):
    answer = client.get(f"/admin/audit?{query}", headers=admin["headers"])
    assert answer.status_code == 400 and answer.get_json()["error"]["code"] == "bad_request"
    mine = client.get(f"/auth/activity?{query}", headers=admin["headers"])
    assert mine.status_code == (400 if query.split("=")[0] in ("limit", "before") else 200)


def test_the_largest_page_is_500(client, admin):
    assert client.get("/admin/audit?limit=500", headers=admin["headers"]).status_code == 200
    assert client.get("/auth/activity?limit=500", headers=admin["headers"]).status_code == 200


def test_only_administrators_and_keys_with_audit_read_read_the_log(client, auth, admin, make_key):
    user = auth.new_user_tokens()
    assert client.get("/admin/audit").status_code == 401
    refused = client.get("/admin/audit", headers=bearer(user["access_token"]))
    assert refused.status_code == 403 and refused.get_json()["error"]["code"] == "forbidden"
    without_scope = make_key("tokens:introspect")
    assert client.get("/admin/audit", headers=without_scope["headers"]).status_code == 403
    reader = make_key("audit:read")
    assert reader["scopes"] == ["audit:read"]
    read = client.get(f"/admin/audit?actor={admin['id']}", headers=reader["headers"])
    assert read.status_code == 200
    assert {entry["type"] for entry in read.get_json()["entries"]} == {"login.succeeded", "api_key.created"}
    assert client.get("/admin/audit", headers=admin["headers"]).status_code == 200
    assert client.get("/auth/activity", headers=reader["headers"]).status_code == 403  # a user's own only


def test_activity_is_the_callers_own_entries_as_subject(app, client, auth, admin):
    user = auth.new_user_tokens()
    other = auth.new_user_tokens()
    with app.app_context():
        about_user = audit.record("mfa.reset", subject=user["user"]["id"], actor=audit.user_actor(admin["id"]))
        audit.record("mfa.reset", subject=other["user"]["id"], actor=audit.user_actor(admin["id"]))
    assert client.get("/auth/activity").status_code == 401
    mine = client.get("/auth/activity", headers=bearer(user["access_token"])).get_json()
    assert [entry["type"] for entry in mine["entries"]] == ["mfa.reset", "login.succeeded", "user.registered"]
    assert mine["entries"][0]["id"] == about_user.id and mine["next"] is None
    assert {entry["subject"] for entry in mine["entries"]} == {user["user"]["id"]}
    paged = client.get("/auth/activity?limit=1", headers=bearer(user["access_token"])).get_json()
    assert ids(paged["entries"]) == [about_user.id] and paged["next"] == about_user.id
    rest = client.get(f"/auth/activity?before={paged['next']}", headers=bearer(user["access_token"])).get_json()
    assert [entry["type"] for entry in rest["entries"]] == ["login.succeeded", "user.registered"]


def old_member(subject: str, days: float) -> str:
    """A stored entry recorded `days` ago, as an earlier run would have left it."""
    entry = audit.Entry(
        audit.entries.new_id(int((time.time() - days * 86400) * 1000)),
        "mfa.reset",
        dict(audit.CLI),
        subject,
        None,
        {},
    )
    return entry.member()


def test_entries_older_than_the_retention_are_never_read_and_trimmed_at_the_next_write(app, client, admin, rdb):
    subject = uuid.uuid4().hex
    expired, kept = old_member(subject, 91), old_member(subject, 89)
    expired_id, kept_id = expired.partition(" ")[0], kept.partition(" ")[0]
    stored = {  # as an earlier run would have left them: the type's and actor's indexes keep ids alone
        Keys.audit_log(): (expired, kept),
        Keys.audit_subject(subject): (expired, kept),
        Keys.audit_type("mfa.reset"): (expired_id, kept_id),
        Keys.audit_actor("cli"): (expired_id, kept_id),
    }
    for key, members in stored.items():
        rdb.zadd(key, dict.fromkeys(members, 0))
    for query in (f"subject={subject}", "type=mfa.reset", "actor=cli", ""):
        listed = client.get(f"/admin/audit?{query}", headers=admin["headers"]).get_json()["entries"]
        assert kept_id in ids(listed) and expired_id not in ids(listed), query  # stored, yet not read
    assert rdb.zscore(Keys.audit_subject(subject), expired) is not None
    with app.app_context():
        audit.record("mfa.reset", subject=subject, actor=audit.CLI)
    for key, (old, young) in stored.items():
        assert rdb.zscore(key, old) is None and rdb.zscore(key, young) is not None, key
        assert 89 * 86400 < rdb.ttl(key) <= 90 * 86400  # an index nobody writes goes with its last entry


def test_an_id_whose_entry_the_log_no_longer_holds_is_passed_over(app, client, admin, rdb):
    with app.app_context():
        kept, gone = (audit.record("mfa.reset", subject=uuid.uuid4().hex, actor=audit.CLI) for _ in range(2))
    rdb.zrem(Keys.audit_log(), gone.member())  # as when the log was trimmed a moment before its index
    listed = client.get("/admin/audit?type=mfa.reset&limit=1", headers=admin["headers"]).get_json()
    assert ids(listed["entries"]) == [kept.id] and listed["next"] is None
    assert rdb.zscore(Keys.audit_type("mfa.reset"), gone.id) is not None


def test_the_retention_is_a_setting(make_app, rdb):
    app = make_app(AUDIT_RETENTION_DAYS="0.00001")  # 864 ms
    subject = uuid.uuid4().hex
    with app.app_context():
        before = audit.record("mfa.reset", subject=subject, actor=audit.CLI, at_ms=int(time.time() * 1000) - 2000)
        audit.record("mfa.reset", subject=subject, actor=audit.CLI)
        assert before.id not in ids(store.read(subject=subject)[0])
    assert rdb.zscore(Keys.audit_subject(subject), before.member()) is None
    assert 0 < rdb.pttl(Keys.audit_subject(subject)) <= 864


@pytest.mark.parametrize("value", ["0", "-1", "x", "4000"])
def test_a_bad_retention_stops_start_up_naming_the_variable(tmp_path, value):
    with pytest.raises(SettingsError, match="AUDIT_RETENTION_DAYS"):
        load_settings({"APP_ENV": "test", "DATA_DIR": str(tmp_path), "AUDIT_RETENTION_DAYS": value})
    assert load_settings({"APP_ENV": "test", "DATA_DIR": str(tmp_path)}).audit_retention_days == 90


def test_each_entry_is_also_one_json_log_line(client, auth, admin, audit_lines):
    user = auth.register()
    (line,) = audit_lines()
    (entry,) = client.get("/admin/audit?type=user.registered&limit=1", headers=admin["headers"]).get_json()["entries"]
    assert entry["subject"] == user["id"]
    assert line == {"ts": line["ts"], "level": "info", "logger": "audit", "msg": "user.registered", **entry}


def test_an_entry_outlives_its_subject(client, auth, admin, audit_log):
    user = auth.new_user_tokens()
    deleted = client.delete(f"/admin/users/{user['user']['id']}", headers=admin["headers"])
    assert deleted.status_code == 204
    kept = audit_log(subject=user["user"]["id"])
    assert [entry["type"] for entry in kept] == ["user.deleted", "login.succeeded", "user.registered"]
    assert user["email"] not in str(kept)  # users are named by id, never by e-mail


def test_a_change_made_in_one_step_keeps_its_entry_when_the_next_step_fails(client, auth, rdb, monkeypatch, caplog):
    tokens = auth.new_user_tokens()
    uid = tokens["user"]["id"]

    class Unreachable:
        def pipeline(self, **_):
            raise redis.exceptions.ConnectionError("the log's node went away")

    monkeypatch.setattr(store, "get_redis", lambda: Unreachable())  # the second step only
    change = {"current_password": "correct horse battery", "new_password": "a new and longer password"}
    answer = client.post("/auth/password", json=change, headers=bearer(tokens["access_token"]))
    assert answer.status_code == 204  # the change is made: the client is not told otherwise
    (member,) = [m for m in rdb.zrange(Keys.audit_subject(uid), 0, -1) if '"password.changed"' in m]
    entry_id = member.partition(" ")[0]
    assert not [m for m in rdb.zrange(Keys.audit_log(), 0, -1) if m.startswith(entry_id)]
    assert f"audit entry {entry_id} (password.changed) not stored" in caplog.text


def test_a_users_activity_hides_who_else_acted_and_from_where(client, auth, admin):
    """The admin's id and address, and the address of someone guessing the password, are the admin's log's to show,
    not the user's: the user sees their kinds only. The admin's log keeps them."""
    user = auth.new_user_tokens()
    uid = user["user"]["id"]
    assert client.patch(f"/admin/users/{uid}", json={"role": "admin"}, headers=admin["headers"]).status_code == 200
    assert auth.login(user["user"]["email"], "a wrong password").status_code == 401
    tokens = auth.login_body(user["user"]["email"])
    mine = client.get("/auth/activity", headers=bearer(tokens["access_token"])).get_json()["entries"]
    by_type = {entry["type"]: entry for entry in mine}
    assert by_type["role.changed"]["actor"] == {"kind": "user", "id": None}
    assert by_type["login.failed"]["actor"] == {"kind": "system", "id": None}
    assert "ip" not in by_type["role.changed"] and "ip" not in by_type["login.failed"]
    own = by_type["login.succeeded"]
    assert own["actor"] == {"kind": "user", "id": uid} and own["ip"] == CLIENT_ADDRESS
    logged = client.get(f"/admin/audit?subject={uid}", headers=admin["headers"]).get_json()["entries"]
    as_logged = {entry["type"]: entry for entry in logged}
    assert as_logged["role.changed"]["actor"] == {"kind": "user", "id": admin["id"]}
    assert as_logged["role.changed"]["ip"] == as_logged["login.failed"]["ip"] == CLIENT_ADDRESS
