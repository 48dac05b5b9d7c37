"""The page's account flows in real Chromium behind nginx: forgot password, the reset form the mailed
link lands on, e-mail verification, MFA setup with its QR code and recovery codes, and the second step."""

from __future__ import annotations

import time

import pyotp
import pytest
import requests
from playwright.sync_api import expect

from tests.browser.conftest import ARTIFACTS, age_the_login
from tests.conftest import Cli
from tests.utils import DEFAULT_PASSWORD, random_email

pytestmark = pytest.mark.not_on_cluster("the browser page: a UI test, no Redis logic of its own")

NEW_PASSWORD = "a new browser passphrase"


def register(base: str) -> str:
    email = random_email()
    assert requests.post(f"{base}/auth/register", json={"email": email, "password": DEFAULT_PASSWORD}).ok
    return email


def fill_login(page, base: str, email: str, password: str = DEFAULT_PASSWORD) -> None:
    page.goto(base + "/")
    page.get_by_label("E-mail", exact=True).fill(email)
    page.get_by_label("Password", exact=True).fill(password)
    page.get_by_role("button", name="Log in", exact=True).click()


def log_out(page) -> None:
    """Log out, and wait until the page says so: a navigation at once may cancel the logout's request, and the
    page then loads still logged in."""
    page.get_by_role("button", name="Log out", exact=True).click()
    expect(page.locator("#status")).to_have_text("You logged out.")


def logged_in(page, email: str) -> None:
    expect(page.locator("#status")).to_have_text(f"Logged in as {email}")


def test_forgotten_password_reset_through_the_mailed_link(mail_stack, smtp, new_context):
    base = mail_stack.url
    email = register(base)
    phone, laptop = new_context().new_page(), new_context().new_page()
    fill_login(phone, base, email)
    logged_in(phone, email)
    expect(phone.locator("#email-status")).to_contain_text("not verified")

    # The verification link verifies the address, on whatever browser opens it.
    verification = smtp.wait_for(email)[0]
    laptop.goto(verification.link())
    expect(laptop.locator("#notice")).to_have_text("Your e-mail address is verified. Thank you.")
    expect(laptop.locator("#status")).to_have_text("You are logged out.")
    assert "#token=" not in laptop.url  # the token is cleared from the address bar

    laptop.get_by_role("button", name="Forgot your password?").click()
    laptop.get_by_label("E-mail of your account").fill(email)
    laptop.get_by_role("button", name="Mail me a link").click()
    expect(laptop.locator("#forgot-message")).to_contain_text("If an account has this address")

    reset = smtp.wait_for(email, count=2)[1]
    assert reset.link().startswith(f"{base}/reset-password#token=")
    laptop.goto(reset.link())
    laptop.get_by_label("New password").fill(NEW_PASSWORD)
    laptop.get_by_role("button", name="Set the new password").click()
    expect(laptop.locator("#status")).to_contain_text("Your password is changed")
    expect(phone.locator("#status")).to_contain_text("logged out", timeout=5000)  # every device, live

    fill_login(laptop, base, email, NEW_PASSWORD)
    logged_in(laptop, email)
    expect(laptop.locator("#email-status")).to_contain_text("is verified")

    # The link again: the page says at once that it is used, and offers the form that mails a new one.
    used = new_context().new_page()
    used.goto(reset.link())
    expect(used.locator("#notice")).to_contain_text("This password-reset link no longer works: it was used")
    expect(used.locator("#notice")).to_have_attribute("data-outcome", "failure")
    expect(used.get_by_role("button", name="Mail me a link")).to_be_visible()
    expect(used.locator("#reset-form")).to_be_hidden()
    assert "#token=" not in used.url


def settle() -> None:
    left = 30 - time.time() % 30
    if left < 5:
        time.sleep(left + 0.05)


def test_mfa_setup_recovery_codes_and_the_second_login_step(mail_stack, new_context, base_env):
    base = mail_stack.url
    email = register(base)
    context = new_context()
    page = context.new_page()
    errors = []
    page.on("pageerror", lambda error: errors.append(error))
    fill_login(page, base, email)
    logged_in(page, email)

    # Six minutes after logging in, the page asks for the password before setting up a second factor.
    age_the_login(context, base_env["REDIS_URL"], 6 * 60)
    page.get_by_role("button", name="Set up two-factor authentication").click()
    page.get_by_label("Your current password").fill("not the password")
    page.get_by_role("button", name="Confirm").click()
    expect(page.locator("#reauth-error")).to_have_text("The password is wrong.")
    settle()
    page.get_by_label("Your current password").fill(DEFAULT_PASSWORD)
    page.get_by_role("button", name="Confirm").click()
    qr = page.locator("#mfa-qr svg")
    expect(qr).to_be_visible()
    assert qr.bounding_box()["width"] >= 100  # drawn, not an empty element
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "mfa-setup-qr-code.png"), full_page=True)
    secret = page.locator("#mfa-secret").text_content()
    totp = pyotp.TOTP(secret)
    page.get_by_label("Code from the app", exact=True).fill(totp.now())
    page.get_by_role("button", name="Turn on").click()
    expect(page.locator("#recovery-codes li")).to_have_count(10)
    expect(page.locator("#mfa-status")).to_have_text("Two-factor authentication is on.")
    recovery_codes = page.locator("#recovery-codes li").all_text_contents()

    log_out(page)
    fill_login(page, base, email)
    expect(page.get_by_label("Code from your authenticator app")).to_be_visible()
    page.get_by_label("Code from your authenticator app").fill("000000")
    page.get_by_role("button", name="Continue").click()
    expect(page.locator("#mfa-error")).to_have_text("The code is not valid.")
    page.get_by_label("Code from your authenticator app").fill(totp.at(time.time() + 30))
    page.get_by_role("button", name="Continue").click()
    logged_in(page, email)

    log_out(page)
    fill_login(page, base, email)
    page.get_by_role("button", name="Use a recovery code instead").click()
    page.get_by_label("Recovery code", exact=True).fill(recovery_codes[0])
    page.get_by_role("button", name="Continue").click()
    logged_in(page, email)

    page.get_by_label("Your password").fill(DEFAULT_PASSWORD)
    page.get_by_label("Code from the app (or a recovery code)").fill(recovery_codes[1])
    page.get_by_role("button", name="Turn off two-factor authentication").click()
    expect(page.locator("#mfa-status")).to_have_text("Two-factor authentication is off.")
    assert errors == []


def create_user_from_cli(cli: Cli, email: str) -> None:
    """`flask --app wsgi users create`, as an operator would (in process, on the live server's Redis): it mails
    nothing."""
    done = cli("users", "create", "--email", email, "--password", DEFAULT_PASSWORD)
    assert done.returncode == 0, done.stdout + done.stderr


def expect_notice(page, outcome: str, *parts: str) -> None:
    """The link's outcome: a message of its own, boxed apart from the status line, which says none of it."""
    notice = page.locator("#notice")
    expect(notice).to_be_visible()
    expect(notice).to_have_attribute("data-outcome", outcome)
    for part in parts:
        expect(notice).to_contain_text(part)
    assert page.locator("#status #notice").count() == 0
    status, box = page.locator("#status").bounding_box(), notice.bounding_box()
    assert box["y"] >= status["y"] + status["height"]  # below the status line, not on it
    assert notice.evaluate("element => getComputedStyle(element).borderLeftWidth") == "6px"


def test_an_account_made_on_the_command_line_is_not_told_of_a_mail_it_never_got(
    mail_stack, smtp, module_cli, new_context
):
    base = mail_stack.url
    email = random_email()
    create_user_from_cli(module_cli, email)
    page = new_context().new_page()
    fill_login(page, base, email)
    logged_in(page, email)
    expect(page.locator("#email-status")).to_have_text(f"Your address {email} is not verified yet.")
    assert smtp.to(email) == []  # indeed nothing was mailed

    page.get_by_role("button", name="Mail me a verification link").click()
    expect(page.locator("#email-status")).to_have_text(
        f"A verification link is on its way to {email}. Any link mailed before it no longer works."
    )
    verification = smtp.wait_for(email)[0]

    # Signed in, a good link: its outcome stands apart from "Logged in as ...".
    page.goto(verification.link())
    logged_in(page, email)
    expect_notice(page, "success", "Your e-mail address is verified. Thank you.")
    expect(page.locator("#email-status")).to_have_text(f"Your address {email} is verified.")
    expect(page.get_by_role("button", name="Mail me a verification link")).to_be_hidden()


def test_a_bad_verification_link_says_so_apart_from_the_status_signed_in_or_out(mail_stack, new_context):
    base = mail_stack.url
    page = new_context().new_page()
    page.goto(base + "/verify-email#token=garbage")
    expect(page.locator("#status")).to_have_text("You are logged out.")
    expect_notice(page, "failure", "This verification link did not work.", "not valid", "Log in to have a new")

    email = register(base)
    fill_login(page, base, email)
    logged_in(page, email)
    expect(page.locator("#notice")).to_be_hidden()  # a visit that followed no link has no notice
    page.goto(base + "/verify-email#token=garbage")
    logged_in(page, email)  # exactly: nothing of the link's outcome run into it
    expect_notice(page, "failure", "This verification link did not work.", "Mail me a verification link")
    expect(page.locator("#email-status")).to_have_text(f"Your address {email} is not verified yet.")
