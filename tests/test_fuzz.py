"""Fuzzing every JSON endpoint and the cursor: the answer is a success or a 4xx in the error shape,
never a 5xx, and a 4xx writes nothing."""

from __future__ import annotations

import base64
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.fuzzing import bodies, bounded, hostile_text, json_values
from tests.utils import bearer, redis_snapshot

ENDPOINT_FIELDS = {
    "/auth/register": ["email", "password"],
    "/auth/login": ["email", "password", "transport", "device"],
    "/auth/refresh": ["refresh_token"],
    "/auth/logout": ["refresh_token"],
    "/auth/password": ["current_password", "new_password"],
    "/events": ["channel", "event", "data"],
}


@pytest.fixture
def auth_tokens(auth):
    return auth.new_user_tokens()


def assert_answer_is_clean(response, rdb, before) -> None:
    assert response.status_code < 500, response.get_data()[:300]
    if response.status_code >= 400:
        error = response.get_json()["error"]
        assert set(error) == {"code", "message"} and error["code"] and error["message"]
        assert redis_snapshot(rdb) == before


def fuzz_endpoint(path: str):
    # A logout that succeeds would end the session the other examples use: it is fuzzed unauthenticated.
    @bounded
    @given(
        body=bodies(ENDPOINT_FIELDS[path]), authenticated=st.booleans() if path != "/auth/logout" else st.just(False)
    )
    def check(client, auth_tokens, rdb, body, authenticated):
        headers = bearer(auth_tokens["access_token"]) if authenticated else {}
        before = redis_snapshot(rdb)
        response = client.post(path, data=body, content_type="application/json", headers=headers)
        assert_answer_is_clean(response, rdb, before)

    return check


def test_fuzz_register(client, auth_tokens, rdb):
    fuzz_endpoint("/auth/register")(client, auth_tokens, rdb)


def test_fuzz_login(client, auth_tokens, rdb):
    fuzz_endpoint("/auth/login")(client, auth_tokens, rdb)


def test_fuzz_refresh(client, auth_tokens, rdb):
    fuzz_endpoint("/auth/refresh")(client, auth_tokens, rdb)


def test_fuzz_logout(client, auth_tokens, rdb):
    fuzz_endpoint("/auth/logout")(client, auth_tokens, rdb)


def test_fuzz_password_change(client, auth_tokens, rdb):
    fuzz_endpoint("/auth/password")(client, auth_tokens, rdb)


def test_fuzz_publish(client, auth_tokens, rdb):
    fuzz_endpoint("/events")(client, auth_tokens, rdb)


def encoded(text: str) -> str:
    return base64.urlsafe_b64encode(text.encode("utf-8", "surrogatepass")).rstrip(b"=").decode()


cursors = (
    hostile_text
    | json_values.map(lambda value: encoded(json.dumps(value)))
    | st.dictionaries(st.sampled_from(["broadcast", "user:x"]), hostile_text | st.from_regex(r"\d{1,21}-\d{1,21}")).map(
        lambda positions: encoded(json.dumps(positions))
    )
)


@bounded
@given(cursor=cursors, path=st.sampled_from(["/events", "/events/wait"]))
def test_fuzz_cursor(client, auth_tokens, rdb, cursor, path):
    before = redis_snapshot(rdb)
    query = {"cursor": cursor, **({"timeout": "0"} if path == "/events/wait" else {})}
    response = client.get(path, query_string=query, headers=bearer(auth_tokens["access_token"]))
    assert response.status_code in (200, 204, 400), response.get_data()[:300]
    assert_answer_is_clean(response, rdb, before)
