"""Many devices at once: listing, per-device logout, logout everywhere, and the password-change rule."""

from __future__ import annotations

import pytest

from app.redis import Keys
from tests.utils import bearer


@pytest.fixture
def three_devices(auth):
    user = auth.register()
    devices = [auth.login_body(user["email"], device=name) for name in ("phone", "browser", "laptop")]
    return user, devices


def works(client, device) -> bool:
    return client.get("/auth/me", headers=bearer(device["access_token"])).status_code == 200


def refreshes(client, device) -> bool:
    return client.post("/auth/refresh", json={"refresh_token": device["refresh_token"]}).status_code == 200


def test_each_login_is_its_own_session_listed_with_this_device_marked(client, three_devices):
    _, (phone, browser, laptop) = three_devices
    listed = client.get("/auth/sessions", headers=bearer(browser["access_token"])).get_json()["sessions"]
    assert {s["id"] for s in listed} == {phone["session_id"], browser["session_id"], laptop["session_id"]}
    assert {s["device"] for s in listed} == {"phone", "browser", "laptop"}
    assert [s["id"] for s in listed if s["current"]] == [browser["session_id"]]
    assert set(listed[0]) == {"id", "device", "created_at", "last_used_at", "ip", "current"}
    assert listed[0]["created_at"].endswith("Z")


def test_ending_one_device_leaves_the_others(client, three_devices, rdb):
    _, (phone, browser, laptop) = three_devices
    response = client.delete(f"/auth/sessions/{phone['session_id']}", headers=bearer(browser["access_token"]))
    assert response.status_code == 204
    assert not works(client, phone) and not refreshes(client, phone)
    assert works(client, browser) and works(client, laptop)
    assert refreshes(client, laptop)
    assert not rdb.exists(Keys.session(phone["user"]["id"], phone["session_id"]))


def test_another_users_session_is_404_and_untouched(client, auth, three_devices):
    _, (phone, _, _) = three_devices
    stranger = auth.new_user_tokens()
    response = client.delete(f"/auth/sessions/{phone['session_id']}", headers=bearer(stranger["access_token"]))
    assert response.status_code == 404
    assert response.get_json()["error"]["code"] == "not_found"
    assert works(client, phone)
    assert client.delete("/auth/sessions/no-such-id", headers=bearer(stranger["access_token"])).status_code == 404


def test_logout_ends_only_the_current_session(client, three_devices):
    _, (phone, browser, laptop) = three_devices
    assert client.post("/auth/logout", headers=bearer(phone["access_token"])).status_code == 204
    assert not works(client, phone) and not refreshes(client, phone)
    assert works(client, browser) and works(client, laptop)


def test_logout_with_only_a_refresh_token_ends_that_session(client, three_devices):
    """An access token may already have expired when a user logs out."""
    _, (phone, browser, _) = three_devices
    assert client.post("/auth/logout", json={"refresh_token": phone["refresh_token"]}).status_code == 204
    assert not works(client, phone)
    assert works(client, browser)


def test_logout_without_credentials_is_401(client):
    response = client.post("/auth/logout")
    assert response.status_code == 401


def test_logout_all_ends_every_device(client, three_devices, rdb):
    user, devices = three_devices
    assert client.post("/auth/logout-all", headers=bearer(devices[2]["access_token"])).status_code == 204
    for device in devices:
        assert not works(client, device)
        assert not refreshes(client, device)
    assert rdb.scard(Keys.user_sessions(devices[0]["user"]["id"])) == 0
    assert not any(rdb.exists(Keys.session(d["user"]["id"], d["session_id"])) for d in devices)


def test_password_change_ends_every_other_session(client, auth, three_devices):
    user, (phone, browser, laptop) = three_devices
    response = client.post(
        "/auth/password",
        json={"current_password": user["password"], "new_password": "a brand new password"},
        headers=bearer(browser["access_token"]),
    )
    assert response.status_code == 204
    assert works(client, browser) and refreshes(client, browser)
    assert not works(client, phone) and not works(client, laptop)
    assert not refreshes(client, phone)
    assert auth.login(user["email"], user["password"]).status_code == 401
    assert auth.login(user["email"], "a brand new password").status_code == 200


def test_password_change_with_wrong_current_password_changes_nothing(client, auth, three_devices):
    user, (phone, browser, _) = three_devices
    response = client.post(
        "/auth/password",
        json={"current_password": "not the password", "new_password": "a brand new password"},
        headers=bearer(browser["access_token"]),
    )
    assert response.status_code == 401
    assert response.get_json()["error"]["code"] == "invalid_credentials"
    assert works(client, phone)
    assert auth.login(user["email"], user["password"]).status_code == 200


def test_password_change_validates_the_new_password(client, three_devices):
    user, (_, browser, _) = three_devices
    response = client.post(
        "/auth/password",
        json={"current_password": user["password"], "new_password": "short"},
        headers=bearer(browser["access_token"]),
    )
    assert response.status_code == 422


def test_grace_window_lets_the_previous_token_refresh_again(make_app):
    from tests.conftest import https_client
    from tests.utils import AuthActions

    client = https_client(make_app(REFRESH_REUSE_GRACE_SECONDS=30))
    tokens = AuthActions(client).new_user_tokens()
    first = client.post("/auth/refresh", json={"refresh_token": tokens["refresh_token"]})
    second = client.post("/auth/refresh", json={"refresh_token": tokens["refresh_token"]})  # the other tab
    assert first.status_code == second.status_code == 200
    assert second.get_json()["session_id"] == tokens["session_id"]
    # Only the immediately previous token: an older one is still reuse.
    newest = client.post("/auth/refresh", json={"refresh_token": second.get_json()["refresh_token"]})
    assert newest.status_code == 200
    stale = client.post("/auth/refresh", json={"refresh_token": tokens["refresh_token"]})
    assert stale.status_code == 401
    assert stale.get_json()["error"]["code"] == "refresh_token_reused"


def test_no_content_answers_carry_no_content_type(client, auth):
    tokens = auth.new_user_tokens()
    response = client.post("/auth/logout", headers=bearer(tokens["access_token"]))
    assert response.status_code == 204 and "Content-Type" not in response.headers and response.data == b""


def test_status_answers_200_whether_or_not_a_session_is_open(client, auth):
    """GET /auth/status: what a page asks first, so that a visitor without a session logs no 401."""
    nobody = client.get("/auth/status")
    assert nobody.status_code == 200
    assert nobody.get_json() == {"user": None, "session_id": None, "org_id": None, "can_refresh": False}
    assert nobody.headers["Cache-Control"] == "no-store"

    user = auth.register()
    assert auth.login(user["email"], transport="cookie").status_code == 200
    signed_in = client.get("/auth/status")
    assert signed_in.headers["Cache-Control"] == "no-store"
    assert signed_in.get_json() == {**client.get("/auth/me").get_json(), "org_id": None, "can_refresh": True}

    client.delete_cookie("__Host-access")  # as when the access token expires: the refresh cookie stays
    assert client.get("/auth/status").get_json() == {
        "user": None,
        "session_id": None,
        "org_id": None,
        "can_refresh": True,
    }
    assert client.post("/auth/refresh").status_code == 200
    assert client.get("/auth/status").get_json()["user"]["email"] == user["email"]


def test_status_reads_a_bearer_token_and_takes_a_bad_one_for_none(client, auth):
    tokens = auth.new_user_tokens()
    found = client.get("/auth/status", headers=bearer(tokens["access_token"])).get_json()
    assert found["user"]["id"] == tokens["user"]["id"] and found["session_id"] == tokens["session_id"]
    assert found["can_refresh"] is False  # body transport: no refresh cookie came
    assert client.post("/auth/logout", headers=bearer(tokens["access_token"])).status_code == 204
    for headers in (
        bearer(tokens["access_token"]),
        bearer("garbage"),
        bearer("ak_unknown"),
        {"Authorization": "Basic eDp5"},
    ):
        answer = client.get("/auth/status", headers=headers)
        assert answer.status_code == 200, headers
        assert answer.get_json() == {"user": None, "session_id": None, "org_id": None, "can_refresh": False}
