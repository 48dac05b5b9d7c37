"""A product that already has users, in real Chromium: its page logs in at the product's own OpenID provider
(node-oidc-provider on loopback: authorization code and PKCE, as a public single-page app), and with the
service's client.js exchanges the provider's ID token here (RFC 8693), joins a room its backend granted, sees
who is in it, and is cut off within a second when the backend stops granting."""

from __future__ import annotations

import json
import secrets
import time

import pytest
import requests
from playwright.sync_api import expect

from app import create_app
from app.auth.users import create_user
from tests.browser.conftest import Stack
from tests.browser.test_page import static_page
from tests.servers import OpenIdProvider, free_port
from tests.utils import DEFAULT_PASSWORD, bearer, random_email

pytestmark = pytest.mark.not_on_cluster("a browser test of client.js; exchanges and grants are proved on both modes")

SPA_CLIENT_ID = "product-spa"
ISSUER_NAME = "product"
# Short-lived access tokens, so that the page's client exchanges the ID token again during the test (at
# half the token's life), as it would a minute before the default 15 minutes run out.
ACCESS_TOKEN_TTL = 16
WITHIN = 1.0  # the promise: a revoked grant reaches live connections within a second
BROWSER_MARGIN = 1.0  # what a busy machine adds between the service's notice and the page showing it

PRODUCT_PAGE = """<!doctype html><html lang="en"><head><meta charset="utf-8"><title>The product</title></head>
<body><h1>The product</h1>
<button id="login">Log in with the product's provider</button>
<p id="status">Not logged in</p>
<section id="room" hidden><h2 id="room-state"></h2><ul id="people"></ul><ol id="messages"></ol></section>
<script type="module">
import { Client, EventFeed } from "%SERVICE%/static/client.js";

const provider = await (await fetch("%PROVIDER%/.well-known/openid-configuration")).json();
const redirectUri = `${location.origin}/callback`;
const $ = (id) => document.getElementById(id);
const base64url = (bytes) =>
  btoa(String.fromCharCode(...bytes)).replace(/[+]/g, "-").replace(/[/]/g, "_").replace(/=+$/, "");
let idToken = null; // the product's token: in memory only

// The product's own login: authorization code with PKCE, as a public client.
$("login").onclick = async () => {
  const verifier = base64url(crypto.getRandomValues(new Uint8Array(32)));
  const state = base64url(crypto.getRandomValues(new Uint8Array(16)));
  const digest = await crypto.subtle.digest("SHA-256", new TextEncoder().encode(verifier));
  sessionStorage.setItem("pkce", JSON.stringify({ verifier, state }));
  const authorize = new URL(provider.authorization_endpoint);
  authorize.search = new URLSearchParams({
    client_id: "%CLIENT_ID%", response_type: "code", scope: "openid email", redirect_uri: redirectUri,
    state, code_challenge: base64url(new Uint8Array(digest)), code_challenge_method: "S256",
  });
  location.assign(authorize);
};

async function idTokenFromCallback() {
  const answer = new URLSearchParams(location.search);
  const { verifier, state } = JSON.parse(sessionStorage.getItem("pkce"));
  if (answer.get("state") !== state) throw new Error("state differs");
  history.replaceState(null, "", "/");
  const form = new URLSearchParams({
    grant_type: "authorization_code", code: answer.get("code"), redirect_uri: redirectUri,
    client_id: "%CLIENT_ID%", code_verifier: verifier,
  });
  const tokens = await (await fetch(provider.token_endpoint, { method: "POST", body: form })).json();
  return tokens.id_token;
}

// The service: sessions from the product's token, exchanged again before they would need a refresh. The
// test may choose the tokens' transport and the feed's before logging in.
const mode = JSON.parse(sessionStorage.getItem("mode") ?? '{"tokens": "body", "feed": "sse"}');
const client = new Client({
  baseUrl: "%SERVICE%",
  subjectToken: async () => idToken,
  subjectTokenType: "id_token",
  tokenTransport: mode.tokens,
  onLoggedOut: () => { $("status").textContent = "Logged out"; },
});
const people = new Map();
function showPeople() {
  $("people").replaceChildren(...[...people].map(([id, info]) => {
    const item = document.createElement("li");
    item.dataset.userId = id;
    item.textContent = info && info.name ? info.name : id;
    return item;
  }));
}
const feed = new EventFeed(client, {
  onEvent: (event) => {
    if (event.event !== "message") return;
    const item = document.createElement("li");
    item.textContent = event.data.text;
    $("messages").append(item);
  },
  onJoin: (channel, { user_id, info }) => { people.set(user_id, info); showPeople(); },
  onLeave: (channel, { user_id }) => { people.delete(user_id); showPeople(); },
  onUnsubscribed: (channel, reason) => {
    window.closedAt = Date.now();
    $("room-state").textContent = `Room closed (${reason})`;
    people.clear();
    showPeople();
  },
});

async function join(room) {
  await feed.subscribe(room);
  for (const { user_id, info } of (await client.presence(room)).users) people.set(user_id, info);
  showPeople();
  $("room").hidden = false;
  $("room-state").textContent = `In ${room}`;
}

if (new URLSearchParams(location.search).has("code")) {
  idToken = await idTokenFromCallback();
  const user = await client.exchange({ device: "The product's page" });
  document.body.dataset.userId = user.id;
  $("status").textContent = `Signed in as ${user.external.sub}`;
  feed.start(mode.feed);
}
window.product = { client, feed, join };
</script></body></html>"""


class Backend:
    """The product's backend: trusts its provider here once, and grants its users rooms with an API key."""

    def __init__(self, stack: Stack, base_env: dict, provider: OpenIdProvider):
        self.base = stack.url
        self.email = random_email()
        with create_app(base_env).app_context():
            create_user(self.email, DEFAULT_PASSWORD, role="admin")
        self.namespace = f"rooms-{secrets.token_hex(4)}"
        scopes = ["issuers:manage", "channels:manage", "events:publish"]
        body = {"name": "product backend", "scopes": scopes, "channels": [f"{self.namespace}:*"]}
        key = self.call("POST", "/admin/api-keys", 201, json=body, headers=self.admin()).json()["key"]
        self.key = bearer(key)
        issuer = {
            "issuer": provider.url,
            "audience": SPA_CLIENT_ID,
            "algorithms": ["RS256"],
            "jwks_url": f"{provider.url}/jwks",
        }
        self.call("PUT", f"/admin/issuers/{ISSUER_NAME}", 200, json=issuer)
        rules = {"subscribe": "members", "publish": "server", "presence": True, "join_leave": True}
        rules["presence_diff"] = True  # no per-user join event: a room joined by frame sends nothing at once
        self.call("PUT", f"/admin/namespaces/{self.namespace}", 200, json=rules)

    def admin(self) -> dict:
        """An administrator's headers, freshly logged in (access tokens are short-lived here)."""
        login = {"email": self.email, "password": DEFAULT_PASSWORD, "transport": "body"}
        return bearer(requests.post(f"{self.base}/auth/login", json=login, timeout=10).json()["access_token"])

    def call(self, method: str, path: str, expected: int, headers: dict | None = None, **kwargs):
        answer = requests.request(method, self.base + path, headers=headers or self.key, timeout=10, **kwargs)
        assert answer.status_code == expected, answer.text
        return answer


@pytest.fixture(scope="module")
def product_origin() -> str:
    return f"http://127.0.0.1:{free_port()}"


@pytest.fixture(scope="module")
def provider(tmp_path_factory, product_origin):
    """The product's OpenID provider, with the product's page as a public client."""
    started = OpenIdProvider(tmp_path_factory.mktemp("provider") / "provider.log")
    started.start(f"{product_origin}/unused", spa=(SPA_CLIENT_ID, f"{product_origin}/callback"))
    yield started
    started.stop()


@pytest.fixture(scope="module")
def stack(base_env, tmp_path_factory, product_origin, provider):  # noqa: ARG001 - started before the service
    """The service behind nginx, allowing the product's origin, and its JWKS URL on loopback over HTTP."""
    running = Stack(
        base_env,
        tmp_path_factory.mktemp("product-stack"),
        ALLOWED_ORIGINS=product_origin,
        WEBHOOK_OUT_ALLOW_HTTP="true",
        WEBHOOK_OUT_ALLOW_PRIVATE="true",
        ACCESS_TOKEN_TTL_SECONDS=str(ACCESS_TOKEN_TTL),
    ).start()
    yield running
    running.stop()


@pytest.fixture(scope="module")
def product(stack, provider, product_origin):
    """The product's page, served on its own origin; it imports client.js from the service."""
    page = PRODUCT_PAGE.replace("%SERVICE%", stack.url).replace("%PROVIDER%", provider.url)
    page = page.replace("%CLIENT_ID%", SPA_CLIENT_ID)
    with static_page(page.encode(), "text/html; charset=utf-8", int(product_origin.rsplit(":", 1)[1])) as url:
        yield url


@pytest.fixture(scope="module")
def backend(stack, base_env, provider) -> Backend:
    return Backend(stack, base_env, provider)


def logged_in(new_context, product: str, login: str, unauthorized: list | None = None, mode: dict | None = None):
    """A browser that logs in at the product's provider (its development login and consent screens) and
    comes back to the product's page signed in here: the page and the user's id here. The service's 401
    answers to the page are noted in `unauthorized`; `mode` chooses the transports of tokens and events."""
    page = new_context().new_page()
    errors = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    if unauthorized is not None:
        page.on("response", lambda response: response.status == 401 and unauthorized.append(response.url))
    page.goto(product + "/")
    page.wait_for_function("window.product !== undefined")  # the page's script is ready
    if mode:
        page.evaluate(f"sessionStorage.setItem('mode', {json.dumps(json.dumps(mode))})")
    page.get_by_role("button", name="Log in with the product's provider").click()
    page.locator('input[name="login"]').fill(login)
    page.locator('input[name="password"]').fill("anything")
    page.locator('button[type="submit"]').click()
    page.locator('button[type="submit"]').click()  # consent
    expect(page.locator("#status")).to_have_text(f"Signed in as {login}")
    assert errors == []
    return page, page.locator("body").get_attribute("data-user-id")


def person(page, user_id: str):
    return page.locator(f'#people li[data-user-id="{user_id}"]')


def messages(page):
    return page.locator("#messages li")


def test_a_product_page_joins_a_room_with_its_providers_token_and_is_cut_off_within_a_second(
    backend, product, new_context
):
    unauthorized = []
    ada, ada_id = logged_in(new_context, product, "ada@product.example", unauthorized)
    bob, bob_id = logged_in(new_context, product, "bob@product.example")
    assert ada_id != bob_id
    room = f"{backend.namespace}:design"
    # Not granted yet: the room is refused.
    refused = ada.evaluate(f"window.product.join('{room}').then(() => 'joined', (error) => error.code)")
    assert refused == "forbidden"

    # The product's backend grants its users the room; each page joins and sees itself and the other.
    for user_id, name in ((ada_id, "Ada"), (bob_id, "Bob")):
        backend.call("PUT", f"/channels/{room}/members/{user_id}", 204, json={"info": {"name": name}})
    ada.evaluate(f"window.product.join('{room}')")
    bob.evaluate(f"window.product.join('{room}')")
    for page in (ada, bob):
        expect(page.locator("#room-state")).to_have_text(f"In {room}")
        expect(person(page, ada_id)).to_have_text("Ada")
        expect(person(page, bob_id)).to_have_text("Bob")
    presence = backend.call("GET", f"/channels/{room}/presence", 200).json()
    assert sorted(user["user_id"] for user in presence["users"]) == sorted([ada_id, bob_id])
    members = {user["user_id"]: user for user in presence["users"]}
    assert members[ada_id]["info"] == {"name": "Ada"}

    # The ID token is exchanged again before the access token runs out: a new session replaces the old
    # one, the stream goes on, and nothing published meanwhile is lost.
    first = ada.evaluate("window.product.client.sessionId")
    backend.call("POST", "/events", 201, json={"channel": room, "event": "message", "data": {"text": "one"}})
    ada.wait_for_function(f"window.product.client.sessionId !== {json.dumps(first)}", timeout=ACCESS_TOKEN_TTL * 1000)
    backend.call("POST", "/events", 201, json={"channel": room, "event": "message", "data": {"text": "two"}})
    for page in (ada, bob):
        expect(messages(page)).to_have_text(["one", "two"])  # events in the room arrive, once each
    sessions = backend.call("GET", f"/admin/users/{ada_id}", 200, headers=backend.admin()).json()["sessions"]
    assert first not in [session["id"] for session in sessions]  # the replaced session ended
    expect(person(bob, ada_id)).to_have_text("Ada")  # still here for the others: no leave for the renewal
    assert unauthorized == []  # renewed in time: no request had to be refused first

    # The backend stops granting Ada the room: her page shows it closed within a second of the answer.
    sent = time.time()
    backend.call("DELETE", f"/channels/{room}/members/{ada_id}", 204)
    answered = time.time()
    expect(ada.locator("#room-state")).to_have_text("Room closed (revoked)")
    closed_at = ada.evaluate("window.closedAt") / 1000
    assert sent <= closed_at < answered + WITHIN + BROWSER_MARGIN, closed_at - answered
    # Nothing of the room reaches her any more, while Bob still gets it and sees her go.
    backend.call("POST", "/events", 201, json={"channel": room, "event": "message", "data": {"text": "three"}})
    expect(messages(bob)).to_have_text(["one", "two", "three"])
    expect(person(bob, ada_id)).to_have_count(0)
    expect(messages(ada)).to_have_text(["one", "two"])
    assert ada.evaluate("window.product.client.signedIn") is True  # her session goes on without the room


def test_with_cookies_on_the_same_site_the_page_follows_the_room_by_websocket_across_a_renewal(
    backend, product, new_context
):
    page, user_id = logged_in(
        new_context, product, "cy@product.example", mode={"tokens": "cookie", "feed": "websocket"}
    )
    assert page.evaluate("window.product.client.accessToken") is None  # in the service's HttpOnly cookies
    assert page.evaluate("document.cookie") == ""
    room = f"{backend.namespace}:cookies"
    backend.call("PUT", f"/channels/{room}/members/{user_id}", 204, json={"info": {"name": "Cy"}})
    page.evaluate(f"window.product.join('{room}')")
    expect(person(page, user_id)).to_have_text("Cy")
    assert page.evaluate("window.product.feed.socket !== null")  # joined by a WebSocket frame

    first = page.evaluate("window.product.client.sessionId")
    assert page.evaluate("window.product.client.renew().then((user) => user.id)") == user_id
    assert page.evaluate("window.product.client.sessionId") != first
    backend.call("POST", "/events", 201, json={"channel": room, "event": "message", "data": {"text": "after"}})
    expect(messages(page)).to_have_text(["after"])  # the WebSocket came back with the new session's cookie
    sessions = backend.call("GET", f"/admin/users/{user_id}", 200, headers=backend.admin()).json()["sessions"]
    assert [session["id"] for session in sessions] == [page.evaluate("window.product.client.sessionId")]

    backend.call("DELETE", f"/channels/{room}/members/{user_id}", 204)
    answered = time.time()
    expect(page.locator("#room-state")).to_have_text("Room closed (revoked)")
    assert page.evaluate("window.closedAt") / 1000 < answered + WITHIN + BROWSER_MARGIN
