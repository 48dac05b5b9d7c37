"""Administration of users over HTTP and the CLI: find, change a role, end sessions, reset MFA, delete; and
never the last administrator demoted or deleted."""

from __future__ import annotations

import threading
import time

import pytest

from app.auth.users import create_user, set_role
from app.redis import Keys
from tests.account.test_mfa import code_at, first_step, queued_mails
from tests.utils import DEFAULT_PASSWORD, bearer, random_email, redis_snapshot


@pytest.fixture
def admin(app, client, auth):
    email = random_email()
    with app.app_context():
        create_user(email, DEFAULT_PASSWORD, role="admin", email_verified=True)
    return {**auth.login_body(email), "email": email}


def test_only_admins_may_manage_users(client, auth):
    user = auth.new_user_tokens()
    for method, path in (("get", "/admin/users"), ("patch", f"/admin/users/{user['user']['id']}")):
        answer = getattr(client, method)(path, headers=bearer(user["access_token"]), json={"role": "admin"})
        assert answer.status_code == 403
    assert client.get("/admin/users").status_code == 401


def test_list_and_find_users(client, auth, admin):
    users = [auth.register() for _ in range(3)]
    listed = client.get("/admin/users", headers=bearer(admin["access_token"]))
    assert listed.status_code == 200 and listed.headers["Cache-Control"] == "no-store"
    emails = [u["email"] for u in listed.get_json()["users"]]
    assert emails[:3] == [u["email"] for u in reversed(users)]  # newest first
    first = listed.get_json()["users"][0]
    assert set(first) == {"id", "email", "role", "email_verified", "mfa_enabled", "created_at"}
    page = client.get("/admin/users?limit=2&offset=1", headers=bearer(admin["access_token"])).get_json()["users"]
    assert [u["email"] for u in page] == emails[1:3]
    found = client.get(f"/admin/users?email={users[1]['email'].upper()}", headers=bearer(admin["access_token"]))
    assert [u["id"] for u in found.get_json()["users"]] == [users[1]["id"]]
    none = client.get("/admin/users?email=nobody@example.com", headers=bearer(admin["access_token"]))
    assert none.get_json() == {"users": []}
    for bad in ("limit=0", "limit=1001", "limit=x", "offset=-1"):
        assert client.get(f"/admin/users?{bad}", headers=bearer(admin["access_token"])).status_code == 400


def test_a_role_change_applies_on_the_users_next_request(client, auth, admin):
    user = auth.new_user_tokens()
    headers = bearer(user["access_token"])
    assert client.get("/admin/users", headers=headers).status_code == 403
    promoted = client.patch(
        f"/admin/users/{user['user']['id']}", json={"role": "admin"}, headers=bearer(admin["access_token"])
    )
    assert promoted.status_code == 200 and promoted.get_json()["user"]["role"] == "admin"
    assert client.get("/admin/users", headers=headers).status_code == 200  # same token, next request
    client.patch(f"/admin/users/{user['user']['id']}", json={"role": "user"}, headers=bearer(admin["access_token"]))
    assert client.get("/admin/users", headers=headers).status_code == 403


def test_bad_role_changes_change_nothing(client, auth, admin, rdb):
    user = auth.register()
    path, headers = f"/admin/users/{user['id']}", bearer(admin["access_token"])
    before = redis_snapshot(rdb)
    assert client.patch(path, json={"role": "root"}, headers=headers).status_code == 422
    assert client.patch(path, json={"role": 1}, headers=headers).status_code == 400
    assert client.patch(path, json={}, headers=headers).status_code == 400
    assert client.patch("/admin/users/" + "0" * 32, json={"role": "admin"}, headers=headers).status_code == 404
    assert client.patch("/admin/users/not-an-id", json={"role": "admin"}, headers=headers).status_code == 404
    own = client.patch(f"/admin/users/{admin['user']['id']}", json={"role": "user"}, headers=headers)
    assert own.status_code == 403  # no locking oneself out by accident
    assert redis_snapshot(rdb) == before


def test_revoking_sessions_logs_the_user_out_everywhere(client, auth, admin):
    user = auth.new_user_tokens()
    again = auth.login_body(user["email"])
    answer = client.delete(f"/admin/users/{user['user']['id']}/sessions", headers=bearer(admin["access_token"]))
    assert answer.status_code == 204
    for tokens in (user, again):
        assert client.get("/auth/me", headers=bearer(tokens["access_token"])).status_code == 401
        assert client.post("/auth/refresh", json={"refresh_token": tokens["refresh_token"]}).status_code == 401
    assert auth.login(user["email"]).status_code == 200


def test_deleting_a_user_removes_every_record_and_ends_sessions(client, auth, admin, rdb):
    keep = auth.new_user_tokens()
    before = set(redis_snapshot(rdb))
    user = auth.new_user_tokens()
    client.post("/auth/refresh", json={"refresh_token": user["refresh_token"]})
    client.post(
        "/events",
        json={"channel": f"user:{user['user']['id']}", "event": "n", "data": 1},
        headers=bearer(user["access_token"]),
    )
    client.post("/auth/password/forgot", json={"email": user["email"]})
    answer = client.delete(f"/admin/users/{user['user']['id']}", headers=bearer(admin["access_token"]))
    assert answer.status_code == 204
    assert client.get("/auth/me", headers=bearer(user["access_token"])).status_code == 401
    assert auth.login(user["email"]).get_json()["error"]["code"] == "invalid_credentials"
    # Mail on its way, and the audit log (its entries outlive the users they are about), stay.
    left = {key for key in set(redis_snapshot(rdb)) - before if not key.startswith(("mail:", "audit:"))}
    assert not any(user["user"]["id"] in key or user["email"] in str(rdb.dump(key)) for key in left), left
    assert client.get("/auth/me", headers=bearer(keep["access_token"])).status_code == 200
    assert client.delete(f"/admin/users/{user['user']['id']}", headers=bearer(admin["access_token"])).status_code == 404
    assert (
        client.delete(f"/admin/users/{admin['user']['id']}", headers=bearer(admin["access_token"])).status_code == 403
    )


def test_the_cli_lists_changes_roles_revokes_and_deletes(cli, auth, client, admin):
    user = auth.new_user_tokens()
    listed = cli("users", "list")
    assert listed.returncode == 0 and user["email"] in listed.stdout and "unverified" in listed.stdout
    found = cli("users", "list", "--email", user["email"])
    assert found.stdout.count("\n") == 1

    assert cli("users", "set-role", user["email"], "admin").returncode == 0
    assert client.get("/admin/users", headers=bearer(user["access_token"])).status_code == 200
    assert cli("users", "set-role", "nobody@example.com", "admin").returncode != 0

    assert cli("users", "revoke-sessions", user["user"]["id"]).returncode == 0
    assert client.get("/auth/me", headers=bearer(user["access_token"])).status_code == 401

    deleted = cli("users", "delete", user["email"], "--yes")
    assert deleted.returncode == 0, deleted.stderr
    assert auth.login(user["email"]).status_code == 401
    missing = cli("users", "delete", user["email"], "--yes")
    assert missing.returncode != 0 and "no user" in missing.stderr and "Traceback" not in missing.stderr


def test_a_list_entry_whose_record_is_missing_is_not_listed(client, auth, admin, rdb):
    """What a creation that died between adding itself to the list and writing its record leaves."""
    user = auth.register()
    rdb.zadd(Keys.users(), {"0" * 32: time.time()})
    listed = client.get("/admin/users", headers=bearer(admin["access_token"])).get_json()["users"]
    assert [u["id"] for u in listed if u["id"] in (user["id"], "0" * 32)] == [user["id"]]
    assert len(listed) == 2  # the admin and the user


def test_an_admin_resets_a_users_mfa_and_the_owner_is_mailed(client, auth, admin, rdb, mfa_user):
    path = f"/admin/users/{mfa_user['user']['id']}/mfa/reset"
    other = auth.new_user_tokens()
    assert client.post(path, headers=bearer(other["access_token"])).status_code == 403
    assert client.post(path).status_code == 401
    assert (
        client.post("/admin/users/" + "0" * 32 + "/mfa/reset", headers=bearer(admin["access_token"])).status_code == 404
    )
    answer = client.post(path, headers=bearer(admin["access_token"]))
    assert answer.status_code == 204
    assert client.get("/auth/me", headers=bearer(mfa_user["access_token"])).status_code == 401  # every session ended
    assert client.post("/auth/refresh", json={"refresh_token": mfa_user["refresh_token"]}).status_code == 401
    assert not rdb.exists(Keys.user_recovery_codes(mfa_user["user"]["id"]))
    login = auth.login(mfa_user["email"])
    assert login.status_code == 200 and login.get_json()["user"]["mfa_enabled"] is False  # one step again
    assert len(queued_mails(rdb, "mfa_reset", mfa_user["user"]["id"])) == 1
    # Also when MFA is off: nothing to reset, still 204.
    assert client.post(path, headers=bearer(admin["access_token"])).status_code == 204


def test_the_cli_resets_mfa(cli, client, auth, rdb, mfa_user):
    token = first_step(client, mfa_user["email"])
    done = cli("users", "reset-mfa", mfa_user["email"])
    assert done.returncode == 0, done.stderr
    assert "two-factor authentication is off" in done.stdout
    assert client.get("/auth/me", headers=bearer(mfa_user["access_token"])).status_code == 401
    stale = client.post("/auth/login/mfa", json={"mfa_token": token, "code": code_at(mfa_user["secret"], +1)})
    assert stale.status_code == 400  # a login waiting for its code is gone too
    assert auth.login(mfa_user["email"]).status_code == 200
    missing = cli("users", "reset-mfa", "nobody@example.com")
    assert missing.returncode != 0 and "no user" in missing.stderr


def test_the_last_admin_can_be_neither_demoted_nor_deleted(cli, client, auth, admin, rdb):
    for command in (("set-role", admin["email"], "user"), ("delete", admin["email"], "--yes")):
        refused = cli("users", *command)
        assert refused.returncode != 0 and "last administrator" in refused.stderr, refused.stderr
        assert rdb.hget(Keys.user(admin["user"]["id"]), "role") == "admin"
    second = auth.new_user_tokens()
    assert cli("users", "set-role", second["email"], "admin").returncode == 0
    # With two, one may go; then the other is the last again, over HTTP too.
    demote = client.patch(
        f"/admin/users/{admin['user']['id']}", json={"role": "user"}, headers=bearer(second["access_token"])
    )
    assert demote.status_code == 200
    assert cli("users", "delete", second["email"], "--yes").returncode != 0
    promoted = client.patch(
        f"/admin/users/{admin['user']['id']}", json={"role": "admin"}, headers=bearer(second["access_token"])
    )
    assert promoted.status_code == 200
    assert (
        client.delete(f"/admin/users/{second['user']['id']}", headers=bearer(admin["access_token"])).status_code == 204
    )
    last = client.delete(f"/admin/users/{admin['user']['id']}", headers=bearer(admin["access_token"]))
    assert last.status_code == 403  # oneself: refused before the last-admin rule is asked


def demote_at_once(client, pairs: list[tuple[dict, dict]]) -> list[int]:
    """Each (actor, target) demotion sent from its own thread, all released together; their statuses."""
    start, answers = threading.Barrier(len(pairs)), []

    def demote(actor: dict, target: dict) -> None:
        start.wait(timeout=10)
        path = f"/admin/users/{target['user']['id']}"
        answers.append(client.patch(path, json={"role": "user"}, headers=bearer(actor["access_token"])).status_code)

    threads = [threading.Thread(target=demote, args=pair) for pair in pairs]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    return sorted(answers)


def test_two_admins_demoting_each_other_at_once_leave_one(app, client, auth, admin, rdb):
    other = auth.new_user_tokens()
    for _ in range(15):
        with app.app_context():
            set_role(other["user"]["id"], "admin")
            set_role(admin["user"]["id"], "admin")
        answers = demote_at_once(client, [(admin, other), (other, admin)])
        roles = [rdb.hget(Keys.user(u["user"]["id"]), "role") for u in (admin, other)]
        assert "admin" in roles, (answers, roles)
        assert answers in ([200, 403], [200, 409]), answers


def test_an_index_entry_whose_record_is_no_admin_does_not_count(cli, auth, admin, rdb):
    """What a promotion and a demotion of one user at the same moment can leave in the admins index: an id
    whose record says user. Counting it would let the last real administrator go."""
    bystander = auth.register()
    assert cli("users", "set-role", bystander["email"], "admin").returncode == 0
    assert cli("users", "set-role", bystander["email"], "user").returncode == 0
    assert rdb.sismember(Keys.admins(), admin["user"]["id"])  # the index is built and holds the admin
    rdb.sadd(Keys.admins(), bystander["id"])  # the race's leftover
    refused = cli("users", "set-role", admin["email"], "user")
    assert refused.returncode != 0 and "last administrator" in refused.stderr
    assert rdb.hget(Keys.user(admin["user"]["id"]), "role") == "admin"
    assert not rdb.sismember(Keys.admins(), bystander["id"])
