"""POST /events with an API key, published without Flask (app/events/quick_publish.py): the same answer as the
view's, every refusal answered by the view, and an error met while publishing answered once, never published twice."""

from __future__ import annotations

import io
import json

import pytest
from werkzeug.test import Client

from app.apikeys.store import create_key, delete_key, hash_key
from app.channels.namespaces import Namespace, delete_namespace, put_namespace
from app.events.quick_publish import QuickPublisher
from app.redis import Keys

VARYING = {"Date", "X-Request-ID"}


class CountingApp:
    """The WSGI app behind the quick publisher (Flask's side), counting the requests that reach it."""

    def __init__(self, wsgi_app):
        self.wsgi_app = wsgi_app
        self.calls = 0

    def __call__(self, environ, start_response):
        self.calls += 1
        return self.wsgi_app(environ, start_response)


def quick_publisher(app) -> QuickPublisher:
    layer = app.wsgi_app
    while not isinstance(layer, QuickPublisher):
        layer = layer.wsgi_app if hasattr(layer, "wsgi_app") else layer.app
    return layer


@pytest.fixture
def app(make_app):
    return make_app(ALLOWED_ORIGINS="https://shop.example")


@pytest.fixture
def publishing(app, rdb):
    """(a client of the whole app, a client of Flask's side alone, the counter of Flask's side, keys by name)."""
    quick = quick_publisher(app)
    flask_side = quick.wsgi_app = CountingApp(quick.wsgi_app)
    with app.app_context():
        put_namespace(rdb, Namespace("orders", "authenticated"))
        keys = {
            "anywhere": create_key("anywhere", ["events:publish"], ["*"])[0],
            "orders": create_key("orders", ["events:publish"], ["orders:*"])[0],
            "no scope": create_key("manager", ["channels:manage"], ["*"])[0],
        }
    return app.test_client(), Client(flask_side.wsgi_app), flask_side, keys


def post(client, key: str | None, body, content_type="application/json", **headers):
    data = body if isinstance(body, str | bytes) else json.dumps(body)
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    return client.post("/events", data=data, headers={"Content-Type": content_type, **headers})


def same_answer(quick, flask) -> None:
    assert quick.status == flask.status
    assert [(k, v) for k, v in quick.headers.items() if k not in VARYING] == [
        (k, v) for k, v in flask.headers.items() if k not in VARYING
    ]
    assert quick.headers["X-Request-ID"]


def test_a_publication_with_an_api_key_is_answered_without_flask_as_the_view_answers_it(publishing, rdb):
    whole, flask_side, counter, keys = publishing
    body = {"channel": "orders:o1", "event": "paid", "data": {"total": 3}}
    quick = post(whole, keys["orders"], body, X_Request_ID="a" * 32)
    assert counter.calls == 0  # not through Flask
    view = post(flask_side, keys["orders"], body)
    same_answer(quick, view)
    assert quick.status_code == 201 and quick.headers["X-Request-ID"] == "a" * 32
    assert list(quick.get_json()) == list(view.get_json()) == ["channel", "id"]
    stored = rdb.xrange(Keys.stream("orders:o1"))
    assert [entry_id for entry_id, _ in stored] == [quick.get_json()["id"], view.get_json()["id"]]
    assert stored[0][1] == stored[1][1] | {"ts": stored[0][1]["ts"]}
    assert json.loads(stored[0][1]["data"]) == {"total": 3}


@pytest.mark.parametrize("compact", [None, False])
def test_the_body_is_the_views_byte_for_byte_in_either_json_format(publishing, app, compact):
    whole, flask_side, counter, keys = publishing
    app.json.compact = compact  # False: indented, as in debug mode
    body = {"channel": "orders:o2", "event": "paid"}
    quick, view = post(whole, keys["orders"], body), post(flask_side, keys["orders"], body)
    assert counter.calls == 0  # the quick one not through Flask
    assert quick.get_data().replace(quick.get_json()["id"].encode(), b"") == view.get_data().replace(
        view.get_json()["id"].encode(), b""
    )
    assert (b"\n  " in quick.get_data()) is (compact is False)


def test_channels_outside_namespaces_and_an_origin_are_published_there_too(publishing):
    whole, flask_side, counter, keys = publishing
    for channel in ("broadcast", "user:u1"):
        body = {"channel": channel, "event": "note"}
        quick = post(whole, keys["anywhere"], body, Origin="https://shop.example")
        assert counter.calls == 0, channel
        same_answer(quick, post(flask_side, keys["anywhere"], body, Origin="https://shop.example"))
        assert quick.headers["Access-Control-Allow-Origin"] == "https://shop.example"


REFUSED = [
    ("anywhere", "{not json", "application/json", 400),
    ("anywhere", "[1]", "application/json", 400),
    ("anywhere", {"channel": "orders:o1"}, "application/json", 400),
    ("anywhere", {"channel": "orders:o1", "event": "x" * 200}, "application/json", 422),
    ("anywhere", {"channel": "orders:o1", "event": 5}, "application/json", 400),
    ("anywhere", {"channel": "orders:o1", "event": "x"}, "text/plain", 415),
    ("anywhere", {"channel": "nowhere:o1", "event": "x"}, "application/json", 404),
    ("anywhere", {"channel": "webhooks:o1", "event": "x"}, "application/json", 404),
    ("anywhere", {"channel": "orders:o1", "event": "presence.join"}, "application/json", 422),
    ("orders", {"channel": "broadcast", "event": "x"}, "application/json", 403),
    ("no scope", {"channel": "orders:o1", "event": "x"}, "application/json", 403),
    ("ak_unknown", {"channel": "orders:o1", "event": "x"}, "application/json", 401),
]


@pytest.mark.parametrize(
    "key_name, body, content_type, status", REFUSED, ids=[f"{r[3]}-{n}" for n, r in enumerate(REFUSED)]
)
def test_every_refusal_is_the_views_own_answer_and_publishes_nothing(
    publishing, rdb, key_name, body, content_type, status
):
    whole, flask_side, counter, keys = publishing
    key = keys.get(key_name, key_name)
    before = rdb.xlen(Keys.stream("orders:o1"))
    quick = post(whole, key, body, content_type)
    assert counter.calls == 1  # handed to Flask
    view = post(flask_side, key, body, content_type)
    same_answer(quick, view)
    assert quick.status_code == status and quick.get_json() == view.get_json()
    assert rdb.xlen(Keys.stream("orders:o1")) == before


def test_a_users_token_and_a_body_of_unknown_length_go_to_flask(publishing, auth):
    whole, _, counter, keys = publishing
    token = auth.new_user_tokens()["access_token"]
    calls = counter.calls
    assert post(whole, token, {"channel": "orders:o1", "event": "x"}).status_code == 403  # server-only namespace
    assert counter.calls == calls + 1
    calls = counter.calls
    whole.post(
        "/events",
        input_stream=io.BytesIO(b'{"channel":"orders:o1","event":"x"}'),
        headers={"Authorization": f"Bearer {keys['anywhere']}", "Content-Type": "application/json",
                 "Transfer-Encoding": "chunked"},
    )  # fmt: skip
    assert counter.calls == calls + 1  # Flask reads (or refuses) a chunked body itself


def test_an_error_met_while_publishing_is_answered_by_the_view_and_the_event_is_not_published_twice(
    make_app, rdb, redis_mode
):
    """A replicated publication that no replica confirms (one Redis, no replica): 503, once in the history. The
    test cluster has replicas: there it is confirmed, and published here."""
    app = make_app(EVENT_DURABILITY="replicated")
    quick = quick_publisher(app)
    counter = quick.wsgi_app = CountingApp(quick.wsgi_app)
    with app.app_context():
        put_namespace(rdb, Namespace("orders", "authenticated"))
        key = create_key("anywhere", ["events:publish"], ["*"])[0]
    answer = post(app.test_client(), key, {"channel": "orders:o1", "event": "x"})
    if redis_mode == "cluster":
        assert answer.status_code == 201 and counter.calls == 0
        assert rdb.xlen(Keys.stream("orders:o1")) == 1
        return
    assert answer.status_code == 503 and answer.get_json()["error"]["code"] == "unavailable"
    assert answer.headers["Retry-After"] == "1"
    assert counter.calls == 1  # the view answered what the quick publisher met
    assert rdb.xlen(Keys.stream("orders:o1")) == 1


def scripts_run(rdb) -> int:
    """Scripts the (one) Redis has run so far."""
    return rdb.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0)


def test_a_key_known_here_publishes_in_one_step_which_refuses_once_the_key_or_namespace_is_gone(
    publishing, rdb, redis_mode
):
    """A key verified once is kept (its scopes and channels never change); whether it, and the namespace, still
    exist is asked in the publication's own step, so deleting either stops the very next publication here."""
    whole, flask_side, counter, keys = publishing
    quick = quick_publisher(whole.application)
    with whole.application.app_context():
        spare = create_key("spare", ["events:publish"], ["orders:*"])
    body = {"channel": "orders:o3", "event": "paid"}
    for _ in range(2):
        assert post(whole, spare[0], body).status_code == 201
    assert counter.calls == 0
    known = redis_mode == "standalone"  # on a cluster (or replicated) every publication verifies its key
    assert bool(quick.known_keys) is known

    rdb.hset(Keys.api_key(hash_key(spare[0])), "last_used_at", "1.000")
    before = scripts_run(rdb)
    assert post(whole, spare[0], body).status_code == 201  # known: touched in the publication's step
    if known:
        assert scripts_run(rdb) - before == 1  # the publication's: no verification of its own
    assert float(rdb.hget(Keys.api_key(hash_key(spare[0])), "last_used_at")) > 1000
    assert post(whole, spare[0], {"channel": "broadcast", "event": "x"}).status_code == 403  # not its channel
    assert counter.calls == 1

    with whole.application.app_context():
        delete_namespace(rdb, "orders")
    published = rdb.xlen(Keys.stream("orders:o3"))
    assert post(whole, spare[0], body).status_code == 404
    with whole.application.app_context():
        put_namespace(rdb, Namespace("orders", "authenticated"))
    assert post(whole, spare[0], body).status_code == 201
    assert bool(quick.known_keys) is known  # verified again after the refusal
    with whole.application.app_context():
        delete_key(spare[1]["id"])
    assert post(whole, spare[0], body).status_code == 401
    assert rdb.xlen(Keys.stream("orders:o3")) == published + 1
    assert counter.calls == 3  # each refusal answered by the view
