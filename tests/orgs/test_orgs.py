"""Organizations and their members through the API: who may create, read, rename, delete, change roles and
remove, the last-owner rule, API keys with orgs:manage acting as owners, the admins' listing, and the audit
entries and announcements each change makes. In process, on the session's Redis in both modes."""

from __future__ import annotations

import pytest

from app.redis import Keys
from tests.orgs.conftest import add_member
from tests.utils import redis_snapshot


def entries(client, admin: dict, entry_type: str) -> list[dict]:
    found = client.get(f"/admin/audit?type={entry_type}", headers=admin["headers"])
    assert found.status_code == 200, found.get_json()
    return found.get_json()["entries"]


def test_creating_reading_listing_and_renaming(client, person, new_org):
    """The creator owns the new organization; members read it, owners and admins rename it; outsiders get 404."""
    owner, admin_member, member, outsider, root = person(), person(), person(), person(), person("admin")
    created = client.post("/orgs", json={"name": "Acme"}, headers=owner["headers"])
    assert created.status_code == 201
    org = created.get_json()
    assert org["name"] == "Acme" and org["role"] == "owner" and org["created_at"].endswith("Z")
    add_member(client, org["id"], owner, admin_member, "admin")
    add_member(client, org["id"], owner, member, "member")
    other = new_org(member, name="Beta")

    listed = client.get("/orgs", headers=member["headers"]).get_json()["orgs"]
    assert [(o["name"], o["role"]) for o in listed] == [("Acme", "member"), ("Beta", "owner")]
    assert client.get(f"/orgs/{org['id']}", headers=member["headers"]).get_json()["role"] == "member"
    for path in (f"/orgs/{org['id']}", f"/orgs/{org['id']}/members", f"/orgs/{other}"):
        assert client.get(path, headers=outsider["headers"]).status_code == 404, path
    assert client.get("/orgs/not-an-id", headers=owner["headers"]).status_code == 404
    assert client.get(f"/orgs/{org['id']}", headers=root["headers"]).get_json().get("role") is None  # reads all

    members = client.get(f"/orgs/{org['id']}/members", headers=member["headers"]).get_json()["members"]
    assert sorted((m["user_id"], m["email"], m["role"]) for m in members) == sorted(
        [
            (owner["id"], owner["email"], "owner"),
            (admin_member["id"], admin_member["email"], "admin"),
            (member["id"], member["email"], "member"),
        ]
    )
    rename = {"name": "Acme Inc."}
    assert client.patch(f"/orgs/{org['id']}", json=rename, headers=member["headers"]).status_code == 403
    renamed = client.patch(f"/orgs/{org['id']}", json=rename, headers=admin_member["headers"])
    assert renamed.status_code == 200 and renamed.get_json()["name"] == "Acme Inc."
    assert client.patch(f"/orgs/{org['id']}", json=rename, headers=outsider["headers"]).status_code == 404

    [updated] = entries(client, root, "org.updated")
    assert updated["subject"] == admin_member["id"] and updated["details"]["org_id"] == org["id"]
    made = [e for e in entries(client, root, "org.created") if e["details"]["org_id"] == org["id"]]
    assert [e["subject"] for e in made] == [owner["id"]]


def test_bad_names_and_unverified_creators_are_refused_and_change_nothing(client, rdb, person, make_app):
    owner = person()
    before = redis_snapshot(rdb)
    for name in ("", "x" * 101, "tab\there", "bell\x07"):
        refused = client.post("/orgs", json={"name": name}, headers=owner["headers"])
        assert refused.status_code == 422, name
    assert client.post("/orgs", json={"name": 5}, headers=owner["headers"]).status_code == 400
    unverified = person(verified=False)
    before = redis_snapshot(rdb)
    refused = client.post("/orgs", json={"name": "Acme"}, headers=unverified["headers"])
    assert refused.status_code == 403 and refused.get_json()["error"]["code"] == "email_not_verified"
    assert redis_snapshot(rdb) == before
    assert client.post("/orgs", json={"name": "x" * 100}, headers=owner["headers"]).status_code == 201


def test_org_creation_for_admins_only(make_app, base_env):
    from tests.conftest import https_client
    from tests.utils import AuthActions

    app = make_app(ORG_CREATION="admins")
    client = https_client(app)
    auth = AuthActions(client)
    from app.auth.users import create_user
    from tests.utils import DEFAULT_PASSWORD, bearer, random_email

    headers = {}
    for role in ("user", "admin"):
        email = random_email()
        with app.app_context():
            create_user(email, DEFAULT_PASSWORD, role=role, email_verified=True)
        headers[role] = bearer(auth.login_body(email)["access_token"])
    refused = client.post("/orgs", json={"name": "Acme"}, headers=headers["user"])
    assert refused.status_code == 403 and refused.get_json()["error"]["code"] == "forbidden"
    assert client.post("/orgs", json={"name": "Acme"}, headers=headers["admin"]).status_code == 201
    with pytest.raises(Exception, match="ORG_CREATION"):
        make_app(ORG_CREATION="nobody")


def test_roles_follow_the_rules_and_the_last_owner_stays(client, person, new_org, announced):
    owner, admin, member, other = person(), person(), person(), person()
    org = new_org(owner, (admin, "admin"), (member, "member"), (other, "member"))
    announced.clear()

    def set_role(by, user, role):
        return client.patch(f"/orgs/{org}/members/{user['id']}", json={"role": role}, headers=by["headers"])

    assert set_role(member, other, "admin").status_code == 403  # members change no role
    assert set_role(admin, member, "owner").status_code == 403  # admins make no owner
    promoted = set_role(admin, member, "admin")
    assert promoted.status_code == 200 and promoted.get_json()["role"] == "admin"
    assert promoted.get_json()["user_id"] == member["id"] and promoted.get_json()["email"] == member["email"]
    assert set_role(admin, member, "member").status_code == 200
    assert announced == [(org, member["id"]), (org, member["id"])]

    for by in (owner, admin):  # the last owner stays, whoever asks
        last = set_role(by, owner, "admin")
        assert last.status_code == 409 and last.get_json()["error"]["code"] == "conflict"
    assert set_role(owner, other, "owner").status_code == 200
    assert set_role(admin, owner, "member").status_code == 403  # admins demote no owner
    assert set_role(owner, owner, "member").status_code == 200  # another owner remains
    assert set_role(other, owner, "owner").status_code == 200
    assert set_role(owner, person(), "admin").status_code == 404  # not a member
    assert set_role(owner, other, "boss").status_code == 422
    assert set_role(owner, member, "member").status_code == 200  # unchanged: no announcement
    assert announced.count((org, member["id"])) == 2


def test_removal_and_leaving(client, rdb, person, new_org, announced):
    owner, co_owner, admin, admin2, member, member2 = (person() for _ in range(6))
    members = (co_owner, "owner"), (admin, "admin"), (admin2, "admin"), (member, "member"), (member2, "member")
    org = new_org(owner, *members)
    announced.clear()

    def remove(by, user):
        return client.delete(f"/orgs/{org}/members/{user['id']}", headers=by["headers"])

    assert remove(member, member2).status_code == 403
    assert remove(admin, admin2).status_code == 403  # admins remove members only
    assert remove(admin, owner).status_code == 403
    assert remove(admin, member2).status_code == 204
    assert remove(member, member).status_code == 204  # leaving
    assert remove(owner, admin2).status_code == 204
    assert remove(owner, member).status_code == 404  # gone already
    assert remove(co_owner, co_owner).status_code == 204
    for by in (owner, admin):
        last = remove(by, owner)
        assert last.status_code == 409 and last.get_json()["error"]["code"] == "conflict"
    expected = [(org, member2["id"]), (org, member["id"]), (org, admin2["id"]), (org, co_owner["id"])]
    assert announced == expected
    assert rdb.hget(Keys.user_orgs(member["id"]), org) is None
    assert client.get(f"/orgs/{org}", headers=member["headers"]).status_code == 404
    assert client.get("/orgs", headers=member["headers"]).get_json()["orgs"] == []
    removed = {e["subject"]: e for e in entries(client, person("admin"), "org.member_removed")}
    assert set(removed) == {member["id"], member2["id"], admin2["id"], co_owner["id"]}
    assert removed[member2["id"]]["actor"] == {"kind": "user", "id": admin["id"]}
    assert removed[member2["id"]]["details"]["org_id"] == org


def test_deleting_an_organization(client, rdb, person, new_org, announced):
    owner, admin, member = person(), person(), person()
    org = new_org(owner, (admin, "admin"), (member, "member"))
    client.post(f"/orgs/{org}/invitations", json={"email": "later@example.com"}, headers=owner["headers"])
    announced.clear()
    assert client.delete(f"/orgs/{org}", headers=admin["headers"]).status_code == 403
    assert client.delete(f"/orgs/{org}", headers=owner["headers"]).status_code == 204
    assert announced == [(org, None)]
    assert not rdb.exists(Keys.org(org), Keys.org_members(org), Keys.org_invitations(org))
    assert rdb.zscore(Keys.orgs(), org) is None
    for user in (owner, admin, member):
        assert rdb.hget(Keys.user_orgs(user["id"]), org) is None
    assert client.delete(f"/orgs/{org}", headers=owner["headers"]).status_code == 404
    [deleted] = entries(client, person("admin"), "org.deleted")
    assert deleted["subject"] == owner["id"] and deleted["details"] == {"org_id": org}


def test_administrators_and_keys_act_as_owners(client, person, new_org, org_key):
    owner, member = person(), person()
    org = new_org(owner, (member, "member"))
    key, other_key, root = org_key("orgs:manage"), org_key("channels:manage"), person("admin")
    assert client.get(f"/orgs/{org}/members", headers=other_key).status_code == 403
    assert client.get(f"/orgs/{org}", headers=key).status_code == 200
    changed = client.patch(f"/orgs/{org}/members/{member['id']}", json={"role": "owner"}, headers=key)
    assert changed.status_code == 200 and changed.get_json()["role"] == "owner"
    assert client.delete(f"/orgs/{org}/members/{owner['id']}", headers=root["headers"]).status_code == 204
    last = client.delete(f"/orgs/{org}/members/{member['id']}", headers=key)
    assert last.status_code == 409  # the last owner stays, whoever asks
    assert client.post("/orgs", json={"name": "By key"}, headers=key).status_code == 403  # users only
    [entry] = [e for e in entries(client, root, "org.role_changed") if e["subject"] == member["id"]]
    assert entry["actor"]["kind"] == "api_key"


def test_admins_page_through_every_organization(client, person, new_org, org_key):
    owner, root = person(), person("admin")
    made = [new_org(owner, name=f"Org {n}") for n in range(5)]
    assert client.get("/admin/orgs", headers=owner["headers"]).status_code == 403
    seen, before = [], None
    while True:
        query = "/admin/orgs?limit=2" + (f"&before={before}" if before else "")
        page = client.get(query, headers=root["headers"]).get_json()
        seen += [org["id"] for org in page["orgs"]]
        assert len(page["orgs"]) <= 2
        before = page["next"]
        if before is None:
            break
    assert seen == made[::-1]
    by_key = client.get("/admin/orgs", headers=org_key("orgs:manage")).get_json()
    assert [o["id"] for o in by_key["orgs"]] == made[::-1] and by_key["next"] is None
    for bad in ("limit=0", "limit=501", "before=yesterday"):
        assert client.get(f"/admin/orgs?{bad}", headers=root["headers"]).status_code == 400, bad
    one = client.get(f"/admin/orgs/{made[0]}", headers=root["headers"]).get_json()
    assert one["name"] == "Org 0" and [m["user_id"] for m in one["members"]] == [owner["id"]]
    assert client.get(f"/admin/orgs/{'0' * 32}", headers=root["headers"]).status_code == 404
