"""Real Chromium (Debian's, driven by Playwright) through real nginx in front of real gunicorn and Redis."""

from __future__ import annotations

import base64
import json
import os
import re
from pathlib import Path

import pytest
import redis
from playwright.sync_api import expect

from app.redis import Keys
from tests.account.conftest import mail_env
from tests.events.conftest import FAST
from tests.mailserver import SmtpServer
from tests.servers import (
    CLIENT_ID,
    CLIENT_SECRET,
    ROOT,
    LiveServer,
    NginxServer,
    OpenIdProvider,
    free_port,
    make_certificate,
)

ARTIFACTS = ROOT / "tests" / "artifacts"
#: The last state of every page a failed test opened is kept as a screenshot in ARTIFACTS; of every test's with
#: BROWSER_SCREENSHOTS=all. A full-page screenshot is half a second of Chromium's CPU, some 60 s over the suite.
SCREENSHOTS_OF_EVERY_TEST = os.environ.get("BROWSER_SCREENSHOTS") == "all"
FAILED = pytest.StashKey[bool]()

# What a page shows may wait for a poll (a second apart) on a machine busy with other tests: a page
# assertion waits as long as a page action may (10 s), not Playwright's 5 s.
expect.set_options(timeout=10_000)


class Stack:
    """gunicorn (2 workers, unless told) behind nginx, optionally with the test OpenID provider configured."""

    def __init__(self, base_env: dict, directory: Path, with_oauth: bool = False, workers: int = 2, **env):
        self.app = LiveServer({**base_env, **FAST, **env}, workers=workers, log_path=directory / "app.log")
        self.nginx = NginxServer(directory / "nginx", [f"127.0.0.1:{self.app.port}"])
        self.provider = OpenIdProvider(directory / "provider.log") if with_oauth else None

    @property
    def url(self) -> str:
        return self.nginx.url

    def start(self) -> Stack:
        if self.provider:
            self.provider.start(f"{self.nginx.url}/auth/oauth/test/callback")
            self.app.env.update(
                OAUTH_PROVIDERS="test",
                OAUTH_TEST_CLIENT_ID=CLIENT_ID,
                OAUTH_TEST_CLIENT_SECRET=CLIENT_SECRET,
                OAUTH_TEST_DISCOVERY_URL=f"{self.provider.url}/.well-known/openid-configuration",
                OAUTH_TEST_SCOPE="openid email",
            )
        self.app.start()
        self.nginx.start()
        return self

    def stop(self) -> None:
        self.nginx.stop()
        self.app.stop()
        if self.provider:
            self.provider.stop()


@pytest.fixture(scope="module")
def smtp(tmp_path_factory):
    """The suite's SMTP server (STARTTLS, with authentication) for a module's mailing stack."""
    certificate = make_certificate(tmp_path_factory.mktemp("smtp-tls"))
    server = SmtpServer(certificate, mode="starttls", auth=True).start()
    server.certificate = certificate
    yield server
    server.stop()


@pytest.fixture(scope="module")
def mail_stack(base_env, tmp_path_factory, smtp):
    """gunicorn (2 workers) behind nginx, mailing through `smtp`, its mails' links pointing at nginx."""
    stack = Stack(base_env, tmp_path_factory.mktemp("mail-stack"), **mail_env(smtp, smtp.certificate))
    stack.app.env["PUBLIC_BASE_URL"] = stack.url  # links in mails land on this page, through nginx
    stack.start()
    yield stack
    stack.stop()


@pytest.fixture(scope="module")
def embedding_origin() -> str:
    """Another origin (a second loopback port) that the stack lists in ALLOWED_ORIGINS."""
    return f"http://127.0.0.1:{free_port()}"


@pytest.fixture(scope="module")
def stack(base_env, tmp_path_factory, embedding_origin):
    directory = tmp_path_factory.mktemp("stack")
    running = Stack(base_env, directory, with_oauth=True, ALLOWED_ORIGINS=embedding_origin).start()
    yield running
    running.stop()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    """Mark a test whose setup or call failed, for `new_context` to keep its pages' screenshots."""
    report = yield
    if report.failed:
        item.stash[FAILED] = True
    return report


@pytest.fixture
def new_context(browser, request):
    """Browser contexts (each a separate device), with a screenshot of every page kept at the end if the test
    failed (or BROWSER_SCREENSHOTS=all)."""
    contexts = []

    def make():
        context = browser.new_context()
        context.set_default_timeout(10_000)
        contexts.append(context)
        return context

    yield make
    keep = SCREENSHOTS_OF_EVERY_TEST or request.node.stash.get(FAILED, False)
    if keep:
        ARTIFACTS.mkdir(exist_ok=True)
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", request.node.name)
    for c, context in enumerate(contexts):
        for p, page in enumerate(context.pages):
            if keep and not page.is_closed():
                page.screenshot(path=str(ARTIFACTS / f"{name}-{c}-{p}.png"), full_page=True)
        context.close()


def pytest_terminal_summary(terminalreporter):
    if ARTIFACTS.exists() and any(ARTIFACTS.glob("*.png")):
        terminalreporter.write_line(f"browser test screenshots (last state of each page): {ARTIFACTS}")


def age_the_login(context, redis_url: str, seconds: float) -> None:
    """Make the page's session's last login `seconds` older, as time passing would."""
    access = next(c["value"] for c in context.cookies() if c["name"] == "__Host-access")
    claims = json.loads(base64.urlsafe_b64decode(access.split(".")[1] + "=="))
    key = Keys.session(claims["sub"], claims["sid"])
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    client.hset(key, "authenticated_at", f"{float(client.hget(key, 'authenticated_at')) - seconds:.3f}")
