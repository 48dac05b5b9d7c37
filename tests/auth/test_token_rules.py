"""The core token rules, each as its own test: refresh-token states (rotation, reuse, logout-all),
access-token validity (signature, tokenVersion, session record) and the errors they answer.
docs/security.md explains each rule."""

from __future__ import annotations

import base64
import json

from app.auth.sessions import hash_token
from app.redis import Keys
from tests.utils import bearer


def refresh(client, token):
    return client.post("/auth/refresh", json={"refresh_token": token})


def revoked(rdb, raw: str) -> bool:
    return rdb.hget(Keys.refresh_token(raw.split(".")[0], hash_token(raw)), "revoked_at") not in ("", None)


# Table 3.1: refresh token


def test_refresh_rule_active_token_refresh_revokes_it_and_issues_same_family_pair(client, auth, rdb):
    tokens = auth.new_user_tokens()
    response = refresh(client, tokens["refresh_token"])
    assert response.status_code == 200
    rotated = response.get_json()
    assert rotated["refresh_token"] != tokens["refresh_token"]
    assert rotated["access_token"] != tokens["access_token"]
    assert rotated["session_id"] == tokens["session_id"]
    assert revoked(rdb, tokens["refresh_token"])
    assert not revoked(rdb, rotated["refresh_token"])
    user_id = tokens["user"]["id"]
    new_record = rdb.hgetall(Keys.refresh_token(user_id, hash_token(rotated["refresh_token"])))
    old_record = rdb.hgetall(Keys.refresh_token(user_id, hash_token(tokens["refresh_token"])))
    assert new_record["family_id"] == old_record["family_id"] == tokens["session_id"]
    assert client.get("/auth/me", headers=bearer(rotated["access_token"])).status_code == 200


def test_refresh_rule_revoked_token_refresh_is_401_and_revokes_whole_family(client, auth, rdb):
    rt1 = auth.new_user_tokens()
    rt2 = refresh(client, rt1["refresh_token"]).get_json()
    rt3 = refresh(client, rt2["refresh_token"]).get_json()
    assert not revoked(rdb, rt3["refresh_token"])

    reuse = refresh(client, rt2["refresh_token"])  # RT2 replayed after RT3 was issued

    assert reuse.status_code == 401
    assert reuse.get_json()["error"]["code"] == "refresh_token_reused"
    assert all(revoked(rdb, t["refresh_token"]) for t in (rt1, rt2, rt3))
    assert refresh(client, rt3["refresh_token"]).status_code == 401  # the user must log in again
    assert client.get("/auth/me", headers=bearer(rt3["access_token"])).status_code == 401


def test_refresh_rule_logout_from_all_devices_revokes_every_refresh_token(client, auth, rdb):
    user = auth.register()
    devices = [auth.login_body(user["email"], device=f"device {n}") for n in range(3)]
    assert client.post("/auth/logout-all", headers=bearer(devices[0]["access_token"])).status_code == 204
    assert all(revoked(rdb, d["refresh_token"]) for d in devices)
    for device in devices:
        assert refresh(client, device["refresh_token"]).status_code == 401


# Table 3.2: access token


def test_access_rule_logout_all_increments_token_version_and_old_tokens_fail(client, auth, rdb):
    tokens = auth.new_user_tokens()
    user_id = tokens["user"]["id"]
    assert rdb.hget(Keys.user(user_id), "token_version") == "0"
    client.post("/auth/logout-all", headers=bearer(tokens["access_token"]))
    assert rdb.hget(Keys.user(user_id), "token_version") == "1"
    assert client.get("/auth/me", headers=bearer(tokens["access_token"])).status_code == 401
    again = auth.login_body(tokens["email"])  # a new login carries the new tokenVersion
    assert _claims(again["access_token"])["ver"] == 1
    assert client.get("/auth/me", headers=bearer(again["access_token"])).status_code == 200


def test_access_rule_signature_mismatch_is_401(client, auth):
    tokens = auth.new_user_tokens()
    header, payload, signature = tokens["access_token"].split(".")
    flipped = signature[:-2] + ("AA" if signature[-2:] != "AA" else "BB")
    response = client.get("/auth/me", headers=bearer(f"{header}.{payload}.{flipped}"))
    assert response.status_code == 401
    assert response.get_json()["error"]["code"] == "unauthorized"


def test_access_rule_token_version_differing_from_current_is_invalid(client, auth, rdb):
    tokens = auth.new_user_tokens()
    assert client.get("/auth/me", headers=bearer(tokens["access_token"])).status_code == 200
    rdb.hincrby(Keys.user(tokens["user"]["id"]), "token_version", 1)  # as another instance would
    assert client.get("/auth/me", headers=bearer(tokens["access_token"])).status_code == 401


def test_access_rule_token_whose_session_record_is_gone_is_rejected(client, auth, rdb):
    tokens = auth.new_user_tokens()
    assert client.get("/auth/me", headers=bearer(tokens["access_token"])).status_code == 200
    rdb.delete(Keys.session(tokens["user"]["id"], tokens["session_id"]))
    assert client.get("/auth/me", headers=bearer(tokens["access_token"])).status_code == 401


# Table 7: errors (authentication rows)


def test_error_rule_refresh_with_revoked_token_is_401_family_revoked_login_required(client, auth, rdb):
    first = auth.new_user_tokens()
    refresh(client, first["refresh_token"])
    response = refresh(client, first["refresh_token"])
    assert response.status_code == 401
    assert response.get_json() == {
        "error": {"code": "refresh_token_reused", "message": response.get_json()["error"]["message"]}
    }
    assert not rdb.exists(Keys.session(first["user"]["id"], first["session_id"]))
    assert auth.login(first["email"]).status_code == 200  # logging in again works


def test_error_rule_access_token_with_wrong_signature_is_unauthorized(client, auth):
    tokens = auth.new_user_tokens()
    header, payload, _ = tokens["access_token"].split(".")
    assert client.get("/auth/me", headers=bearer(f"{header}.{payload}.c2lnbmF0dXJl")).status_code == 401


def test_error_rule_access_token_with_old_token_version_is_invalid(client, auth):
    tokens = auth.new_user_tokens()
    other_device = auth.login_body(tokens["email"])
    client.post("/auth/logout-all", headers=bearer(other_device["access_token"]))
    assert client.get("/auth/me", headers=bearer(tokens["access_token"])).status_code == 401


def test_error_rule_session_token_without_stored_record_is_rejected(client, auth):
    tokens = auth.new_user_tokens()
    client.post("/auth/logout", headers=bearer(tokens["access_token"]))
    assert client.get("/auth/me", headers=bearer(tokens["access_token"])).status_code == 401
    assert refresh(client, tokens["refresh_token"]).status_code == 401


def _claims(token: str) -> dict:
    payload = token.split(".")[1]
    return json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
