"""What running on a Redis Cluster asks of the store: one hash slot per atomic step, keys passed in KEYS,
global indexes that survive a process dying between steps. Most run in both Redis modes (the key
scheme is the same); those about the cluster itself run against the local cluster only.
"""

from __future__ import annotations

import re
import time
import uuid

import pytest
import redis
from redis.crc import key_slot

from app import redis as app_redis
from app.apikeys import store as apikeys_store
from app.auth import indexes, mailtokens, mfa, oauth, sessions, users
from app.events import leases
from app.limits import limiter_storage
from app.mail import queue
from app.redis import LOGOUT_ALL, ROTATE_REFRESH, Keys, connect
from app.webhooks import store as webhooks_store
from tests.utils import DEFAULT_PASSWORD, bearer, random_email

# Where the store's Lua lives; each must take its keys in KEYS.
SCRIPT_MODULES = (
    app_redis,
    apikeys_store,
    indexes,
    mailtokens,
    mfa,
    oauth,
    sessions,
    users,
    leases,
    queue,
    webhooks_store,
)


def lua_sources() -> dict[str, str]:
    return {
        f"{module.__name__}.{name}": value
        for module in SCRIPT_MODULES
        for name, value in vars(module).items()
        if isinstance(value, str) and "redis.call(" in value
    }


def test_no_store_script_builds_a_key_name_itself():
    """A key built inside a script is invisible to the cluster client's routing (and may sit elsewhere)."""
    sources = lua_sources()
    assert len(sources) >= 12  # the search finds the scripts
    built = re.compile(r"""'[A-Za-z_.-]*:'\s*\.\.|\.\.\s*':""")
    assert built.search("local k = 'session:' .. sid")  # ...and would see a key being built
    offenders = {name: built.search(source).group(0) for name, source in sources.items() if built.search(source)}
    assert not offenders


def user_keys(rdb, user_id: str) -> list[str]:
    return [key for key in rdb.scan_iter(count=1000) if user_id in key and not key.startswith(("ratelimit", "events:"))]


def test_everything_of_one_user_shares_one_hash_slot(client, auth, rdb):
    tokens = auth.new_user_tokens()
    user_id = tokens["user"]["id"]
    refreshed = client.post("/auth/refresh", json={"refresh_token": tokens["refresh_token"]}).get_json()
    client.post("/auth/mfa/totp/setup", headers=bearer(refreshed["access_token"]))
    client.post("/auth/password/forgot", json={"email": tokens["user"]["email"]})
    keys = user_keys(rdb, user_id)
    kinds = {re.sub(r":[0-9a-f]{32,64}", ":<id>", key.split("}", 1)[1]) for key in keys if "}" in key}
    assert {":sessions", ":session:<id>", ":session:<id>:tokens", ":session:<id>:live", ":refresh:<id>"} <= kinds
    assert Keys.audit_subject(user_id) in keys  # the entries about the user, written in the same steps
    # Global indexes apart: the list of users, e-mail addresses, and the audit entries by actor.
    indexes = ("users", "user:email:", Keys.audit_actor(""))
    assert {key_slot(key.encode()) for key in keys if not key.startswith(indexes)} == {
        key_slot(Keys.user(user_id).encode())
    }


def test_a_refresh_token_names_its_user_and_session(auth):
    tokens = auth.new_user_tokens()
    user_id, session_id, secret = tokens["refresh_token"].split(".")
    assert (user_id, session_id) == (tokens["user"]["id"], tokens["session_id"])
    assert len(secret) >= 43  # 256 random bits, base64url


def test_a_refresh_token_whose_ids_were_changed_matches_nothing(client, auth):
    victim, attacker = auth.new_user_tokens(), auth.new_user_tokens()
    _, _, secret = attacker["refresh_token"].split(".")
    forged = f"{victim['user']['id']}.{victim['session_id']}.{secret}"
    for token in (forged, secret, "x" * 80, f"{victim['user']['id']}.{victim['session_id']}"):
        response = client.post("/auth/refresh", json={"refresh_token": token})
        assert response.status_code == 401 and response.get_json()["error"]["code"] == "invalid_refresh_token"
    assert client.post("/auth/refresh", json={"refresh_token": victim["refresh_token"]}).status_code == 200


def test_logout_all_and_reuse_detection_end_every_session_in_one_step(client, auth, rdb):
    user = auth.register()
    devices = [auth.login_body(user["email"], device=f"device {n}") for n in range(3)]
    # Reuse: the stolen first token of device 0 after it was rotated ends that session (and its newest token).
    rotated = client.post("/auth/refresh", json={"refresh_token": devices[0]["refresh_token"]}).get_json()
    reused = client.post("/auth/refresh", json={"refresh_token": devices[0]["refresh_token"]})
    assert reused.get_json()["error"]["code"] == "refresh_token_reused"
    assert client.post("/auth/refresh", json={"refresh_token": rotated["refresh_token"]}).status_code == 401
    assert client.get("/auth/me", headers=bearer(devices[1]["access_token"])).status_code == 200
    # Logout-all: every other session and token too.
    assert client.post("/auth/logout-all", headers=bearer(devices[1]["access_token"])).status_code == 204
    for device in devices[1:]:
        assert client.get("/auth/me", headers=bearer(device["access_token"])).status_code == 401
        refused = client.post("/auth/refresh", json={"refresh_token": device["refresh_token"]})
        assert refused.get_json()["error"]["code"] == "refresh_token_reused"
    assert rdb.scard(Keys.user_sessions(user["id"])) == 0
    assert rdb.hget(Keys.user(user["id"]), "token_version") == "1"


def test_a_session_listing_that_a_login_made_stale_changes_nothing(app, auth, rdb):
    """The scripts check what the caller listed against what is stored, so a racing login cannot escape."""
    user = auth.register()
    first = auth.login_body(user["email"])
    with app.app_context():
        listing = sessions.session_layout(rdb, user["id"], [first["session_id"]])
        second = auth.login_body(user["email"])  # logs in between the reading and the script
        script = rdb.register_script(LOGOUT_ALL)
        answer = script(
            keys=[Keys.user(user["id"]), Keys.user_sessions(user["id"]), *listing[0]], args=[1, *listing[1]]
        )
        assert answer == "stale"
        assert rdb.hget(Keys.user(user["id"]), "token_version") == "0"
        assert sessions.logout_all(user["id"]) == 1  # reads again, then ends both
    assert rdb.scard(Keys.user_sessions(user["id"])) == 0
    assert not rdb.exists(Keys.session(user["id"], second["session_id"]))


def register(client, email: str):
    return client.post("/auth/register", json={"email": email, "password": DEFAULT_PASSWORD})


@pytest.mark.parametrize("left_behind", ["pending:", ""])
def test_an_email_claim_left_by_a_crashed_step_counts_as_free(client, auth, rdb, left_behind):
    """A creation (pending claim) or a deletion (committed index) that died before its record existed/after it went."""
    email = random_email()
    dead = uuid.uuid4().hex
    rdb.set(Keys.user_by_email(email), left_behind + dead)
    created = register(client, email)
    assert created.status_code == 201, created.get_json()
    user_id = created.get_json()["user"]["id"]
    assert rdb.get(Keys.user_by_email(email)) == user_id  # committed to the new account
    assert auth.login(email).status_code == 200
    assert register(client, email).status_code == 409


def test_a_claim_whose_record_exists_is_taken_and_committed_for_its_creator(client, app, auth, rdb):
    """The creator wrote the record but died before committing: the account is real, and stays findable."""
    user = auth.register()
    rdb.set(Keys.user_by_email(user["email"]), indexes.PENDING + user["id"])
    assert register(client, user["email"]).status_code == 409
    assert rdb.get(Keys.user_by_email(user["email"])) == user["id"]
    assert auth.login(user["email"]).status_code == 200


def test_a_taken_over_claim_cannot_be_committed_and_a_committed_one_cannot_be_taken(app, rdb):
    key, first, second = Keys.user_by_email(random_email()), uuid.uuid4().hex, uuid.uuid4().hex
    with app.app_context():
        assert indexes.claim(key, first) is None
        assert indexes.claim(key, second) is None  # the first's record is missing: free
        assert not indexes.commit(key, first)  # so the first creation fails (and undoes itself)
        assert indexes.commit(key, second)
        # A claimant that saw the pending claim just before its creator committed does not take it.
        third = uuid.uuid4().hex
        rdb.hset(Keys.user(second), "id", second)
        seen = indexes.PENDING + second
        assert rdb.register_script(indexes.CLAIM_LUA)(keys=[key], args=[indexes.PENDING + third, seen]) == second
        assert indexes.claim(key, third) == second
        indexes.release(key, first)  # not the first's: nothing happens
        assert rdb.get(key) == second


def test_deleting_a_user_releases_the_indexes_and_leaves_no_key_of_theirs(client, app, auth, admin_tokens, rdb):
    tokens = auth.new_user_tokens()
    user_id, email = tokens["user"]["id"], tokens["user"]["email"]
    client.post("/auth/refresh", json={"refresh_token": tokens["refresh_token"]})
    with app.app_context():
        identity = Keys.user_by_identity("corp", "subject-1")
        oauth._link(identity, user_id)
        assert rdb.get(identity) == user_id
    assert client.delete(f"/admin/users/{user_id}", headers=bearer(admin_tokens["access_token"])).status_code == 204
    # Only the audit entries about them, and by them, outlive them (API.md section 14).
    assert sorted(user_keys(rdb, user_id)) == sorted([Keys.audit_subject(user_id), Keys.audit_actor(user_id)])
    assert not rdb.exists(Keys.user_by_email(email), identity)
    assert register(client, email).status_code == 201


@pytest.fixture
def admin_tokens(app, auth):
    email = random_email()
    with app.app_context():
        users.create_user(email, DEFAULT_PASSWORD, role="admin")
    return auth.login_body(email)


def test_rate_limit_storage_on_a_cluster_names_every_seed():
    seeds = "redis://:pa%40ss@10.0.0.1:7000/0,redis://:pa%40ss@10.0.0.2:7001/0"
    assert limiter_storage(seeds, "cluster") == (
        "redis+cluster://10.0.0.1:7000,10.0.0.2:7001",
        {"socket_connect_timeout": 3, "password": "pa@ss"},
    )
    uri, options = limiter_storage("rediss://10.0.0.1:7000/0?ssl_cert_reqs=none", "cluster")
    assert uri == "redis+cluster://10.0.0.1:7000" and options["ssl"] and options["ssl_cert_reqs"] == "none"
    assert limiter_storage("redis://127.0.0.1:6379/0", "standalone")[0] == "redis://127.0.0.1:6379/0"


def other_slot_keys(rdb) -> tuple[str, str]:
    """Two user records served by different primaries."""
    first = Keys.user(uuid.uuid4().hex)
    while True:
        second = Keys.user(uuid.uuid4().hex)
        if rdb.get_node_from_key(first) != rdb.get_node_from_key(second):
            return first, second


@pytest.mark.cluster_only
def test_the_cluster_refuses_a_script_across_hash_slots(rdb):
    """Why every script's keys share a hash tag: the harness would fail a script that did not."""
    first, second = other_slot_keys(rdb)
    with pytest.raises(redis.exceptions.RedisClusterException, match="same key slot"):
        rdb.register_script("return redis.call('EXISTS', KEYS[1], KEYS[2])")(keys=[first, second])
    # A key built inside a script, in a slot another primary serves, is refused by the node itself.
    built = rdb.register_script("return redis.call('EXISTS', 'user:{' .. ARGV[1] .. '}')")
    with pytest.raises(redis.exceptions.ResponseError, match="non local key"):
        built(keys=[first], args=[second.removeprefix("user:{").removesuffix("}")])
    # The store's own multi-key script on one user's slot goes through.
    user_id = uuid.uuid4().hex
    rotate = rdb.register_script(ROTATE_REFRESH)
    keys = [Keys.refresh_token(user_id, "a"), Keys.refresh_token(user_id, "b"), Keys.session(user_id, "s")]
    keys += [Keys.session_tokens(user_id, "s"), Keys.session_live_tokens(user_id, "s"), Keys.user(user_id)]
    assert rotate(keys=[*keys, Keys.user_sessions(user_id)], args=[time.time(), 0, 60, 0, "a", "b", "s", 0]) == [
        "invalid"
    ]


@pytest.mark.cluster_only
def test_each_cluster_node_has_a_bounded_blocking_pool(redis_server):
    client = connect(redis_server.url, 7, "cluster")
    client.ping(target_nodes=redis.RedisCluster.ALL_NODES)
    pools = [node.redis_connection.connection_pool for node in client.get_nodes()]
    assert len(pools) >= 3
    assert all(isinstance(pool, redis.BlockingConnectionPool) and pool.max_connections == 7 for pool in pools)


@pytest.mark.cluster_only
def test_an_unreachable_cluster_is_a_connection_error_at_first_use_not_at_start(make_app):
    from tests.servers import free_cluster_port

    app = make_app(REDIS_URL=f"redis://127.0.0.1:{free_cluster_port()}/0")
    client = app.test_client()
    response = client.post("/auth/login", json={"email": random_email(), "password": DEFAULT_PASSWORD})
    assert response.status_code == 503 and response.get_json()["error"]["code"] == "unavailable"
