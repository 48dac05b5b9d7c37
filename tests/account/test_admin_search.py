"""`GET /admin/users?q=`: administrators find users by the start of their address (any case), the first 50
in ascending e-mail order; what it cannot be combined with is a 400 that says so."""

from __future__ import annotations

import uuid

import pytest

from app.auth.users import create_user, find_or_create_external_user
from tests.utils import DEFAULT_PASSWORD, bearer

FIELDS = {"id", "email", "role", "email_verified", "mfa_enabled", "created_at"}


def tag() -> str:
    """A prefix no other test's addresses start with."""
    return f"s{uuid.uuid4().hex[:10]}"


def search(client, admin_headers, q: str, **more) -> list[dict]:
    answer = client.get("/admin/users", query_string={"q": q, **more}, headers=admin_headers)
    assert answer.status_code == 200, answer.get_json()
    assert answer.headers["Cache-Control"] == "no-store"
    return answer.get_json()["users"]


def test_a_prefix_finds_users_in_any_case_in_ascending_email_order(app, client, admin_headers):
    prefix = tag()
    with app.app_context():
        made = {
            name: create_user(f"{prefix}-{name}@example.com", DEFAULT_PASSWORD)
            for name in ("carol", "bob", "bob2", "alice", "bobby")
        }
        find_or_create_external_user("https://idp.example", f"{prefix}-bob", None)  # no address: never found
        find_or_create_external_user("https://idp.example", f"{prefix}-bob-ext", f"{prefix}-bob-ext@example.com")
    found = search(client, admin_headers, f"{prefix.upper()}-BOB")
    # '2' and 'b' come before '@': the order is the addresses', not the names'
    assert [user["email"] for user in found] == [
        f"{prefix}-bob2@example.com",
        f"{prefix}-bob@example.com",
        f"{prefix}-bobby@example.com",
    ]
    assert [user["id"] for user in found] == [made["bob2"]["id"], made["bob"]["id"], made["bobby"]["id"]]
    assert set(found[0]) == FIELDS and found[0]["role"] == "user"
    whole = search(client, admin_headers, prefix)
    assert [user["email"] for user in whole] == sorted(user["email"] for user in made.values())
    assert search(client, admin_headers, f"{prefix}-bob@example.com") == [found[1]]  # a whole address is a prefix too
    assert search(client, admin_headers, f"{prefix}-dave") == []
    assert search(client, admin_headers, f"x{prefix}") == []


def test_at_most_the_first_50_are_answered(app, client, admin_headers):
    prefix = tag()
    with app.app_context():
        emails = [create_user(f"{prefix}-{n:02d}@example.com", DEFAULT_PASSWORD)["email"] for n in range(53)]
    found = search(client, admin_headers, prefix)
    assert [user["email"] for user in found] == sorted(emails)[:50]
    everyone = search(client, admin_headers, "")  # every address starts with nothing: the first 50 of all
    assert len(everyone) == 50 and [user["email"] for user in everyone] == sorted(user["email"] for user in everyone)


@pytest.mark.parametrize(
    "query, words",
    [
        ({"q": "bob", "email": "bob@example.com"}, "'q' is not combined with 'email', 'limit' or 'offset'"),
        ({"q": "bob", "limit": "10"}, "'q' is not combined with 'email', 'limit' or 'offset'"),
        ({"q": "bob", "offset": "0"}, "'q' is not combined with 'email', 'limit' or 'offset'"),
        ({"q": "b" * 255}, "Query parameter 'q': string should have at most 254 characters"),
    ],
)
def test_a_bad_search_is_a_400_in_words(client, admin_headers, query, words):
    answer = client.get("/admin/users", query_string=query, headers=admin_headers)
    assert answer.status_code == 400 and answer.get_json()["error"]["code"] == "bad_request"
    assert words in answer.get_json()["error"]["message"]


def test_only_admins_search(client, auth):
    user = auth.new_user_tokens()
    assert client.get("/admin/users?q=a", headers=bearer(user["access_token"])).status_code == 403
    assert client.get("/admin/users?q=a").status_code == 401


@pytest.mark.not_on_cluster("the document is built from the views alone")
def test_the_document_describes_q(app):
    from app.openapi import build_document

    parameters = build_document(app)["paths"]["/admin/users"]["get"]["parameters"]
    [q] = [parameter for parameter in parameters if parameter["name"] == "q"]
    assert q["in"] == "query" and q["schema"]["anyOf"][0]["maxLength"] == 254
    assert "starts with" in q["description"] and "50" in q["description"]
