"""Behind real nginx (Debian's, rendered from nginx/default.conf.template) in front of real gunicorn."""

from __future__ import annotations

import http.server
import json
import signal
import threading
import time

import pytest
import requests

from app import create_app
from app.apikeys.store import create_key
from scripts.nginx_config import TEMPLATE
from tests.events.clients import SSE, Api, open_connections, open_ws, ws_json
from tests.events.conftest import FAST
from tests.servers import LiveServer, NginxServer, RedisServer, free_port, wait_until

pytestmark = pytest.mark.not_on_cluster("tests nginx in front of gunicorn, and starts its own redis-server")


@pytest.fixture(scope="module")
def app_server(base_env, tmp_path_factory):
    live = LiveServer({**base_env, **FAST}, workers=2, log_path=tmp_path_factory.mktemp("app") / "gunicorn.log")
    live.start()
    yield live
    live.stop()


@pytest.fixture(scope="module")
def proxy(app_server, tmp_path_factory):
    nginx = NginxServer(tmp_path_factory.mktemp("nginx"), [f"127.0.0.1:{app_server.port}"])
    nginx.start()
    yield nginx
    nginx.stop()


# An event passed on at once arrives within this many seconds, with room for a loaded machine (one took 0.22 s with
# three test processes on two cores); a buffering proxy holds it past the 1 s patience, so never within it.
AT_ONCE = 0.5


def stream_latencies(base: str, user: Api, count: int = 20, patience: float = 1.0) -> list[float]:
    """Publish `count` events one after another, each once the previous arrived; their delays.

    The client offers gzip, as browsers do, so a proxy that compresses (and so buffers) the stream shows.
    """
    try:
        stream = SSE(base, {**user.auth, "Accept-Encoding": "gzip"}, timeout=patience + 1)
    except TimeoutError:
        return [float("inf")]  # not even the response headers came through
    try:
        stream.next(skip_comments=False)
        delays = []
        for n in range(count):
            published_at = time.monotonic()
            user.publish_ok({"n": n})
            try:
                stream.next_event(timeout=patience)
                delays.append(time.monotonic() - published_at)
            except TimeoutError:
                delays.append(float("inf"))
                break
        return delays
    finally:
        stream.close()


def test_rendered_template_passes_nginx_t(proxy):
    result = proxy.check()
    assert result.returncode == 0, result.stderr
    assert "test is successful" in result.stderr


def test_template_has_only_the_two_placeholders():
    text = TEMPLATE.read_text()
    import re

    assert set(re.findall(r"\$\{(\w+)\}", text)) == {"NGINX_PORT", "APP_UPSTREAM"}


def test_every_sse_event_arrives_through_nginx_at_once(proxy):
    user = Api(proxy.url)
    delays = stream_latencies(proxy.url, user)
    assert len(delays) == 20 and max(delays) < AT_ONCE, delays


def test_a_buffering_proxy_would_delay_events_so_this_test_can_fail(app_server, tmp_path):
    # The usual mistakes: buffering left on (and the app's X-Accel-Buffering ignored), and gzip for
    # text/event-stream, which holds messages until its buffer fills.
    buffering = (
        TEMPLATE.read_text()
        .replace("proxy_buffering off;", "proxy_buffering on; proxy_ignore_headers X-Accel-Buffering;")
        .replace("gzip off;", "gzip on; gzip_types text/event-stream; gzip_min_length 0;")
    )
    nginx = NginxServer(tmp_path, [f"127.0.0.1:{app_server.port}"], site=buffering)
    nginx.start()
    try:
        delays = stream_latencies(nginx.url, Api(nginx.url), patience=1.0)
        assert max(delays) >= AT_ONCE, delays
    finally:
        nginx.stop()


def test_heartbeats_pass_through_nginx(proxy):
    user = Api(proxy.url)
    stream = SSE(proxy.url, user.auth)
    try:
        stream.next(skip_comments=False)
        assert stream.next(timeout=3, skip_comments=False) == {"comment": ["ping"]}
    finally:
        stream.close()


def test_websocket_upgrade_through_nginx_carries_frames_both_ways(proxy):
    user = Api(proxy.url)
    ws = open_ws(proxy.url, user.auth)
    try:
        assert ws_json(ws)["type"] == "welcome"
        ws.send(json.dumps({"type": "ping"}))
        assert ws_json(ws) == {"type": "pong"}
        event_id = user.publish_ok({"via": "nginx"})
        assert ws_json(ws)["id"] == event_id
    finally:
        ws.close()


def test_long_poll_is_held_and_answered_through_nginx(proxy, app_server):
    user = Api(proxy.url)
    cursor = user.current_cursor()
    answer = {}
    waiter = threading.Thread(target=lambda: answer.update(response=user.wait(cursor, timeout=10)))
    started = time.monotonic()
    waiter.start()
    wait_until(lambda: open_connections(app_server.url, "long_poll") >= 1, message="the long poll to be held")
    assert waiter.is_alive()  # held, not answered at once
    Api(proxy.url, email=user.email).publish_ok({"held": True})
    waiter.join(10)
    assert answer["response"].status_code == 200
    assert answer["response"].json()["events"][0]["data"] == {"held": True}
    assert time.monotonic() - started < 5


def test_forwarded_scheme_host_and_address_reach_the_app(proxy, app_server):
    request_id = f"forward-check-{time.monotonic_ns()}"
    spoofed = {"X-Forwarded-For": "203.0.113.66", "X-Forwarded-Host": "evil.example", "X-Request-ID": request_id}
    response = requests.get(f"{proxy.url}/healthz", headers=spoofed)
    assert response.headers["X-Request-ID"] == request_id

    def logged():
        for line in app_server.log_path.read_text().splitlines():
            if request_id in line and line.startswith("{"):
                return json.loads(line)
        return None

    line = wait_until(logged, message="access log line")
    assert line["host"] == f"127.0.0.1:{proxy.port}" and line["scheme"] == "http"
    assert line["remote_addr"] == "127.0.0.1"  # nginx's view of the client, not the spoofed header
    assert line["path"] == "/healthz" and line["status"] == 200 and line["duration_ms"] >= 0

    # Same-origin check: the Origin the browser sends through nginx matches the host the app sees.
    browser = requests.Session()
    user = Api(proxy.url)
    cookie = {"Cookie": f"__Host-access={user.access_token}"}
    own = browser.post(f"{proxy.url}/auth/logout-all", headers={**cookie, "Origin": proxy.url})
    assert own.status_code == 204


def test_publications_through_nginx_are_logged_as_gunicorn_logs_a_request(proxy, app_server, base_env):
    """A backend's publications through nginx's kept-alive upstream connections are read by the worker itself
    (quick_http.py), all but a connection's first: their access lines name the client, scheme and host as the
    line of a request gunicorn read (a health check's) does, forwarded headers and all."""
    app = create_app(dict(base_env))
    with app.app_context():
        key = create_key("nginx publisher", ["events:publish"], ["*"])[0]
    tag = f"quick-{time.monotonic_ns()}"
    spoofed = {"X-Forwarded-For": "203.0.113.66", "X-Forwarded-Host": "evil.example"}
    backend = requests.Session()
    for n in range(6):
        answer = backend.post(
            f"{proxy.url}/events",
            json={"channel": "broadcast", "event": "note"},
            headers={**spoofed, "Authorization": f"Bearer {key}", "X-Request-ID": f"{tag}-{n}"},
        )
        assert answer.status_code == 201 and answer.headers["X-Request-ID"] == f"{tag}-{n}"
    assert requests.get(f"{proxy.url}/healthz", headers={**spoofed, "X-Request-ID": f"{tag}-health"}).ok

    def logged():
        lines = [json.loads(line) for line in app_server.log_path.read_text().splitlines() if tag in line]
        return lines if len(lines) == 7 else None

    lines = wait_until(logged, message="seven access lines")
    seen = {(line["remote_addr"], line["scheme"], line["host"]) for line in lines}
    assert seen == {("127.0.0.1", "http", f"127.0.0.1:{proxy.port}")}
    assert sorted(line["status"] for line in lines) == [200] + [201] * 6


def test_metrics_are_prometheus_text_summed_over_workers_on_the_service_port_only(proxy, app_server):
    user = Api(proxy.url)
    for n in range(4):
        user.publish_ok({"n": n})
    hidden = requests.get(f"{proxy.url}/metrics")
    assert hidden.status_code == 404 and hidden.json()["error"]["code"] == "not_found"
    text = requests.get(f"{app_server.url}/metrics").text
    published = [line for line in text.splitlines() if line.startswith("rt_events_published_total")]
    assert published and float(published[0].split()[-1]) >= 4
    assert 'auth_logins_total{result="success"}' in text
    assert "http_request_duration_seconds_bucket" in text


def test_nginx_does_not_announce_its_version(proxy):
    for path in ("/healthz", "/metrics", "/no/such/page"):
        server = requests.get(f"{proxy.url}{path}").headers.get("Server", "")
        assert server in ("", "nginx"), server


def test_a_body_over_the_limit_is_refused_by_nginx_in_the_apps_json_shape(proxy, app_server):
    over = b"x" * (1024 * 1024 + 1)  # past the app's largest body (webhooks), and nginx's client_max_body_size
    for base in (app_server.url, proxy.url):  # the app's own answer, then nginx's, which must look the same
        answer = requests.post(f"{base}/auth/login", data=over, headers={"Content-Type": "application/json"})
        assert answer.status_code == 413, (base, answer.text)
        assert answer.headers["Content-Type"].startswith("application/json"), (base, answer.text)
        assert answer.json()["error"]["code"] == "payload_too_large"


def test_no_answer_from_gunicorn_is_a_json_503_to_retry(tmp_path):
    nginx = NginxServer(tmp_path, [f"127.0.0.1:{free_port()}"])  # nothing listens there
    nginx.start()
    try:
        for method, path in (("GET", "/auth/me"), ("POST", "/auth/login"), ("GET", "/events/stream")):
            answer = requests.request(method, f"{nginx.url}{path}", json={} if method == "POST" else None)
            assert answer.status_code == 503, (path, answer.status_code, answer.text)
            assert answer.json()["error"]["code"] == "unavailable"
            assert answer.headers["Retry-After"] == "1"
    finally:
        nginx.stop()


class KeepAliveUpstream(http.server.BaseHTTPRequestHandler):
    """Stands in for gunicorn: answers every request completely and keeps the connection open, noting each
    request's upstream connection (nginx's source port) and Connection header."""

    protocol_version = "HTTP/1.1"

    def do_GET(self):
        self.server.seen.append((self.client_address[1], self.path, self.headers.get("Connection", "")))
        event_stream = self.path == "/events/stream"
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream" if event_stream else "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        body = b": stream open\n\n"
        self.wfile.write(b"%x\r\n%b\r\n0\r\n\r\n" % (len(body), body))  # a whole stream: opened, then ended

    do_POST = do_GET

    def log_message(self, *args):
        pass


def test_nginx_never_reuses_a_streams_upstream_connection(tmp_path):
    """A worker closes a stream's connection just after its last chunk; nginx must not send the next request
    on it (a POST there fails with a 502 when the close wins the race), while other requests reuse theirs."""
    upstream = http.server.ThreadingHTTPServer(("127.0.0.1", 0), KeepAliveUpstream)
    upstream.seen = []
    threading.Thread(target=upstream.serve_forever, daemon=True).start()
    nginx = NginxServer(tmp_path, [f"127.0.0.1:{upstream.server_address[1]}"])
    nginx.start()
    try:
        with requests.Session() as client:
            for path in ("/healthz", "/auth/me", "/events/stream", "/auth/login"):
                method = "POST" if path == "/auth/login" else "GET"
                assert client.request(method, f"{nginx.url}{path}").status_code == 200
        (healthz, _, healthz_header), (me, _, _), (stream, _, stream_header), (login, _, _) = upstream.seen
        assert me == healthz and healthz_header == ""  # an ordinary request's connection is reused
        assert stream_header == "close" and login != stream  # a stream's is not
    finally:
        nginx.stop()
        upstream.shutdown()
        upstream.server_close()


# Scale-out and restarts


def follow_with_reconnect(base: str, user: Api, last_id: str, count: int, timeout: float = 20) -> list[str]:
    """Read events as a client would: when the stream ends, reconnect with Last-Event-ID."""
    received, deadline = [], time.monotonic() + timeout
    while len(received) < count and time.monotonic() < deadline:
        try:
            stream = SSE(base, {**user.auth, "Last-Event-ID": last_id})
        except OSError:
            time.sleep(0.1)
            continue
        if stream.status != 200:
            time.sleep(0.1)
            continue
        try:
            while len(received) < count:
                frame = stream.next_event(timeout=max(0.1, min(3, deadline - time.monotonic())))
                received.append(frame["data"]["id"])
                last_id = frame["id"]
        except TimeoutError:
            pass
        finally:
            stream.close()
    return received


@pytest.fixture
def two_instances(app_server, base_env, tmp_path):
    """A new instance of one worker, and the module's: nginx spreads over both (the new one may be stopped)."""
    own = LiveServer({**base_env, **FAST}, workers=1, log_path=tmp_path / "app.log")
    own.start()
    instances = [own, app_server]
    nginx = NginxServer(tmp_path / "nginx", [f"127.0.0.1:{live.port}" for live in instances])
    nginx.start()
    yield instances, nginx
    nginx.stop()
    own.stop()


def test_scale_out_two_instances_behind_one_upstream(two_instances):
    (a, b), nginx = two_instances
    user = Api(nginx.url)
    stream = SSE(a.url, user.auth)
    stream.next(skip_comments=False)
    user.base = b.url
    through_b = user.publish_ok({"via": "b"})
    first = stream.next_event()
    assert first["data"]["id"] == through_b  # streamed from A, published through B
    stream.close()

    user.base = nginx.url
    streams_through_nginx = SSE(nginx.url, user.auth)
    streams_through_nginx.next(skip_comments=False)
    a.stop()  # one instance goes away; nginx sends new connections to the other
    streams_through_nginx.close()
    missed = [publish_retrying(user, {"n": n}) for n in range(20)]
    assert follow_with_reconnect(nginx.url, user, first["id"], 20) == missed


def publish_retrying(user: Api, data) -> str:
    """Publish as a client does: a 503 "retry shortly" is tried again. nginx may have sent the first POST
    on a kept-alive connection to the instance that went away, and it does not resend a POST elsewhere;
    nothing was published by it, since that instance had stopped."""
    for _ in range(5):
        response = user.publish(data)
        if response.status_code != 503:
            break
    assert response.status_code == 201, response.text
    return response.json()["id"]


def test_shutdown_with_open_streams_loses_nothing(base_env, tmp_path):
    # nginx's idle upstream keep-alives hold a worker's graceful stop for all of graceful_timeout: a short one
    # here, and the stream must end well before it (below), so it is the shutdown hook that ends it.
    graceful = {"GRACEFUL_TIMEOUT": "4"}
    app = LiveServer({**base_env, **FAST, **graceful}, workers=1, log_path=tmp_path / "app.log")
    app.start()
    replacement = None
    nginx = NginxServer(tmp_path / "nginx", [f"127.0.0.1:{app.port}"])
    nginx.start()
    try:
        user = Api(nginx.url)
        publisher = Api(nginx.url, email=user.email)  # logged in before: a POST during the switch may fail
        stream = SSE(nginx.url, user.auth)
        first_id = user.publish_ok({"n": "first"})
        first = stream.next_event()
        assert first["data"]["id"] == first_id
        app.signal(signal.SIGTERM)
        assert stream.closed.wait(3)  # ended promptly by the worker's shutdown, not by its kill at 4 s
        app.process.wait(15)  # the same port comes back, as a process manager would restart it
        replacement = LiveServer({**base_env, **FAST, **graceful}, workers=1, log_path=tmp_path / "app-2.log")
        replacement.port = app.port
        replacement.env["PORT"] = str(app.port)
        replacement.start()
        missed = [wait_until(lambda n=n: _publish(publisher, n), message="publish") for n in range(10)]
        assert follow_with_reconnect(nginx.url, user, first["id"], 10) == missed
    finally:
        nginx.stop()
        app.stop()
        if replacement:
            replacement.stop()


def test_a_reload_keeps_streams_through_nginx_open_and_loses_nothing(proxy, app_server):
    """On the module's server, which a reload leaves as it was (two new workers)."""
    user = Api(proxy.url)
    stream = SSE(proxy.url, user.auth)
    try:
        first_id = user.publish_ok({"n": "first"})
        assert stream.next_event()["data"]["id"] == first_id
        old = set(app_server.worker_pids())
        app_server.signal(signal.SIGHUP)
        wait_until(
            lambda: len(set(app_server.worker_pids()) - old) == 2 and not old & set(app_server.worker_pids()),
            timeout=30,
        )
        # The old workers are gone; the stream, carried over to a new one, goes on on the same connection.
        published = [wait_until(lambda n=n: _publish(user, n), message="publish") for n in range(10)]
        assert [event["data"]["id"] for event in stream.events(10, timeout=20)] == published
        assert not stream.closed.is_set() and stream.raw.count(": stream open") == 1
    finally:
        stream.close()  # nginx's graceful stop would wait for it


def _publish(user: Api, n: int) -> str | None:
    response = user.publish({"n": n})
    return response.json()["id"] if response.status_code == 201 else None


def test_readyz_follows_redis_and_the_service_recovers_by_itself(base_env, tmp_path):
    redis_server = RedisServer(tmp_path, persistent=True)
    redis_server.start()
    app = LiveServer({**base_env, "REDIS_URL": redis_server.url}, workers=1, log_path=tmp_path / "app.log")
    app.start()
    try:
        assert requests.get(f"{app.url}/readyz").status_code == 200
        user = Api(app.url)
        redis_server.stop()
        down = requests.get(f"{app.url}/readyz")
        assert down.status_code == 503 and down.json()["error"]["code"] == "unavailable"
        assert requests.get(f"{app.url}/healthz").status_code == 200  # alive, just not ready
        assert requests.get(f"{app.url}/auth/me", headers=user.auth).status_code == 503
        redis_server.start()
        wait_until(lambda: requests.get(f"{app.url}/readyz").status_code == 200, timeout=15, message="ready again")
        assert requests.get(f"{app.url}/auth/me", headers=user.auth).status_code == 200
    finally:
        app.stop()
        redis_server.stop()


def test_oversize_chunked_json_is_413_not_a_parse_error(app_server):
    def chunks():  # no Content-Length, as a streaming client sends it
        for _ in range(70):
            yield b"x" * 1024

    response = requests.post(
        f"{app_server.url}/auth/login", data=chunks(), headers={"Content-Type": "application/json"}
    )
    assert response.status_code == 413
    assert response.json()["error"]["code"] == "payload_too_large"
