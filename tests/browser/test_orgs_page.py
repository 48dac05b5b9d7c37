"""Organizations on the page and in the console, in real Chromium behind nginx: an owner creates one and invites
a colleague, whose browser follows the mailed link (from the suite's real SMTP server), logs in and accepts; both
meet in the organization's room; the owner removes the colleague, whose room closes within a second. A used
link is refused on the page, and the console lists the organization and its members."""

from __future__ import annotations

import base64
import json
import uuid
from urllib.parse import parse_qs, urlsplit

import pytest
import requests
from playwright.sync_api import expect

from app import create_app
from app.auth.users import create_user
from tests.browser.test_page import log_in
from tests.browser.test_rooms import Admin
from tests.servers import wait_until
from tests.utils import DEFAULT_PASSWORD, bearer, random_email

pytestmark = pytest.mark.not_on_cluster("the browser page: a UI test; organizations are proved on both modes elsewhere")

ORG_ROOM_RULES = {"subscribe": "org_members", "publish": "subscribers", "presence": True, "join_leave": True}
REMOVAL_CLOSES_ROOM_WITHIN_MS = 1000

# Set on the colleague's page before the removal: when the room's panel was hidden (the page's clock, ms).
WATCH_ROOM = """() => {
  window.roomClosedAt = null;
  const room = document.getElementById("room");
  new MutationObserver((changes, observer) => {
    if (!room.hidden) return;
    window.roomClosedAt = Date.now();
    observer.disconnect();
  }).observe(room, { attributes: true, attributeFilter: ["hidden"] });
}"""


@pytest.fixture(scope="module")
def admin(mail_stack, base_env) -> Admin:
    return Admin(mail_stack, base_env)


@pytest.fixture(scope="module")
def make_user(base_env):
    """Accounts with a verified address (organizations are created and joined by verified ones): their U."""
    app = create_app(base_env)

    def make(role: str = "user") -> dict:
        with app.app_context():
            return create_user(random_email(), DEFAULT_PASSWORD, role=role, email_verified=True)

    return make


def org_item(page, name: str):
    return page.locator("#orgs-list li").filter(has=page.locator(".org-name", has_text=name))


def member(page, user_id: str):
    return page.locator(f'#org-members li[data-user-id="{user_id}"]')


def person(page, user_id: str):
    return page.locator(f'#room-people li[data-user-id="{user_id}"]')


def access_claims(context) -> dict:
    access = next(c["value"] for c in context.cookies() if c["name"] == "__Host-access")
    return json.loads(base64.urlsafe_b64decode(access.split(".")[1] + "=="))


def invitation_token(link: str) -> str:
    return parse_qs(urlsplit(link).query)["token"][0]


def test_an_invited_colleague_accepts_meets_the_owner_in_the_room_and_loses_it_when_removed(
    mail_stack, smtp, admin, make_user, new_context
):
    base = mail_stack.url
    namespace = admin.namespace(ORG_ROOM_RULES)
    owner, colleague = make_user(), make_user()
    name = f"Acme {uuid.uuid4().hex[:6]}"

    # The owner creates the organization, makes it the session's active one, and invites the colleague.
    owner_context = new_context()
    boss = owner_context.new_page()
    errors = []
    boss.on("pageerror", lambda error: errors.append(error))
    log_in(boss, base, owner["email"])
    expect(boss.locator("#orgs-empty")).to_be_visible()
    boss.get_by_label("Name of a new organization").fill(name)
    boss.get_by_role("button", name="Create the organization").click()
    expect(org_item(boss, name).locator(".org-role")).to_have_text(" — owner")
    org_id = org_item(boss, name).get_attribute("data-org-id")
    expect(boss.locator("#org-title")).to_have_text(name)
    expect(member(boss, owner["id"])).to_contain_text("owner")

    boss.get_by_role("button", name=f"Make {name} the active organization").click()
    expect(boss.locator("#org-active")).to_have_text(f"Active organization: {name} (you are owner).")
    expect(org_item(boss, name).locator(".org-active")).to_have_text(" (active)")
    claims = access_claims(owner_context)  # the switch's answer set the session's new access token
    assert (claims.get("org_id"), claims.get("org_role")) == (org_id, "owner")

    boss.get_by_label("Their e-mail").fill(colleague["email"])
    boss.get_by_label("Their role").select_option("member")
    boss.get_by_role("button", name="Mail an invitation").click()
    expect(boss.locator("#org-message")).to_contain_text(f"on its way to {colleague['email']}")
    expect(boss.locator("#org-invitations li .invitation-email")).to_have_text([colleague["email"]])

    # The colleague follows the mailed link signed out, logs in there, and accepts.
    link = smtp.wait_for(colleague["email"])[0].link()
    assert link.startswith(f"{base}/invitation?token=")
    mate = new_context().new_page()
    mate.on("pageerror", lambda error: errors.append(error))
    mate.goto(link)
    expect(mate.locator("#status")).to_have_text("Log in to accept your invitation to an organization.")
    expect(mate.locator("#notice")).to_contain_text("You are invited to join an organization.")
    assert "token=" not in mate.url  # cleared from the address bar and history
    mate.get_by_label("E-mail", exact=True).fill(colleague["email"])
    mate.get_by_label("Password", exact=True).fill(DEFAULT_PASSWORD)
    mate.get_by_role("button", name="Log in", exact=True).click()
    expect(mate.locator("#status")).to_have_text(f"Logged in as {colleague['email']}")
    expect(mate.locator("#invitation")).to_be_visible()
    mate.get_by_role("button", name="Accept the invitation").click()
    expect(mate.locator("#notice")).to_have_text(f"You joined {name} as member.")
    expect(mate.locator("#invitation")).to_be_hidden()
    expect(org_item(mate, name).locator(".org-role")).to_have_text(" — member")
    expect(member(mate, owner["id"])).to_contain_text(owner["email"])
    expect(mate.get_by_role("button", name=f"Remove {owner['email']} from {name}")).to_have_count(0)  # a member

    # Both in the organization's room: the owner from the organization's panel, the colleague by its name.
    channel = f"{namespace}:{org_id}"
    boss.get_by_label("Its room").fill(namespace)
    boss.get_by_role("button", name="Join its room").click()
    expect(boss.locator("#room-title")).to_have_text(f"In {channel}")
    expect(mate.locator("#connection")).to_have_attribute("data-state", "live")
    mate.get_by_label("Room", exact=True).fill(channel)
    mate.get_by_role("button", name="Join", exact=True).click()
    expect(mate.locator("#room-title")).to_have_text(f"In {channel}")
    expect(person(mate, owner["id"])).to_have_text(owner["email"])  # named as the organization's member list has it
    expect(person(boss, colleague["id"])).to_be_visible()  # live, by the colleague's join event

    # The owner removes the colleague (the page asks once more); the colleague's room closes within a second.
    boss.get_by_role("button", name=f"Show the members of {name}").click()  # shown afresh
    expect(member(boss, colleague["id"])).to_contain_text(f"{colleague['email']} — member")
    mate.evaluate(WATCH_ROOM)
    boss.get_by_role("button", name=f"Remove {colleague['email']} from {name}").click()
    with boss.expect_response(lambda r: r.request.method == "DELETE" and "/members/" in r.url) as removal:
        boss.get_by_role("button", name=f"Yes, remove {colleague['email']} from {name}").click()
    answer = removal.value
    assert answer.status == 204
    answer.finished()
    timing = answer.request.timing
    assert timing["responseStart"] >= 0, timing
    answered_at = timing["startTime"] + timing["responseStart"]
    # Polled from here: wait_for_function's own polling evaluates its text in the page, which the page's CSP refuses.
    wait_until(lambda: mate.evaluate("window.roomClosedAt !== null"), timeout=5, message="the colleague's room closed")
    closed_after = mate.evaluate("window.roomClosedAt") - answered_at
    assert closed_after < REMOVAL_CLOSES_ROOM_WITHIN_MS, f"the room closed {closed_after:.0f} ms after the removal"
    expect(mate.locator("#room-error")).to_have_text(f"You are no longer in {channel}: your access to it was revoked.")
    expect(boss.locator("#org-message")).to_have_text(f"{colleague['email']} is no longer a member of {name}.")
    expect(member(boss, colleague["id"])).to_have_count(0)
    expect(org_item(mate, name)).to_have_count(0)  # the colleague's list follows
    assert errors == []


def test_the_console_lists_organizations_and_shows_one_with_its_members(mail_stack, smtp, make_user, new_context):
    base = mail_stack.url
    owner, colleague = make_user(), make_user()
    name = f"Globex {uuid.uuid4().hex[:6]}"
    owner_headers = bearer(login(base, owner))
    created = requests.post(f"{base}/orgs", json={"name": name}, headers=owner_headers, timeout=10)
    assert created.status_code == 201, created.text
    org_id = created.json()["id"]
    invited = requests.post(
        f"{base}/orgs/{org_id}/invitations",
        json={"email": colleague["email"], "role": "admin"},
        headers=owner_headers,
        timeout=10,
    )
    assert invited.status_code == 201, invited.text
    link = smtp.wait_for(colleague["email"])[0].link()
    token = invitation_token(link)
    accepted = requests.post(
        f"{base}/orgs/invitations/accept", json={"token": token}, headers=bearer(login(base, colleague)), timeout=10
    )
    assert accepted.status_code == 200, accepted.text

    # The link once more, opened signed in: offered at once, and refused as used.
    page = new_context().new_page()
    log_in(page, base, make_user("admin")["email"])
    page.goto(link)
    expect(page.locator("#invitation")).to_be_visible()
    page.get_by_role("button", name="Accept the invitation").click()
    expect(page.locator("#notice")).to_contain_text("This invitation does not work any more")
    expect(page.locator("#notice")).to_have_attribute("data-outcome", "failure")
    expect(page.locator("#invitation")).to_be_hidden()

    page.goto(f"{base}/admin#orgs")
    row = page.locator(f'#org-list tr[data-org-id="{org_id}"]')
    expect(row).to_contain_text(name)
    row.get_by_role("link", name=name).click()
    expect(page.locator("#org-title")).to_have_text(name)
    expect(page.locator("#org-id")).to_have_text(org_id)
    expect(page.locator("#org-count")).to_have_text("2")
    members = page.locator("#org-member-list tbody tr")
    expect(members).to_have_count(2)
    expect(page.locator(f'#org-member-list tr[data-user-id="{owner["id"]}"]')).to_contain_text(owner["email"])
    expect(page.locator(f'#org-member-list tr[data-user-id="{owner["id"]}"] .role')).to_have_text("owner")
    expect(page.locator(f'#org-member-list tr[data-user-id="{colleague["id"]}"] .role')).to_have_text("admin")


def login(base: str, user: dict) -> str:
    """A body-transport login's access token."""
    body = {"email": user["email"], "password": DEFAULT_PASSWORD, "transport": "body"}
    answer = requests.post(f"{base}/auth/login", json=body, timeout=10)
    assert answer.status_code == 200, answer.text
    return answer.json()["access_token"]
