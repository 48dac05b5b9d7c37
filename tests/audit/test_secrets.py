"""No entry and no log line ever holds a secret: every secret a long session of changes used is searched for."""

from __future__ import annotations

import hashlib
import json
import logging

from app.auth import mailtokens
from app.redis import Keys
from tests.account.test_mfa import code_at, second_step, set_up_mfa, settle
from tests.auth.test_passkeys import add_passkey, authenticator, passkey_login
from tests.utils import DEFAULT_PASSWORD, bearer

NEW_PASSWORD = "an entirely new passphrase"
RESET_PASSWORD = "the one after the reset"


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def found_in(text: str, secrets: dict[str, str]) -> list[str]:
    """The names of the secrets that occur in `text` (six-digit codes only as a whole JSON string)."""
    return [name for name, value in secrets.items() if (f'"{value}"' if value.isdigit() else value) in text]


def test_no_secret_is_in_any_entry_or_log_line(app, client, auth, admin, make_key, rdb, audit_lines, caplog):
    caplog.set_level(logging.DEBUG)
    access = logging.getLogger("access")  # the request log does not propagate: listen to it too
    access.addHandler(caplog.handler)
    secrets: dict[str, str] = {"the admin's password": DEFAULT_PASSWORD}
    try:
        secrets.update(_a_long_session(app, client, auth, admin, make_key, rdb))
    finally:
        access.removeHandler(caplog.handler)
    secrets.update({f"{name} (SHA-256)": sha256(value) for name, value in list(secrets.items())})
    for name, value in list(secrets.items()):
        assert len(value) >= 6, name

    stored = "\n".join(member for key in rdb.scan_iter(match="audit*", count=1000) for member in rdb.zrange(key, 0, -1))
    answered = client.get("/admin/audit?limit=500", headers=admin["headers"]).get_data(as_text=True)
    lines = "\n".join(map(json.dumps, audit_lines()))
    logged = caplog.text
    assert stored.count("\n") > 60 and answered.count('"type"') > 20 and lines.count('"type"') > 20
    for where, text in (("Redis", stored), ("GET /admin/audit", answered), ("audit lines", lines), ("logs", logged)):
        assert found_in(text, secrets) == [], where
    # The search finds what it looks for: the secrets were real, and each form of them is searched.
    planted = stored + secrets["an API key"] + '"' + secrets["a TOTP code"] + '"'
    assert set(found_in(planted, secrets)) == {"an API key", "a TOTP code"}


def _a_long_session(app, client, auth, admin, make_key, rdb) -> dict[str, str]:
    """Registration, logins (password, MFA, passkey), refreshes, every account change and every admin and API
    key change, with wrong attempts between; every secret it handled, by name."""
    settle()
    used: dict[str, str] = {}
    user = auth.register()
    uid = user["id"]
    tokens = auth.login_body(user["email"])
    used |= {"an access token": tokens["access_token"], "a refresh token": tokens["refresh_token"]}
    used["a device token"] = tokens["device_token"]  # the known-device credential of the body transport
    refreshed = client.post("/auth/refresh", json={"refresh_token": tokens["refresh_token"]}).get_json()
    used |= {"a refreshed access token": refreshed["access_token"], "its refresh token": refreshed["refresh_token"]}
    client.post("/auth/refresh", json={"refresh_token": tokens["refresh_token"]})  # reuse
    auth.login(user["email"], "a wrong guess at it")
    used["a wrong password"] = "a wrong guess at it"
    tokens = auth.login_body(user["email"])
    headers = bearer(tokens["access_token"])
    change = {"current_password": DEFAULT_PASSWORD, "new_password": NEW_PASSWORD}
    assert client.post("/auth/password", json=change, headers=headers).status_code == 204
    used["the new password"] = NEW_PASSWORD

    secret, codes = set_up_mfa(client, tokens["access_token"])
    used |= {"the TOTP secret": secret, "a recovery code": codes[0], "another recovery code": codes[1]}
    mfa_token = client.post("/auth/login", json={"email": user["email"], "password": NEW_PASSWORD}).get_json()
    used["an mfa_token"] = mfa_token["mfa_token"]
    wrong = code_at(secret, 5)
    second_step(client, mfa_token["mfa_token"], code=wrong)
    used["a wrong TOTP code"] = wrong
    code = code_at(secret, 1)
    done = second_step(client, mfa_token["mfa_token"], code=code).get_json()
    used |= {"a TOTP code": code, "an MFA login's refresh token": done["refresh_token"]}
    second_step(client, first_step_with(client, user["email"]), recovery_code=codes[0])
    off = {"password": NEW_PASSWORD, "recovery_code": codes[1]}
    assert client.delete("/auth/mfa/totp", json=off, headers=bearer(done["access_token"])).status_code == 204

    device = authenticator()
    assert add_passkey(client, done["access_token"], device).status_code == 201
    used["a passkey login's refresh token"] = passkey_login(client, device).get_json()["refresh_token"]

    with app.app_context():
        verify = mailtokens.issue_token(uid, user["email"], mailtokens.VERIFY)
        reset = mailtokens.issue_token(uid, user["email"], mailtokens.RESET)
    used |= {"a verification token": verify, "a reset token": reset, "the password after the reset": RESET_PASSWORD}
    assert client.post("/auth/email/verify", json={"token": verify}).status_code == 204
    assert client.post("/auth/password/reset", json={"token": reset, "new_password": RESET_PASSWORD}).status_code == 204
    used["a stored password hash"] = rdb.hget(Keys.user(uid), "password_hash")

    key = make_key("webhooks:manage", "channels:manage", "audit:read")
    used["an API key"] = key["key"]
    endpoint = client.post(
        "/admin/webhook-endpoints",
        json={"url": "http://127.0.0.1:9/hook?token=a-credential-in-the-url", "channels": ["orders"]},
        headers=key["headers"],
    ).get_json()
    used |= {"a webhook secret": endpoint["secret"], "a credential in an endpoint URL": "a-credential-in-the-url"}
    rotated = client.post(f"/admin/webhook-endpoints/{endpoint['id']}/rotate-secret", headers=key["headers"])
    used["a rotated webhook secret"] = rotated.get_json()["secret"]
    client.put("/admin/namespaces/vault", json={"subscribe": "members", "publish": "server"}, headers=key["headers"])
    grant = {"info": {"note": "an application's own secret-ish note"}}
    client.put(f"/channels/vault:one/members/{uid}", json=grant, headers=key["headers"])
    used["a grant's info"] = "an application's own secret-ish note"
    client.delete(f"/admin/webhook-endpoints/{endpoint['id']}", headers=key["headers"])
    client.post(f"/admin/users/{uid}/mfa/reset", headers=admin["headers"])
    client.delete(f"/admin/api-keys/{key['id']}", headers=admin["headers"])
    client.delete(f"/admin/users/{uid}", headers=admin["headers"])
    used["the user's e-mail address"] = user["email"]  # not a secret, but entries name users by id only
    return used


def first_step_with(client, email: str) -> str:
    """The mfa_token of a password login (with the password after the change)."""
    answer = client.post("/auth/login", json={"email": email, "password": NEW_PASSWORD, "transport": "body"})
    assert answer.get_json()["error"]["code"] == "mfa_required"
    return answer.get_json()["mfa_token"]
