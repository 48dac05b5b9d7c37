"""The browser page and its reference client, proved in real Chromium behind nginx."""

from __future__ import annotations

import contextlib
import http.server
import json
import threading
import time
import uuid
from datetime import UTC, datetime, timedelta

import pytest
import requests
from playwright.sync_api import expect

from tests.browser.conftest import Stack
from tests.chromium import INSECURE_HOST
from tests.conftest import Cli
from tests.events.clients import Api
from tests.servers import free_port
from tests.utils import DEFAULT_PASSWORD, random_email

pytestmark = pytest.mark.not_on_cluster("the browser page: a UI test, no Redis logic of its own")

# transport: (its radio button's label, the words the page uses for it)
TRANSPORTS = {
    "sse": ("Server-sent events", "server-sent events"),
    "websocket": ("WebSocket", "WebSocket"),
    "long-poll": ("Long polling", "long polling"),
    "poll": ("Polling", "polling"),
}


def register(base: str) -> str:
    email = random_email()
    assert requests.post(f"{base}/auth/register", json={"email": email, "password": DEFAULT_PASSWORD}).ok
    return email


def log_in(page, base: str, email: str):
    page.goto(base + "/")
    page.get_by_label("E-mail", exact=True).fill(email)
    page.get_by_label("Password", exact=True).fill(DEFAULT_PASSWORD)
    page.get_by_role("button", name="Log in", exact=True).click()
    expect(page.locator("#status")).to_have_text(f"Logged in as {email}")
    expect(page.locator("#connection")).to_have_attribute("data-state", "live")


def choose_transport(page, transport: str) -> None:
    label, words = TRANSPORTS[transport]
    page.get_by_role("radio", name=label, exact=True).check()
    expect(page.locator("#connection")).to_have_text(f"Live ({words})")


def expect_newest_event(page, name: str, data: str, timeout: float = 5000) -> None:
    newest = page.locator("#event-log li").first
    expect(newest.locator(".name")).to_have_text(name, timeout=timeout)
    expect(newest.locator(".data")).to_have_text(data)


def logged_out(page, timeout: float = 2000):
    expect(page.locator("#status")).to_contain_text("logged out", timeout=timeout)


def events_in(page) -> list[str]:
    """Newest first, as `name: data`."""
    return page.locator("#event-log li").evaluate_all(
        "items => items.map((li) => `${li.dataset.event}: ${li.querySelector('.data').textContent}`)"
    )


def test_page_is_served_with_a_strict_policy(stack):
    response = requests.get(stack.url + "/")
    assert response.status_code == 200 and response.headers["Content-Type"].startswith("text/html")
    policy = response.headers["Content-Security-Policy"]
    assert "script-src 'self'" in policy and "unsafe-inline" not in policy and "frame-ancestors 'none'" in policy
    assert response.headers["X-Content-Type-Options"] == "nosniff"
    assert response.headers["Referrer-Policy"] == "no-referrer"
    assert response.headers["X-Frame-Options"] == "DENY"
    assert "<script>" not in response.text  # no inline script
    assert 'type="module"' in response.text


def test_events_published_through_the_api_and_from_the_cli_appear_on_each_transport(stack, module_cli, new_context):
    """On each transport: an event to the user's channel through the HTTP API, then one from the CLI to
    `broadcast` under a name no code has seen; each shows exactly once, in order, across the switches."""
    page = new_context().new_page()
    email = register(stack.url)
    log_in(page, stack.url, email)
    publisher = Api(stack.url, email=email)
    shown = []
    for transport in TRANSPORTS:
        choose_transport(page, transport)
        publisher.publish_ok(f"via {transport}", event="note")
        expect_newest_event(page, "note", f'"via {transport}"')
        name = f"order.paid.{transport}.{uuid.uuid4().hex[:8]}"
        publish_from_cli(module_cli, name, {"via": transport})
        expect_newest_event(page, name, json.dumps({"via": transport}, separators=(",", ":")))
        expect(page.locator("#event-log li .channel").first).to_have_text("broadcast")
        shown += [f'note: "via {transport}"', f'{name}: {{"via":"{transport}"}}']
    assert events_in(page)[::-1] == shown


def test_two_devices_see_each_other_reach_each_other_and_log_out_everywhere(stack, new_context):
    email = register(stack.url)
    phone, laptop = new_context().new_page(), new_context().new_page()
    log_in(phone, stack.url, email)
    log_in(laptop, stack.url, email)
    for page in (phone, laptop):
        expect(page.locator("#sessions li")).to_have_count(2)
        expect(page.locator("#sessions li.current")).to_have_count(1)
    laptop.get_by_label("Message to your other devices").fill("hello from the laptop")
    laptop.get_by_role("button", name="Publish").click()
    expect_newest_event(phone, "note", '"hello from the laptop"')
    phone.get_by_role("button", name="Log out everywhere").click()
    logged_out(phone)
    logged_out(laptop, timeout=2000)  # ended elsewhere: the page says so within two seconds


def test_ending_one_session_from_the_other_logs_out_only_that_one_on_each_transport(stack, new_context):
    """One device (on server-sent events) ends, in turn, another device's session on each transport; the
    devices on the other transports stay logged in until their turn."""
    email = register(stack.url)
    keeper = new_context().new_page()
    log_in(keeper, stack.url, email)
    publisher = Api(stack.url, email=email)
    # Every other device logs in first, so the keeper's device list (refreshed every few seconds) is waited
    # for once, not once per transport.
    devices = {}
    for transport in TRANSPORTS:
        page = new_context().new_page()
        log_in(page, stack.url, email)
        choose_transport(page, transport)
        current = page.locator("#sessions li.current")
        expect(current).to_have_count(1)
        devices[transport] = (page, current.get_attribute("data-session-id"))
    # The keeper's, the publisher's and each device's
    expect(keeper.locator("#sessions li")).to_have_count(2 + len(devices), timeout=15_000)
    remaining = dict(devices)
    for transport, (ended, session_id) in devices.items():
        del remaining[transport]
        keeper.locator(f'#sessions li[data-session-id="{session_id}"]').get_by_role("button", name="End").click()
        logged_out(ended, timeout=2000)
        expect(keeper.locator("#status")).to_have_text(f"Logged in as {email}")
        publisher.publish_ok(f"still here after {transport}", event="note")
        expect_newest_event(keeper, "note", f'"still here after {transport}"')
        expect(ended.locator("#connection")).to_have_attribute("data-state", "offline")
        expect(keeper.locator("#sessions li")).to_have_count(2 + len(remaining))
        for other, _ in remaining.values():
            expect(other.locator("#status")).to_have_text(f"Logged in as {email}")


@pytest.mark.parametrize("web_locks", [True, False], ids=["web-locks", "without-web-locks"])
def test_two_tabs_refreshing_at_the_same_moment_stay_logged_in(stack, new_context, web_locks):
    context = new_context()
    if not web_locks:  # as in a browser without the Web Locks API: the BroadcastChannel fallback
        context.add_init_script("delete Navigator.prototype.locks")
    first, second = context.new_page(), context.new_page()
    email = register(stack.url)
    log_in(first, stack.url, email)
    assert first.evaluate("'locks' in navigator") is web_locks
    second.goto(stack.url + "/")
    expect(second.locator("#status")).to_have_text(f"Logged in as {email}")
    context.clear_cookies(name="__Host-access")  # as if the access token had just expired
    # Both tabs start their refresh on one message, at the same moment: unserialised, both would present
    # the same refresh token, and the second would end the session as a token thief's.
    for page in (first, second):
        page.evaluate(
            """() => { window.refreshed = new Promise((resolve) => {
                new BroadcastChannel("test-go").onmessage = () => resolve(window.authRt.client.refresh());
            }); }"""
        )
    first.evaluate("new BroadcastChannel('test-go').postMessage('go')")
    assert first.evaluate("window.refreshed") is True
    assert second.evaluate("window.refreshed") is True
    for page in (first, second):
        assert page.evaluate("window.authRt.client.request('/auth/me').then((r) => r.status)") == 200
        expect(page.locator("#status")).to_have_text(f"Logged in as {email}")


@pytest.fixture
def short_token_stack(base_env, tmp_path):
    """A stack whose access tokens live 2 s, on one worker: neither the refresh nor the stream's resumption
    depends on which worker answers. Asked for before `new_context`, so it stops after the test's pages are
    closed: a stream still open through nginx would hold up its graceful stop."""
    stack = Stack(base_env, tmp_path, workers=1, ACCESS_TOKEN_TTL_SECONDS="2").start()
    yield stack
    stack.stop()


def test_expired_access_token_is_refreshed_and_the_stream_resumes_without_loss(short_token_stack, new_context):
    stack = short_token_stack
    page = new_context().new_page()
    email = register(stack.url)
    log_in(page, stack.url, email)
    publisher = Api(stack.url, email=email)
    sent = []
    deadline = time.monotonic() + 5  # past two expiries of the page's access token
    while time.monotonic() < deadline:
        if publisher.publish(f"n{len(sent)}", event="note").status_code == 401:
            publisher.login()  # the publisher's own short token expired too
            continue
        sent.append(f'note: "n{len(sent)}"')
        time.sleep(0.25)
    expect(page.locator("#event-log li")).to_have_count(len(sent), timeout=10_000)
    assert events_in(page)[::-1] == sent  # every event, once, in order
    expect(page.locator("#status")).to_have_text(f"Logged in as {email}")


EVIL_PAGE = """<!doctype html><html><body>
<form id="forged" method="post" action="{target}/auth/logout-all"></form>
<script>
window.result = {{ fetchStatus: null, wsOpened: false, wsClosed: false }};
fetch("{target}/auth/logout-all", {{ method: "POST", credentials: "include", mode: "no-cors" }})
  .then((r) => {{ window.result.fetchStatus = r.type; }}, () => {{ window.result.fetchStatus = "error"; }});
const ws = new WebSocket("{ws_target}/ws");
ws.onopen = () => {{ window.result.wsOpened = true; }};
ws.onclose = () => {{ window.result.wsClosed = true; }};
</script></body></html>"""


@contextlib.contextmanager
def static_page(body: bytes, content_type: str, port: int):
    """One page served at http://127.0.0.1:<port>/ from a thread, while the block runs."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - the http.server interface
            self.send_response(200)
            self.send_header("Content-Type", content_type)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def foreign_site(stack):
    """A page on another origin (a second loopback port) that attacks the service."""
    body = EVIL_PAGE.format(target=stack.url, ws_target=stack.url.replace("http://", "ws://")).encode()
    with static_page(body, "text/html", free_port()) as url:
        yield url


def test_another_origin_cannot_log_the_user_out_or_open_a_websocket(stack, new_context, foreign_site):
    context = new_context()
    page = context.new_page()
    email = register(stack.url)
    log_in(page, stack.url, email)
    # Same site (127.0.0.1), another origin: SameSite=Strict cookies ARE sent, so the Origin rule must hold.
    evil = context.new_page()
    evil.goto(foreign_site + "/")
    evil.wait_for_function("window.result.wsClosed && window.result.fetchStatus !== null")
    assert evil.evaluate("window.result.wsOpened") is False
    with evil.expect_navigation():
        evil.evaluate("document.getElementById('forged').submit()")
    assert '"csrf_rejected"' in evil.content()
    # And from another site altogether (localhost), where the browser does not even send the cookies.
    other_site = foreign_site.replace("127.0.0.1", "localhost")
    evil.goto(other_site + "/")
    evil.wait_for_function("window.result.wsClosed && window.result.fetchStatus !== null")
    assert evil.evaluate("window.result.wsOpened") is False
    # Nothing changed: the user is still logged in, on the page and on the server.
    assert page.evaluate("window.authRt.client.request('/auth/me').then((r) => r.status)") == 200
    expect(page.locator("#sessions li")).to_have_count(1)
    expect(page.locator("#status")).to_have_text(f"Logged in as {email}")


def test_the_oauth_button_completes_the_flow_and_lands_logged_in(stack, new_context):
    page = new_context().new_page()
    email = random_email()
    page.goto(stack.url + "/")
    page.get_by_role("link", name="Log in with Test").click()
    page.locator('input[name="login"]').fill(email)  # the provider's own development login screen
    page.locator('input[name="password"]').fill("anything")
    page.locator('button[type="submit"]').click()
    page.locator('button[type="submit"]').click()  # its consent screen
    expect(page.locator("#status")).to_have_text(f"Logged in as {email}")
    assert page.url == stack.url + "/"
    expect(page.locator("#sessions li.current")).to_have_count(1)


def publish_from_cli(cli: Cli, event: str, data) -> None:
    """`flask --app wsgi events publish`, as an operator would (in process, on the live server's Redis)."""
    done = cli("events", "publish", "--channel", "broadcast", "--event", event, "--data", json.dumps(data))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "published" in done.stdout


class ErrorCollector:
    """What a page shows in its console as errors, and the answers of 400 or more it received."""

    def __init__(self, page):
        self.errors: list[str] = []
        page.on("console", self._console)
        page.on("response", self._response)
        page.on("requestfailed", lambda request: self.errors.append(f"failed: {request.url} {request.failure}"))
        page.on("pageerror", lambda error: self.errors.append(f"page error: {error}"))

    def _console(self, message):
        if message.type == "error":
            self.errors.append(f"console: {message.text} ({message.location['url']})")

    def _response(self, response):
        if response.status >= 400:
            self.errors.append(f"answer: {response.status} {response.url}")


def visit(context, base: str, status: str) -> ErrorCollector:
    """Open the page in a new tab of `context`, collecting its errors, until it has settled on `status`."""
    page = context.new_page()
    collected = ErrorCollector(page)
    page.goto(base + "/")
    # The status line changes once the session check's requests have all been answered.
    expect(page.locator("#status")).to_have_text(status)
    if status.startswith("Logged in"):  # and then the device list and the event stream
        expect(page.locator("#sessions li.current")).to_have_count(1)
        expect(page.locator("#connection")).to_have_attribute("data-state", "live")
    return collected


def test_no_401_is_logged_on_a_first_visit_nor_on_a_return_with_or_without_an_access_token(stack, new_context):
    # First, that the collector sees what Chromium logs for a 401: a fetch of /auth/me without a session.
    context = new_context()
    probe = context.new_page()
    probe_errors = ErrorCollector(probe)
    probe.goto(stack.url + "/healthz")
    with probe.expect_console_message(lambda message: "status of 401" in message.text):
        assert probe.evaluate("fetch('/auth/me').then((r) => r.status)") == 401
    assert [e for e in probe_errors.errors if e.startswith("answer: 401") and e.endswith("/auth/me")]
    assert [e for e in probe_errors.errors if e.startswith("console:") and "status of 401" in e]

    # A first visit, with no cookie at all: the page learns it is logged out without a single error.
    assert visit(context, stack.url, "You are logged out.").errors == []

    # A return while logged in, and one whose access token expired (the refresh cookie is kept).
    email = register(stack.url)
    log_in(context.pages[1], stack.url, email)
    assert visit(context, stack.url, f"Logged in as {email}").errors == []
    context.clear_cookies(name="__Host-access")
    assert visit(context, stack.url, f"Logged in as {email}").errors == []
    assert any(c["name"] == "__Host-access" for c in context.cookies())  # refreshed, with no 401 first


def test_login_keeps_tokens_from_script_and_the_page_says_what_it_is_and_shows_each_events_details(stack, new_context):
    """The login keeps its tokens in HttpOnly cookies only; the page says what it is, and shows an event's
    time, channel and name; and nothing of it logs an error or a warning."""
    context = new_context()
    page = context.new_page()
    problems = []

    def console(message):
        # Chromium logs every 4xx answer too: the first session check (no cookie yet) must cause none.
        if message.type in ("error", "warning"):
            problems.append(f"{message.text} ({message.location['url']})")

    page.on("console", console)
    page.on("pageerror", lambda error: problems.append(str(error)))
    email = register(stack.url)
    log_in(page, stack.url, email)
    assert page.evaluate("document.cookie") == ""  # HttpOnly: script sees no token
    assert page.evaluate("localStorage.length + sessionStorage.length") == 0
    cookies = {c["name"]: c for c in context.cookies()}
    access, refresh = cookies["__Host-access"], cookies["__Secure-refresh"]
    assert access["httpOnly"] and access["secure"] and access["sameSite"] == "Strict"
    assert refresh["httpOnly"] and refresh["path"] == "/auth"

    expect(page.locator("#about")).to_contain_text("test page")
    icon = page.locator('link[rel="icon"]').get_attribute("href")
    answer = requests.get(stack.url + icon)
    assert answer.status_code == 200 and answer.headers["Content-Type"].startswith("image/svg+xml")
    expect(page.locator("#event-empty")).to_be_visible()
    expect(page.locator("#connection")).to_have_text("Live (server-sent events)")
    # The event-name pattern compiles (with the `v` flag) and validates as the server does.
    name = page.get_by_label("Event name")
    for value, valid in (("order.paid", True), ("a:b_c-d", True), ("bad name!", False), ("é", False)):
        name.fill(value)
        assert name.evaluate("input => input.checkValidity()") is valid, value
    name.fill("order.paid")
    page.get_by_label("Message to your other devices").fill("hello")
    page.get_by_role("button", name="Publish").click()
    newest = page.locator("#event-log li").first
    expect(newest.locator(".name")).to_have_text("order.paid")
    user_id = page.evaluate("window.authRt.client.me().then((user) => user.id)")
    expect(newest.locator(".channel")).to_have_text(f"user:{user_id}")
    expect(newest.locator(".data")).to_have_text('"hello"')
    published = newest.locator("time").get_attribute("datetime")
    assert abs(datetime.fromisoformat(published.replace("Z", "+00:00")) - datetime.now(UTC)) < timedelta(minutes=1)
    expect(newest.locator("time")).not_to_be_empty()
    expect(page.locator("#event-empty")).to_be_hidden()
    assert problems == []


def test_at_an_insecure_address_the_page_says_what_is_wrong_instead_of_hanging(stack, new_context):
    page = new_context().new_page()
    problems = []
    page.on("pageerror", lambda error: problems.append(str(error)))
    port = stack.url.rsplit(":", 1)[1]
    page.goto(f"http://{INSECURE_HOST}:{port}/")  # plain HTTP, not localhost: no secure context
    assert page.evaluate("window.isSecureContext") is False
    assert page.evaluate("'locks' in navigator") is False
    status = page.locator("#status")
    expect(status).to_contain_text("Serve it over HTTPS, or open it at http://localhost:")
    expect(page.locator("#signed-out")).to_be_hidden()
    expect(page.locator("#signed-in")).to_be_hidden()
    assert problems == []


def test_at_an_ip_address_the_page_says_why_passkeys_are_absent_and_where_they_work(stack, new_context):
    """At 127.0.0.1 browsers refuse passkeys (they are tied to a domain name): the page says so, on the log-in
    form and in the account's passkeys, and links to the same page at localhost, where it offers them."""
    port = stack.url.rsplit(":", 1)[1]
    email = register(stack.url)
    page = new_context().new_page()
    page.goto(f"http://127.0.0.1:{port}/")
    note = page.locator("#passkey-login-note")
    expect(note).to_contain_text("browsers tie a passkey to a domain name, never to an IP address such as 127.0.0.1")
    expect(note.get_by_role("link")).to_have_attribute("href", f"http://localhost:{port}/")
    expect(page.get_by_role("button", name="Sign in with a passkey")).to_be_hidden()
    log_in(page, stack.url, email)
    account = page.locator("#passkey-account-note")
    expect(account).to_contain_text("Passkeys are not offered here")
    expect(page.get_by_role("button", name="Add a passkey")).to_be_hidden()

    at_localhost = new_context().new_page()
    at_localhost.goto(f"http://localhost:{port}/")
    expect(at_localhost.get_by_role("button", name="Sign in with a passkey")).to_be_visible()
    expect(at_localhost.locator("#passkey-login-note")).to_be_hidden()


EMBEDDING_PAGE = """<!doctype html><html lang="en"><head><meta charset="utf-8"><title>Another site</title></head>
<body><h1>Another site, using the service's client.js</h1>
<p id="state">offline</p><ol id="events"></ol>
<script type="module">
import {{ Client, EventFeed }} from "{service}/static/client.js";
const client = new Client({{ baseUrl: "{service}", onLoggedOut: () => {{ window.loggedOut = true; }} }});
const feed = new EventFeed(client, {{
  onEvent: (event) => {{
    const item = document.createElement("li");
    item.dataset.event = event.event;
    item.textContent = `${{event.channel}} ${{event.event}} ${{JSON.stringify(event.data)}}`;
    document.getElementById("events").prepend(item);
  }},
  onState: (state, transport) => {{ document.getElementById("state").textContent = `${{state}} ${{transport}}`; }},
}});
window.embedded = {{ client, feed }};
</script></body></html>"""


@pytest.fixture
def embedding_site(stack, embedding_origin):
    """A static page on the origin the stack allows, importing client.js from the service."""
    body = EMBEDDING_PAGE.format(service=stack.url).encode()
    with static_page(body, "text/html; charset=utf-8", int(embedding_origin.rsplit(":", 1)[1])) as url:
        yield url


def test_a_page_on_another_origin_logs_in_with_client_js_and_receives_live_events(stack, new_context, embedding_site):
    context = new_context()
    page = context.new_page()
    errors = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    email = register(stack.url)
    page.goto(embedding_site + "/")
    page.wait_for_function("window.embedded !== undefined")
    assert page.evaluate("window.embedded.client.crossOrigin") is True
    login = f"window.embedded.client.login({{ email: '{email}', password: '{DEFAULT_PASSWORD}', device: 'elsewhere' }})"
    assert page.evaluate(f"{login}.then((user) => user.email)") == email
    assert page.evaluate("document.cookie") == ""  # the service's cookies, HttpOnly: not this page's script's
    publisher = Api(stack.url, email=email)
    for transport in TRANSPORTS:
        page.evaluate(f"window.embedded.feed.start('{transport}')")
        expect(page.locator("#state")).to_have_text(f"live {transport}")
        name = f"webhook.pay.{uuid.uuid4().hex[:8]}"
        publisher.publish_ok({"via": transport}, event=name)
        newest = page.locator("#events li").first
        expect(newest).to_have_text(f'user:{publisher.user_id} {name} {{"via":"{transport}"}}')
    # A cookie-authenticated POST from the allowed origin passes the CSRF rule and arrives back.
    page.evaluate(f"window.embedded.client.publish('user:{publisher.user_id}', 'from.elsewhere', 'hi')")
    expect(page.locator("#events li").first).to_have_text(f'user:{publisher.user_id} from.elsewhere "hi"')
    # With the access token gone, the client refreshes across origins (the refresh cookie, Path=/auth).
    context.clear_cookies(name="__Host-access")
    assert page.evaluate("window.embedded.client.me().then((user) => user && user.email)") == email
    assert page.evaluate("window.loggedOut === undefined")
    assert errors == []


def test_offline_then_online_shows_the_state_and_loses_nothing_on_each_transport(stack, new_context):
    context = new_context()
    page = context.new_page()
    email = register(stack.url)
    log_in(page, stack.url, email)
    publisher = Api(stack.url, email=email)
    shown = []
    for transport in TRANSPORTS:
        choose_transport(page, transport)
        publisher.publish_ok(f"before, {transport}", event="note")
        expect_newest_event(page, "note", f'"before, {transport}"')
        context.set_offline(True)
        # Chromium's offline emulation fails new requests but leaves open streams alone: reconnect, as after a drop.
        page.evaluate("window.authRt.feed.stop(); window.authRt.feed.start(window.authRt.feed.transport)")
        expect(page.locator("#connection")).to_have_attribute("data-state", "offline")
        for n in range(3):
            publisher.publish_ok(f"while offline {n}, {transport}", event="note")
        context.set_offline(False)
        expect(page.locator("#connection")).to_have_attribute("data-state", "live", timeout=10_000)
        shown += [f'note: "before, {transport}"'] + [f'note: "while offline {n}, {transport}"' for n in range(3)]
        expect(page.locator("#event-log li")).to_have_count(len(shown), timeout=10_000)
        assert events_in(page)[::-1] == shown


def test_the_api_reference_renders_every_operation_with_nothing_from_another_origin(stack, new_context):
    page = new_context().new_page()
    refused, foreign = [], []
    page.on("console", lambda message: refused.append(message.text) if message.type == "error" else None)
    page.on("request", lambda request: foreign.append(request.url) if not request.url.startswith(stack.url) else None)
    page.goto(stack.url + "/docs")
    expect(page.locator(".swagger-ui .title")).to_contain_text("auth-rt")
    expect(page.locator(".opblock-summary-path[data-path='/events/batch']")).to_be_visible()
    operations = page.locator(".opblock").count()
    document = requests.get(stack.url + "/openapi.json").json()
    assert operations == sum(len(methods) for methods in document["paths"].values())
    page.locator(".opblock-summary-path[data-path='/auth/login']").click()  # opens: its body is drawn
    expect(page.locator(".opblock.is-open")).to_contain_text("transport")
    assert refused == [] and [url for url in foreign if not url.startswith("data:")] == []
