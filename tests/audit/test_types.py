"""Every type of entry, recorded once where its change happens, with its actor, subject and address."""

from __future__ import annotations

from app.auth import mailtokens
from app.redis import Keys
from tests.account.test_mfa import code_at, first_step, second_step, set_up_mfa, settle
from tests.audit.conftest import CLIENT_ADDRESS
from tests.auth.test_passkeys import add_passkey, authenticator, passkey_login
from tests.utils import DEFAULT_PASSWORD, bearer, random_email

NEW_PASSWORD = "a new and longer password"


def by(user_id: str) -> dict:
    return {"kind": "user", "id": user_id}


SYSTEM = {"kind": "system", "id": None}
CLI = {"kind": "cli", "id": None}


def check(entries: list[dict], *expected: tuple) -> None:
    """`entries` are exactly the expected ones, in order: (type, actor, subject, details ⊇), with the client's
    address when a request made or attempted the change (a failed login, a reused refresh token included), and
    none when the CLI did."""
    assert [entry["type"] for entry in entries] == [wanted[0] for wanted in expected], entries
    for entry, (_, actor, subject, details) in zip(entries, expected, strict=True):
        assert entry["actor"] == actor, entry
        assert entry.get("subject") == subject, entry
        assert details.items() <= entry["details"].items(), entry
        if actor["kind"] == "cli":
            assert "ip" not in entry, entry
        else:
            assert entry["ip"] == CLIENT_ADDRESS, entry


def test_registration_logins_failures_refresh_and_logouts(client, auth, recorder):
    user = auth.register()
    uid = user["id"]
    first = auth.login_body(user["email"], device="laptop")
    assert auth.login(user["email"], "wrong password").status_code == 401
    assert auth.login(random_email(), "wrong password").status_code == 401  # no such account: no subject
    second = auth.login_body(user["email"], device="phone")
    assert client.post("/auth/refresh", json={"refresh_token": first["refresh_token"]}).status_code == 200
    check(
        recorder.new(),
        ("user.registered", by(uid), uid, {"method": "password", "role": "user"}),
        (
            "login.succeeded",
            by(uid),
            uid,
            {"method": "password", "session_id": first["session_id"], "device": "laptop"},
        ),
        ("login.failed", SYSTEM, uid, {"method": "password"}),
        ("login.failed", SYSTEM, None, {"method": "password"}),
        ("login.succeeded", by(uid), uid, {"method": "password", "session_id": second["session_id"]}),
    )
    # The first session's old refresh token again: reuse, and that session ends.
    reused = client.post("/auth/refresh", json={"refresh_token": first["refresh_token"]})
    assert reused.get_json()["error"]["code"] == "refresh_token_reused"
    assert client.post("/auth/refresh", json={"refresh_token": first["refresh_token"]}).status_code == 401
    check(recorder.new(), ("refresh.reuse_detected", SYSTEM, uid, {"session_id": first["session_id"]}))
    third = auth.login_body(user["email"])
    recorder.new()
    ended = client.delete(f"/auth/sessions/{third['session_id']}", headers=bearer(second["access_token"]))
    assert ended.status_code == 204
    assert client.post("/auth/logout", headers=bearer(second["access_token"])).status_code == 204
    assert client.post("/auth/logout", headers=bearer(second["access_token"])).status_code == 401  # gone: no entry
    check(
        recorder.new(),
        ("session.revoked", by(uid), uid, {"session_id": third["session_id"]}),
        ("logout", by(uid), uid, {"session_id": second["session_id"]}),
    )
    fourth, fifth = auth.login_body(user["email"]), auth.login_body(user["email"])
    recorder.new()
    by_refresh_token = client.post("/auth/logout", json={"refresh_token": fourth["refresh_token"]})
    assert by_refresh_token.status_code == 204
    itself = client.delete(f"/auth/sessions/{fifth['session_id']}", headers=bearer(fifth["access_token"]))
    assert itself.status_code == 204
    sixth = auth.login_body(user["email"])
    assert client.post("/auth/logout-all", headers=bearer(sixth["access_token"])).status_code == 204
    check(
        recorder.new(),
        ("logout", by(uid), uid, {"session_id": fourth["session_id"]}),
        ("logout", by(uid), uid, {"session_id": fifth["session_id"]}),
        ("login.succeeded", by(uid), uid, {"session_id": sixth["session_id"]}),
        ("logout", by(uid), uid, {"all_sessions": True}),
    )


def test_password_change_reset_and_email_verification(app, client, auth, recorder):
    tokens = auth.new_user_tokens()
    uid = tokens["user"]["id"]
    recorder.new()
    change = {"current_password": DEFAULT_PASSWORD, "new_password": NEW_PASSWORD}
    wrong = client.post(
        "/auth/password", json={**change, "current_password": "not it at all"}, headers=bearer(tokens["access_token"])
    )
    assert wrong.status_code == 401  # refused: nothing changed, nothing recorded
    assert client.post("/auth/password", json=change, headers=bearer(tokens["access_token"])).status_code == 204
    with app.app_context():
        verify = mailtokens.issue_token(uid, tokens["email"], mailtokens.VERIFY)
        reset = mailtokens.issue_token(uid, tokens["email"], mailtokens.RESET)
    assert client.post("/auth/email/verify", json={"token": verify}).status_code == 204
    assert client.post("/auth/email/verify", json={"token": verify}).status_code == 400  # used: no entry
    body = {"token": reset, "new_password": DEFAULT_PASSWORD}
    assert client.post("/auth/password/reset", json=body).status_code == 204
    assert client.post("/auth/password/reset", json=body).status_code == 400
    check(
        recorder.new(),
        ("password.changed", by(uid), uid, {}),
        ("email.verified", by(uid), uid, {"method": "mail"}),
        ("password.reset", by(uid), uid, {"method": "mail"}),
    )


def test_mfa_enabled_used_failed_disabled_and_reset(client, auth, admin, recorder):
    settle()
    tokens = auth.new_user_tokens()
    uid = tokens["user"]["id"]
    secret, codes = set_up_mfa(client, tokens["access_token"])
    wrong = second_step(client, first_step(client, tokens["email"]), code="000000")
    assert wrong.get_json()["error"]["code"] == "invalid_mfa_code"
    done = second_step(client, first_step(client, tokens["email"]), recovery_code=codes[0])
    assert done.status_code == 200
    off = {"password": DEFAULT_PASSWORD, "code": code_at(secret, 1)}
    assert client.delete("/auth/mfa/totp", json=off, headers=bearer(done.get_json()["access_token"])).status_code == 204
    reset = client.post(f"/admin/users/{uid}/mfa/reset", headers=admin["headers"])
    assert reset.status_code == 204
    check(
        recorder.new(),
        ("user.registered", by(uid), uid, {}),
        ("login.succeeded", by(uid), uid, {"method": "password"}),
        ("mfa.enabled", by(uid), uid, {"method": "totp"}),
        ("login.failed", SYSTEM, uid, {"method": "password", "second_factor": "totp"}),
        (
            "login.succeeded",
            by(uid),
            uid,
            {"method": "password", "second_factor": "recovery_code", "session_id": done.get_json()["session_id"]},
        ),
        ("mfa.disabled", by(uid), uid, {"factor": "totp"}),
        ("mfa.reset", by(admin["id"]), uid, {"was_enabled": False}),
    )


def test_passkeys_added_used_refused_and_removed(client, auth, recorder):
    tokens = auth.new_user_tokens()
    uid = tokens["user"]["id"]
    device = authenticator()
    added = add_passkey(client, tokens["access_token"], device, name="Phone")
    assert added.status_code == 201
    passkey_id = added.get_json()["id"]
    assert passkey_login(client, device).status_code == 200
    stale = passkey_login(client, device, counter=0)  # it counted before: 0 now is a clone's
    assert stale.status_code == 401
    removed = client.delete(f"/auth/passkeys/{passkey_id}", headers=bearer(tokens["access_token"]))
    assert removed.status_code == 204
    assert client.delete(f"/auth/passkeys/{passkey_id}", headers=bearer(tokens["access_token"])).status_code == 404
    check(
        recorder.new(),
        ("user.registered", by(uid), uid, {}),
        ("login.succeeded", by(uid), uid, {"method": "password"}),
        ("passkey.added", by(uid), uid, {"passkey_id": passkey_id, "name": "Phone"}),
        ("login.succeeded", by(uid), uid, {"method": "passkey"}),
        ("login.failed", SYSTEM, uid, {"method": "passkey"}),
        ("passkey.removed", by(uid), uid, {"passkey_id": passkey_id}),
    )


def test_an_administrators_changes_name_the_administrator(client, auth, admin, recorder):
    user = auth.new_user_tokens()
    uid, aid = user["user"]["id"], admin["id"]
    path = f"/admin/users/{uid}"
    assert client.patch(path, json={"role": "admin"}, headers=admin["headers"]).status_code == 200
    assert client.patch(path, json={"role": "admin"}, headers=admin["headers"]).status_code == 200  # no change
    assert client.patch(path, json={"role": "user"}, headers=admin["headers"]).status_code == 200
    assert client.delete(f"{path}/sessions", headers=admin["headers"]).status_code == 204
    assert client.delete(path, headers=admin["headers"]).status_code == 204
    key = client.post("/admin/api-keys", json={"name": "billing", "scopes": ["audit:read"]}, headers=admin["headers"])
    key_id = key.get_json()["id"]
    assert client.delete(f"/admin/api-keys/{key_id}", headers=admin["headers"]).status_code == 204
    check(
        recorder.new(),
        ("user.registered", by(uid), uid, {}),
        ("login.succeeded", by(uid), uid, {}),
        ("role.changed", by(aid), uid, {"role": "admin", "previous_role": "user"}),
        ("role.changed", by(aid), uid, {"role": "user", "previous_role": "admin"}),
        ("session.revoked", by(aid), uid, {"all_sessions": True}),
        ("user.deleted", by(aid), uid, {"role": "user"}),
        ("api_key.created", by(aid), None, {"api_key_id": key_id, "name": "billing", "scopes": ["audit:read"]}),
        ("api_key.deleted", by(aid), None, {"api_key_id": key_id, "name": "billing"}),
    )


def test_an_api_keys_changes_name_the_key(client, auth, make_key, recorder):
    user = auth.register()
    key = make_key("webhooks:manage", "channels:manage")
    kid, headers = key["id"], key["headers"]
    recorder.new()
    body = {"url": "http://127.0.0.1:9/hook", "channels": ["orders"]}
    endpoint = client.post("/admin/webhook-endpoints", json=body, headers=headers)
    assert endpoint.status_code == 201, endpoint.get_json()
    eid = endpoint.get_json()["id"]
    changed = client.patch(
        f"/admin/webhook-endpoints/{eid}", json={"disabled": True, "url": body["url"]}, headers=headers
    )
    assert changed.status_code == 200
    assert client.post(f"/admin/webhook-endpoints/{eid}/rotate-secret", headers=headers).status_code == 200
    assert client.delete(f"/admin/webhook-endpoints/{eid}", headers=headers).status_code == 204
    rules = {"subscribe": "members", "publish": "server", "presence": False, "join_leave": False}
    assert client.put("/admin/namespaces/rooms", json=rules, headers=headers).status_code == 200
    assert client.put("/admin/namespaces/rooms", json={**rules, "presence": True}, headers=headers).status_code == 200
    member = f"/channels/rooms:one/members/{user['id']}"
    assert client.put(member, json={"expires_in": 60}, headers=headers).status_code == 204
    assert client.delete(member, headers=headers).status_code == 204
    assert client.delete(member, headers=headers).status_code == 204  # no grant left: nothing changed
    assert client.delete("/admin/namespaces/rooms", headers=headers).status_code == 204
    actor = {"kind": "api_key", "id": kid}
    check(
        recorder.new(),
        ("webhook_endpoint.created", actor, None, {"endpoint_id": eid, "channels": ["orders"]}),
        ("webhook_endpoint.updated", actor, None, {"endpoint_id": eid, "changed": ["disabled", "url"]}),
        ("webhook_endpoint.updated", actor, None, {"endpoint_id": eid, "changed": ["secret"]}),
        ("webhook_endpoint.deleted", actor, None, {"endpoint_id": eid}),
        ("namespace.put", actor, None, {"namespace": "rooms", "created": True, "presence": False}),
        ("namespace.put", actor, None, {"namespace": "rooms", "created": False, "presence": True}),
        ("channel.member_added", actor, user["id"], {"channel": "rooms:one", "expires_in": 60}),
        ("channel.member_removed", actor, user["id"], {"channel": "rooms:one"}),
        ("namespace.deleted", actor, None, {"namespace": "rooms"}),
    )


def test_the_command_lines_changes_name_the_cli(cli, client, auth, recorder, rdb):
    email = random_email()

    def run(*args: str) -> str:
        done = cli(*args)
        assert done.returncode == 0, done.stderr
        return done.stdout

    run("users", "create", "--email", email, "--password", DEFAULT_PASSWORD)
    uid = rdb.get(Keys.user_by_email(email))
    auth.login_body(email)
    run("users", "set-role", email, "admin")
    run("users", "revoke-sessions", email)
    run("users", "reset-mfa", email)
    run("api-keys", "create", "--name", "ops", "--scope", "audit:read")
    run("channels", "namespace-put", "ops")
    run("channels", "grant", "ops:desk", email)
    run("channels", "revoke", "ops:desk", email)
    run("channels", "namespace-delete", "ops")
    run("users", "set-role", email, "user")
    run("users", "delete", email, "--yes")
    entries = recorder.new()
    created = next(entry for entry in entries if entry["type"] == "api_key.created")
    key_id = created["details"]["api_key_id"]
    run("api-keys", "delete", key_id)
    check(
        entries + recorder.new(),
        ("user.registered", CLI, uid, {"method": "password"}),
        ("login.succeeded", by(uid), uid, {}),
        ("role.changed", CLI, uid, {"role": "admin"}),
        ("session.revoked", CLI, uid, {"all_sessions": True}),
        ("mfa.reset", CLI, uid, {}),
        ("api_key.created", CLI, None, {"name": "ops"}),
        ("namespace.put", CLI, None, {"namespace": "ops", "created": True}),
        ("channel.member_added", CLI, uid, {"channel": "ops:desk"}),
        ("channel.member_removed", CLI, uid, {"channel": "ops:desk"}),
        ("namespace.deleted", CLI, None, {"namespace": "ops"}),
        ("role.changed", CLI, uid, {"role": "user", "previous_role": "admin"}),
        ("user.deleted", CLI, uid, {}),
        ("api_key.deleted", CLI, None, {"api_key_id": key_id}),
    )


def test_a_refused_passkey_of_no_account_names_no_subject(client, auth, recorder):
    tokens = auth.new_user_tokens()
    stranger = authenticator()
    options = client.post("/auth/passkeys/register/options", headers=bearer(tokens["access_token"]))
    stranger.create(options.get_json()["options"])  # made, never registered
    recorder.new()
    assert passkey_login(client, stranger).status_code == 401
    check(recorder.new(), ("login.failed", SYSTEM, None, {"method": "passkey"}))
