"""The page's rooms, on client.js's channels: people in two browsers join a channel, see each other come and
go (presence, then join and leave events), talk (events carrying `from`), and are told when they lose access."""

from __future__ import annotations

import uuid

import pytest
import requests
from playwright.sync_api import expect

from app import create_app
from app.auth.users import create_user
from tests.browser.conftest import Stack
from tests.browser.test_page import TRANSPORTS, choose_transport, expect_newest_event, log_in, register
from tests.servers import ROOT, wait_until
from tests.utils import DEFAULT_PASSWORD, bearer, random_email

pytestmark = pytest.mark.not_on_cluster("the browser page: a UI test; channels are proved on both modes elsewhere")

ROOM_RULES = {"subscribe": "authenticated", "publish": "subscribers", "presence": True, "join_leave": True}
MEMBERS_RULES = {"subscribe": "members", "publish": "subscribers", "presence": True, "join_leave": True}
#: The rules make run gives the namespace `chat`, on the command line (the page names them for a missing namespace).
RULES_OF_CHAT = ["--subscribe", "authenticated", "--publish", "subscribers", "--presence", "--join-leave"]


@pytest.fixture(scope="module")
def stack(base_env, tmp_path_factory):
    """gunicorn (2 workers) behind nginx, as the page's other tests have it (no OAuth provider needed). Leaves
    are published at once: what a room shows of one does not depend on the linger, which would only delay it."""
    running = Stack(base_env, tmp_path_factory.mktemp("rooms"), PRESENCE_LINGER_SECONDS="0").start()
    yield running
    running.stop()


class Admin:
    """An administrator of the stack, through the HTTP API: defines namespaces, grants and publishes."""

    def __init__(self, stack: Stack, base_env: dict):
        self.base = stack.url
        email = random_email()
        with create_app(base_env).app_context():
            create_user(email, DEFAULT_PASSWORD, role="admin")
        body = {"email": email, "password": DEFAULT_PASSWORD, "transport": "body"}
        answer = requests.post(f"{self.base}/auth/login", json=body, timeout=10)
        assert answer.status_code == 200, answer.text
        self.headers = bearer(answer.json()["access_token"])

    def call(self, method: str, path: str, expected: int, **kwargs) -> requests.Response:
        answer = requests.request(method, self.base + path, headers=self.headers, timeout=10, **kwargs)
        assert answer.status_code == expected, answer.text
        return answer

    def namespace(self, rules: dict) -> str:
        """A new namespace with these rules (`PUT /admin/namespaces/{ns}`); its name."""
        name = f"rooms-{uuid.uuid4().hex[:10]}"
        defined = self.call("PUT", f"/admin/namespaces/{name}", 200, json=rules).json()
        assert defined == {"name": name, **rules}
        return name

    def publish(self, channel: str, text: str) -> None:
        self.call("POST", "/events", 201, json={"channel": channel, "event": "message", "data": {"text": text}})


@pytest.fixture(scope="module")
def admin(stack, base_env) -> Admin:
    return Admin(stack, base_env)


def user_id(page) -> str:
    return page.evaluate("window.authRt.client.me().then((user) => user.id)")


def join(page, channel: str) -> None:
    page.get_by_label("Room", exact=True).fill(channel)
    page.get_by_role("button", name="Join", exact=True).click()
    expect(page.locator("#room-title")).to_have_text(f"In {channel}")
    expect(page.get_by_role("button", name="Send", exact=True)).to_be_enabled()  # the service follows it now


def person(page, someone: str):
    return page.locator(f'#room-people li[data-user-id="{someone}"]')


def say(page, text: str) -> None:
    page.get_by_label("Your message").fill(text)
    page.get_by_role("button", name="Send", exact=True).click()


def expect_last_message(page, sender: str, text: str, sender_shown: str | None = None) -> None:
    last = page.locator("#room-messages li").last
    expect(last.locator(".text")).to_have_text(text)
    expect(last).to_have_attribute("data-from", sender)
    expect(last.locator(".sender")).to_have_text(sender_shown or sender)


def signed_in(new_context, stack: Stack, transport: str = "sse"):
    """A new browser (context) logged in as a new user on `transport`: its page and user id."""
    page = new_context().new_page()
    log_in(page, stack.url, register(stack.url))
    if transport != "sse":
        choose_transport(page, transport)
    return page, user_id(page)


@pytest.mark.parametrize("transport", ["sse", "websocket"])  # presence counts SSE and WebSocket readers
def test_two_people_in_a_room_see_each_other_arrive_talk_and_leave(stack, admin, new_context, transport):
    channel = f"{admin.namespace(ROOM_RULES)}:lobby"
    ada, ada_id = signed_in(new_context, stack, transport)
    bob, bob_id = signed_in(new_context, stack, transport)

    join(ada, channel)
    expect(person(ada, ada_id)).to_have_text(f"{ada_id} (you)")
    join(bob, channel)
    expect(person(ada, bob_id)).to_have_text(bob_id)  # live, by bob's join event
    expect(person(bob, ada_id)).to_have_text(ada_id)  # from the room's presence
    expect(person(bob, bob_id)).to_have_text(f"{bob_id} (you)")
    for page in (ada, bob):
        expect(page.locator("#room-count")).to_have_text("2")

    say(ada, "Hello Bob")
    expect_last_message(bob, ada_id, "Hello Bob")
    expect_last_message(ada, ada_id, "Hello Bob")
    say(bob, "Hi Ada")
    expect_last_message(ada, bob_id, "Hi Ada")
    expect(ada.locator("#room-messages li")).to_have_count(2)
    expect(ada.locator("#event-log li")).to_have_count(0)  # the room's events show in the room only

    bob.get_by_role("button", name="Leave", exact=True).click()
    expect(bob.locator("#room")).to_be_hidden()
    expect(person(ada, bob_id)).to_have_count(0)  # by bob's leave event
    expect(ada.locator("#room-count")).to_have_text("1")
    presence = admin.call("GET", f"/channels/{channel}/presence", 200).json()
    assert [user["user_id"] for user in presence["users"]] == [ada_id]


def test_a_room_is_followed_on_every_transport_until_left(stack, admin, new_context):
    """One person, on each transport in turn, joins a room of its own, talks there and leaves it."""
    namespace = admin.namespace(ROOM_RULES)
    page, me = signed_in(new_context, stack)
    for own_notes, transport in enumerate(TRANSPORTS, start=1):
        choose_transport(page, transport)
        channel = f"{namespace}:hall-{transport}"
        join(page, channel)
        admin.publish(channel, f"welcome on {transport}")
        expect(page.locator("#room-messages li .text")).to_have_text([f"welcome on {transport}"])
        say(page, f"thanks on {transport}")  # a publish frame on a WebSocket, POST /events otherwise
        expect_last_message(page, me, f"thanks on {transport}", sender_shown=me)
        expect(page.locator("#room-messages .sender.me")).to_have_count(1)
        assert page.evaluate("window.authRt.feed.channels") == [channel]

        page.get_by_role("button", name="Leave", exact=True).click()
        # Polled from here: wait_for_function's own polling evaluates its text in the page, which its CSP refuses.
        wait_until(lambda: page.evaluate("window.authRt.feed.channels.length === 0"), message="the room left")
        admin.publish(channel, "after you left")
        publish_own(page, me, f"still following my own channel on {transport}")
        expect_newest_event(page, "note", f'"still following my own channel on {transport}"')
        assert page.locator("#event-log li").count() == own_notes  # the room's later message went nowhere
        expect(page.locator("#connection")).to_have_attribute("data-state", "live")


def publish_own(page, me: str, text: str) -> None:
    """An event `note` to the user's own channel, published from the page with client.js."""
    page.evaluate("([channel, text]) => window.authRt.client.publish(channel, 'note', text)", [f"user:{me}", text])


def test_a_member_is_refused_before_its_grant_and_told_when_it_is_revoked(stack, admin, new_context):
    """On each transport in turn, a channel of its own: refused, granted, then revoked while followed."""
    namespace = admin.namespace(MEMBERS_RULES)
    page, me = signed_in(new_context, stack)
    for transport in TRANSPORTS:
        choose_transport(page, transport)
        channel = f"{namespace}:staff-{transport}"
        page.get_by_label("Room", exact=True).fill(channel)
        page.get_by_role("button", name="Join", exact=True).click()
        expect(page.locator("#room-error")).to_contain_text(f"You cannot join {channel}:")
        expect(page.locator("#room")).to_be_hidden()
        assert page.evaluate("window.authRt.feed.channels") == []

        admin.call("PUT", f"/channels/{channel}/members/{me}", 204, json={"info": {"name": "Casey"}})
        join(page, channel)
        expect(page.locator("#room-error")).to_have_text("")
        admin.publish(channel, f"you are in, on {transport}")
        expect(page.locator("#room-messages li .text")).to_have_text([f"you are in, on {transport}"])
        if transport in ("sse", "websocket"):  # present, under the name its grant gives
            expect(person(page, me)).to_have_text("Casey (you)")

        admin.call("DELETE", f"/channels/{channel}/members/{me}", 204)
        # Over SSE and WebSocket the service says why; the polling transports find the channel refused.
        reason = "your access to it was revoked" if transport in ("sse", "websocket") else "your access to it ended"
        expect(page.locator("#room-error")).to_have_text(f"You are no longer in {channel}: {reason}.", timeout=5000)
        expect(page.locator("#room")).to_be_hidden()
        assert page.evaluate("window.authRt.feed.channels") == []
        publish_own(page, me, f"the rest goes on, on {transport}")
        expect_newest_event(page, "note", f'"the rest goes on, on {transport}"')
        expect(page.locator("#connection")).to_have_attribute("data-state", "live")


def test_a_room_stays_joined_across_transport_switches_and_loses_nothing(stack, admin, new_context):
    channel = f"{admin.namespace(ROOM_RULES)}:corridor"
    page, _ = signed_in(new_context, stack)
    join(page, channel)
    sent = []
    for transport in [*TRANSPORTS, "sse"]:
        choose_transport(page, transport)  # reconnects with ?channels= and the cursor
        sent.append(f"via {transport}")
        admin.publish(channel, sent[-1])
        expect(page.locator("#room-messages li .text")).to_have_text(sent)  # each once, in order
    assert page.evaluate("window.authRt.feed.channels") == [channel]


def refusal_command(page, channel: str) -> list[str]:
    """Join `channel`, be refused, and the command the page names (as the words after `flask --app wsgi`)."""
    page.get_by_label("Room", exact=True).fill(channel)
    page.get_by_role("button", name="Join", exact=True).click()
    expect(page.locator("#room-error")).to_contain_text(f"You cannot join {channel}: ")
    expect(page.locator("#room")).to_be_hidden()
    command = page.locator("#room-error code").text_content().split()
    assert command[:3] == [".venv/bin/flask", "--app", "wsgi"], command
    return command[3:]


def test_a_room_without_its_namespace_or_a_grant_names_the_command_that_lets_the_user_in(
    stack, admin, new_context, module_cli
):
    """The page's way out of a refused room: the command it names, run as it says, lets the user in."""
    page, me = signed_in(new_context, stack)
    email = page.evaluate("window.authRt.client.me().then((user) => user.email)")
    missing = f"rooms-{uuid.uuid4().hex[:10]}"
    channel = f"{missing}:lobby"
    command = refusal_command(page, channel)
    expect(page.locator("#room-error")).to_contain_text(f"there is no namespace {missing}. An administrator makes it")
    assert command == ["channels", "namespace-put", missing, *RULES_OF_CHAT], command
    assert f"chat_rules=({' '.join(RULES_OF_CHAT)})" in (ROOT / "scripts" / "run.sh").read_text()  # make run's
    done = module_cli(*command)
    assert done.returncode == 0, done.stderr
    join(page, channel)
    expect(person(page, me)).to_have_text(f"{me} (you)")  # presence, as the command's rules say
    say(page, "made it")
    expect_last_message(page, me, "made it")

    staff = f"{admin.namespace(MEMBERS_RULES)}:staff"
    command = refusal_command(page, staff)
    expect(page.locator("#room-error")).to_contain_text("An administrator lets you in with")
    assert command == ["channels", "grant", staff, email], command
    done = module_cli(*command)
    assert done.returncode == 0, done.stderr
    join(page, staff)
    expect(page.locator("#room-error")).to_have_text("")
