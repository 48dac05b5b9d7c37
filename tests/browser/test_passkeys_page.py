"""Passkeys on the page, in real Chromium behind nginx, with virtual authenticators (the DevTools
protocol's WebAuthn domain): add one (after the password prompt), rename it, re-authenticate with it,
sign in with the button and by the browser's autofill (conditional mediation) on another device that
has the same passkey, remove it, and see it refused afterwards.

WebAuthn takes no IP address as RP ID, so the page is opened at http://localhost:<port> (a secure
context, as 127.0.0.1 is), and the stack is told so: WEBAUTHN_RP_ID=localhost and that origin.
"""

from __future__ import annotations

import pytest
import requests
from playwright.sync_api import expect

from tests.browser.conftest import ARTIFACTS, Stack, age_the_login
from tests.utils import DEFAULT_PASSWORD, random_email

pytestmark = pytest.mark.not_on_cluster("the browser page: a UI test, no Redis logic of its own")

# A browser without the WebAuthn Level 3 JSON helpers and without conditional mediation (older ones):
# client.js falls back to its own base64url conversion, and the page offers the button only.
OLDER_BROWSER = """
delete PublicKeyCredential.parseCreationOptionsFromJSON;
delete PublicKeyCredential.parseRequestOptionsFromJSON;
delete PublicKeyCredential.prototype.toJSON;
PublicKeyCredential.isConditionalMediationAvailable = () => Promise.resolve(false);
"""
REFUSED = "The passkey was not accepted. Try again, or log in another way."


@pytest.fixture(scope="module")
def passkey_stack(base_env, tmp_path_factory):
    stack = Stack(base_env, tmp_path_factory.mktemp("passkey-stack"))
    stack.local_url = f"http://localhost:{stack.nginx.port}"
    stack.app.env.update(WEBAUTHN_RP_ID="localhost", WEBAUTHN_ORIGINS=stack.local_url)
    stack.start()
    yield stack
    stack.stop()


def virtual_authenticator(context, page) -> tuple:
    """A platform authenticator that holds passkeys and verifies the user (as a fingerprint would)."""
    cdp = context.new_cdp_session(page)
    cdp.send("WebAuthn.enable", {"enableUI": False})
    options = {
        "protocol": "ctap2",
        "transport": "internal",
        "hasResidentKey": True,
        "hasUserVerification": True,
        "isUserVerified": True,
        "automaticPresenceSimulation": True,
    }
    return cdp, cdp.send("WebAuthn.addVirtualAuthenticator", {"options": options})["authenticatorId"]


def watched_page(context, errors: list):
    page = context.new_page()
    page.on("pageerror", lambda error: errors.append(error))
    return page


def logged_in(page, email: str) -> None:
    expect(page.locator("#status")).to_have_text(f"Logged in as {email}")


def log_out(page) -> None:
    page.get_by_role("button", name="Log out", exact=True).click()
    expect(page.locator("#status")).to_have_text("You logged out.")


def test_a_passkey_is_added_used_on_two_devices_and_removed(passkey_stack, new_context, base_env):
    base = passkey_stack.local_url
    email = random_email()
    assert requests.post(f"{passkey_stack.url}/auth/register", json={"email": email, "password": DEFAULT_PASSWORD}).ok
    errors = []
    laptop_context = new_context()
    laptop_context.add_init_script(OLDER_BROWSER)
    laptop = watched_page(laptop_context, errors)
    laptop_cdp, laptop_authenticator = virtual_authenticator(laptop_context, laptop)

    laptop.goto(base + "/")
    expect(laptop.get_by_label("E-mail", exact=True)).to_have_attribute("autocomplete", "username webauthn")
    laptop.get_by_label("E-mail", exact=True).fill(email)
    laptop.get_by_label("Password", exact=True).fill(DEFAULT_PASSWORD)
    laptop.get_by_role("button", name="Log in", exact=True).click()
    logged_in(laptop, email)
    expect(laptop.locator("#passkeys-empty")).to_have_text("You have no passkeys yet.")

    # Six minutes after logging in, adding a passkey asks for the password first, then goes on.
    age_the_login(laptop_context, base_env["REDIS_URL"], 6 * 60)
    laptop.get_by_label("Name for a new passkey").fill("Test laptop")
    laptop.get_by_role("button", name="Add a passkey").click()
    expect(laptop.get_by_label("Your current password")).to_be_visible()
    expect(laptop.get_by_role("button", name="Use a passkey instead")).to_be_hidden()  # it has none yet
    laptop.get_by_label("Your current password").fill(DEFAULT_PASSWORD)
    laptop.get_by_role("button", name="Confirm").click()
    expect(laptop.locator("#passkeys li")).to_have_count(1)
    expect(laptop.locator("#passkeys li .passkey-name")).to_have_text("Test laptop")
    expect(laptop.locator("#passkey-message")).to_contain_text("Passkey “Test laptop” added")
    held = laptop_cdp.send("WebAuthn.getCredentials", {"authenticatorId": laptop_authenticator})["credentials"]
    assert len(held) == 1 and held[0]["isResidentCredential"] and held[0]["rpId"] == "localhost"

    laptop.get_by_role("button", name="Rename the passkey Test laptop").click()
    laptop.get_by_label("New name for the passkey Test laptop").fill("Work laptop")
    laptop.get_by_role("button", name="Save").click()
    expect(laptop.locator("#passkeys li .passkey-name")).to_have_text("Work laptop")
    ARTIFACTS.mkdir(exist_ok=True)
    laptop.screenshot(path=str(ARTIFACTS / "passkeys-in-the-account.png"), full_page=True)

    # Later again, setting up two-factor authentication: the passkey proves it is the owner.
    age_the_login(laptop_context, base_env["REDIS_URL"], 6 * 60)
    laptop.get_by_role("button", name="Set up two-factor authentication").click()
    laptop.get_by_role("button", name="Use a passkey instead").click()
    expect(laptop.locator("#mfa-qr svg")).to_be_visible()

    # The button on the log-in form, with no e-mail or password typed.
    log_out(laptop)
    laptop.get_by_role("button", name="Sign in with a passkey").click()
    logged_in(laptop, email)
    expect(laptop.locator("#passkeys li .passkey-about")).to_contain_text("last used")

    # A phone with a copy of the passkey made right after it was created: the laptop has used it since,
    # so the copy's counter is behind, and the service takes it for a clone.
    phone_context = new_context()
    phone = watched_page(phone_context, errors)
    phone_cdp, phone_authenticator = virtual_authenticator(phone_context, phone)
    phone_cdp.send("WebAuthn.addCredential", {"authenticatorId": phone_authenticator, "credential": held[0]})
    phone.goto(base + "/")
    assert phone.evaluate("PublicKeyCredential.isConditionalMediationAvailable()") is True
    expect(phone.locator("#login-error")).to_have_text(REFUSED)  # the autofill offered it; refused
    expect(phone.locator("#status")).to_have_text("You are logged out.")
    # Synced as it is now: the browser's autofill signs in as the page opens.
    synced = laptop_cdp.send("WebAuthn.getCredentials", {"authenticatorId": laptop_authenticator})["credentials"][0]
    phone_cdp.send("WebAuthn.clearCredentials", {"authenticatorId": phone_authenticator})
    phone_cdp.send("WebAuthn.addCredential", {"authenticatorId": phone_authenticator, "credential": synced})
    phone.reload()
    logged_in(phone, email)
    expect(phone.locator("#sessions li")).to_have_count(2)

    # Removed on the laptop: it signs in nowhere any more, though both devices still hold it.
    laptop.get_by_role("button", name="Remove the passkey Work laptop").click()
    expect(laptop.locator("#passkeys li")).to_have_count(0)
    expect(laptop.locator("#passkey-message")).to_contain_text("Passkey “Work laptop” removed")
    log_out(laptop)
    laptop.get_by_role("button", name="Sign in with a passkey").click()
    expect(laptop.locator("#login-error")).to_have_text(REFUSED)
    expect(laptop.locator("#status")).to_have_text("You logged out.")
    log_out(phone)  # the autofill offers it again at once, and it is refused
    expect(phone.locator("#login-error")).to_have_text(REFUSED)
    expect(phone.locator("#status")).to_have_text("You logged out.")
    assert errors == []
