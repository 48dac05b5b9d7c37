"""PUT, GET and DELETE /admin/namespaces: who may, what is refused, what is announced."""

from __future__ import annotations

import pytest

from app.redis import Keys
from tests.utils import redis_snapshot

CHAT = {"name": "chat", "subscribe": "members", "publish": "server", "presence": False, "join_leave": False}
RULES = {"subscribe": "members", "publish": "server"}


def test_a_namespace_is_created_listed_replaced_and_deleted(client, admin, announced):
    created = client.put("/admin/namespaces/chat", json=RULES, headers=admin["headers"])
    assert created.status_code == 200 and created.get_json() == CHAT  # absent booleans are false
    assert created.headers["Cache-Control"] == "no-store"
    assert announced == []  # nothing was open on it

    rules = {"subscribe": "authenticated", "publish": "subscribers", "presence": True, "join_leave": True}
    replaced = client.put("/admin/namespaces/chat", json=rules, headers=admin["headers"])
    assert replaced.get_json() == {"name": "chat", **rules}
    assert announced == [("access_changed", None, "chat", None)]
    assert client.put("/admin/namespaces/chat", json=rules, headers=admin["headers"]).status_code == 200
    assert len(announced) == 1  # the same rules again change nothing

    client.put("/admin/namespaces/alerts-2", json={**RULES, "presence": True}, headers=admin["headers"])
    listed = client.get("/admin/namespaces", headers=admin["headers"])
    assert listed.status_code == 200 and listed.headers["Cache-Control"] == "no-store"
    assert listed.get_json() == {
        "namespaces": [
            {**CHAT, "name": "alerts-2", "presence": True},
            {"name": "chat", **rules},
        ]
    }

    assert client.delete("/admin/namespaces/chat", headers=admin["headers"]).status_code == 204
    assert announced[-1] == ("namespace_deleted", None, "chat", None)
    assert [n["name"] for n in client.get("/admin/namespaces", headers=admin["headers"]).get_json()["namespaces"]] == [
        "alerts-2"
    ]
    again = client.delete("/admin/namespaces/chat", headers=admin["headers"])
    assert again.status_code == 404 and again.get_json()["error"]["code"] == "not_found"
    assert len(announced) == 2


@pytest.mark.parametrize(
    "name, body, status",
    [
        ("user", RULES, 422),
        ("broadcast", RULES, 422),
        ("webhooks", RULES, 422),
        ("admin", RULES, 422),
        ("Chat", RULES, 422),
        ("a" * 33, RULES, 422),
        ("a.b", RULES, 422),
        ("chat", {**RULES, "join_leave": True}, 422),  # join and leave need presence
        ("chat", {**RULES, "subscribe": "everyone"}, 422),
        ("chat", {**RULES, "publish": "anyone"}, 422),
        ("chat", {**RULES, "subscribe": 1}, 400),
        ("chat", {**RULES, "presence": "yes"}, 400),
        ("chat", {}, 400),  # who subscribes and who publishes are always said: no default nobody chose
        ("chat", {"subscribe": "authenticated", "presence": True}, 400),
        ("chat", {"publish": "subscribers"}, 400),
        ("chat", {**RULES, "presence": None}, 400),
    ],
)
def test_bad_namespaces_are_refused_and_store_nothing(client, admin, rdb, announced, name, body, status):
    before = redis_snapshot(rdb)
    answer = client.put(f"/admin/namespaces/{name}", json=body, headers=admin["headers"])
    assert answer.status_code == status, answer.get_json()
    assert answer.get_json()["error"]["code"] == ("validation_failed" if status == 422 else "bad_request")
    assert redis_snapshot(rdb) == before and announced == []


def test_a_body_that_is_not_a_json_object_is_refused(client, admin, rdb):
    headers = admin["headers"]
    assert client.put("/admin/namespaces/chat", data="subscribe=members", headers=headers).status_code == 415
    bad = client.put("/admin/namespaces/chat", data="{", content_type="application/json", headers=headers)
    assert bad.status_code == 400
    assert client.put("/admin/namespaces/chat", json=[1], headers=headers).status_code == 400
    assert not rdb.exists(Keys.namespaces())


def test_only_admins_and_keys_with_the_scope_manage_namespaces(client, user, key, rdb):
    for method in ("put", "delete"):
        assert getattr(client, method)("/admin/namespaces/chat", json={}).status_code == 401
        assert getattr(client, method)("/admin/namespaces/chat", json={}, headers=user["headers"]).status_code == 403
    assert client.get("/admin/namespaces", headers=user["headers"]).status_code == 403
    other = key("events:publish", "webhooks:manage", "tokens:introspect", channels=("*",))
    refused = client.put("/admin/namespaces/chat", json=RULES, headers=other)
    assert refused.status_code == 403 and refused.get_json()["error"]["code"] == "forbidden"
    assert not rdb.exists(Keys.namespaces())

    manager = key("channels:manage")
    assert client.put("/admin/namespaces/chat", json=RULES, headers=manager).status_code == 200
    assert [n["name"] for n in client.get("/admin/namespaces", headers=manager).get_json()["namespaces"]] == ["chat"]
    assert client.delete("/admin/namespaces/chat", headers=manager).status_code == 204


@pytest.mark.parametrize("name", ["nothing", "user", "Bad.Name"])
def test_deleting_a_namespace_that_does_not_exist_is_404(client, admin, announced, name):
    answer = client.delete(f"/admin/namespaces/{name}", headers=admin["headers"])
    assert answer.status_code == 404 and announced == []
