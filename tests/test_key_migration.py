"""`flask redis migrate-keys`: a database written before the hash-tagged key names keeps its accounts."""

from __future__ import annotations

import time
import uuid

import pytest

from app.auth import passwords
from app.redis import Keys
from tests.utils import DEFAULT_PASSWORD, bearer, random_email

pytestmark = pytest.mark.not_on_cluster("old databases were written to one Redis; the migration runs there")


def write_old_database(rdb) -> dict:
    """What the service stored before: a user with MFA recovery codes, an OAuth link, a session, mail, a webhook."""
    user_id, email, session_id = uuid.uuid4().hex, random_email(), uuid.uuid4().hex
    rdb.hset(
        f"user:{user_id}",
        mapping={
            "id": user_id,
            "email": email,
            "role": "admin",
            "password_hash": passwords.hash_password(DEFAULT_PASSWORD),
            "token_version": "3",
            "created_at": f"{time.time() - 86400:.3f}",
            "email_verified": "1",
        },
    )
    rdb.set(f"user:email:{email}", user_id)
    rdb.set("user:identity:corp:subject-9", user_id)
    rdb.sadd(f"user:{user_id}:recovery", "hash-of-a-code")
    rdb.sadd(f"user:{user_id}:sessions", session_id)
    rdb.hset(f"session:{session_id}", mapping={"id": session_id, "user_id": user_id})
    rdb.hset("refresh:" + "ab" * 32, mapping={"user_id": user_id, "family_id": session_id})
    rdb.hset("mail:job:job-1", mapping={"id": "job-1", "kind": "verify_email"})
    rdb.zadd("mail:queue", {"job-1": time.time() + 3600})
    rdb.hset("webhook:acme:delivery:d-1", mapping={"id": "d-1", "status": "pending"})
    rdb.set("webhook:acme:seen:body:xyz", "d-1")
    rdb.lpush("webhook:acme:log", "d-1")
    rdb.zadd("webhook:pending", {"acme\nd-1": time.time() + 3600})
    return {"id": user_id, "email": email}


def test_an_old_database_keeps_its_accounts_and_records(cli, rdb, client, auth):
    old = write_old_database(rdb)
    assert auth.login(old["email"]).status_code == 401  # before: the account is not found under the new names
    result = cli("redis", "migrate-keys")
    assert result.returncode == 0, result.stderr
    assert "moved" in result.stdout
    tokens = auth.login_body(old["email"])
    me = client.get("/auth/me", headers=bearer(tokens["access_token"])).get_json()["user"]
    assert me["id"] == old["id"] and me["role"] == "admin"
    listed = client.get("/admin/users", headers=bearer(tokens["access_token"])).get_json()["users"]
    assert [u["id"] for u in listed] == [old["id"]]
    assert rdb.smembers(Keys.user_recovery_codes(old["id"])) == {"hash-of-a-code"}
    assert rdb.smembers(Keys.user_identities(old["id"])) == {"user:identity:corp:subject-9"}
    assert rdb.hget(Keys.mail_job("job-1"), "kind") == "verify_email" and rdb.zscore(Keys.mail_queue(), "job-1")
    assert rdb.hget(Keys.webhook_delivery("acme", "d-1"), "status") == "pending"
    assert rdb.get(Keys.webhook_seen("acme", "body:xyz")) == "d-1"
    assert rdb.lrange(Keys.webhook_log("acme"), 0, -1) == ["d-1"]
    assert rdb.zscore(Keys.webhook_pending("acme"), "acme\nd-1")
    leftovers = [k for k in rdb.scan_iter() if k.startswith(("session:", "refresh:", "mail:job", "webhook:acme:"))]
    assert leftovers == [] and not rdb.exists(f"user:{old['id']}", f"user:{old['id']}:sessions", "mail:queue")
    again = cli("redis", "migrate-keys")  # a second run finds nothing to move
    assert again.returncode == 0 and "moved 0 keys" in again.stdout
    assert auth.login(old["email"]).status_code == 200
