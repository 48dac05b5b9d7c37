"""README's "Your first hour", the mail, webhook and token-exchange steps, as written there, against `make run`
itself.

The commands and code are taken from README.md, so the README cannot drift from what works: only the
addresses change, to the ports this test picks. scripts/run.sh gets those ports and where to keep its data,
and nothing else: mail reaches its catcher and a loopback webhook receiver works with no setting typed.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import selectors
import signal
import subprocess
import textwrap
import time

import pytest
import requests
from playwright.sync_api import expect

from app.redis import Keys
from tests.ops.test_run_script import MakeRun, clean_env
from tests.servers import ROOT, free_port, wait_until

pytestmark = pytest.mark.not_on_cluster("runs `make run`, which starts its own single redis-server")

README = (ROOT / "README.md").read_text()
EMAIL, PASSWORD, NEW_PASSWORD = "you@example.com", "your password", "a brand new passphrase"
#: Settings a developer would otherwise have typed: none of them may reach `make run` from the test.
TYPED = ("SMTP_URL", "SMTP_STARTTLS", "PUBLIC_BASE_URL", "WEBHOOK_OUT_ALLOW_HTTP", "WEBHOOK_OUT_ALLOW_PRIVATE")


def section(heading: str) -> str:
    """The text of README's `### <heading>...` section, up to the next heading."""
    match = re.search(rf"^### {re.escape(heading)}.*?\n(.*?)(?=^#{{2,3}} )", README, re.MULTILINE | re.DOTALL)
    assert match, f"README has no section '### {heading}'"
    return match.group(1)


def blocks(text: str, language: str) -> list[str]:
    """The fenced code blocks of `text` whose info string is `language` ("" for none)."""
    found, lines, info = [], None, ""
    for line in text.splitlines(keepends=True):
        if not line.startswith("```"):
            if lines is not None:
                lines.append(line)
        elif lines is None:
            lines, info = [], line[3:].strip()
        else:
            if info == language:
                found.append("".join(lines))
            lines = None
    return found


def indented_blocks(text: str, language: str) -> list[str]:
    """The fenced code blocks of `text` with info string `language`, also those indented in a list item
    (dedented)."""
    fences = re.finditer(rf"^( *)```{re.escape(language)}\n(.*?)^\1```$", text, re.MULTILINE | re.DOTALL)
    return [textwrap.dedent(fence.group(2)) for fence in fences]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """`make run` (scripts/run.sh) on ports of this test, with no setting of the developer's."""
    started = MakeRun(tmp_path_factory.mktemp("first-hour"))
    assert not set(TYPED) & set(started.env)
    yield started
    started.kill()  # its orderly stop takes seconds, and is tests/ops/test_run_script.py's to test


def localize(text: str, run: MakeRun, **more: str) -> str:
    """README text with its addresses moved to this test's ports (each must be there to be moved)."""
    moves = {
        "127.0.0.1:8080": f"127.0.0.1:{run.ports['NGINX_PORT']}",
        "127.0.0.1:8025": f"127.0.0.1:{run.ports['MAILCATCHER_WEB_PORT']}",
        **more,
    }
    for old, new in moves.items():
        text = text.replace(old, new)
    return text


def shell(script: str, run: MakeRun, stderr: int = subprocess.STDOUT) -> subprocess.Popen:
    """A second terminal's bash in the repository, stopping at the first failing command. It has only what a
    developer's shell has, and where `make run` keeps its data (var/ for them)."""
    return subprocess.Popen(
        ["bash", "-e", "-o", "pipefail", "-c", script],
        cwd=ROOT,
        env=clean_env(DATA_DIR=str(run.data_dir)),
        stdout=subprocess.PIPE,
        stderr=stderr,
        start_new_session=True,
    )


def read_until(process: subprocess.Popen, wanted: str, timeout: float, *also: str) -> str:
    """What `process` prints, up to and including the line with `wanted` and every one of `also` (fails
    after `timeout` seconds)."""
    output = b""
    deadline = time.monotonic() + timeout
    with selectors.DefaultSelector() as selector:
        selector.register(process.stdout, selectors.EVENT_READ)
        while not all(text.encode() in output for text in (wanted, *also)):
            remaining = deadline - time.monotonic()
            assert remaining > 0, f"no {wanted!r} within {timeout} s; got:\n{output.decode(errors='replace')}"
            if selector.select(remaining):
                chunk = os.read(process.stdout.fileno(), 65536)
                assert chunk, f"the shell ended without {wanted!r}:\n{output.decode(errors='replace')}"
                output += chunk
    return output.decode(errors="replace")


CHAT = {"name": "chat", "subscribe": "authenticated", "publish": "subscribers", "presence": True, "join_leave": True}


def create_account(page, base: str, email: str) -> None:
    """Step 2's first item: an account made on the page, logged in at once."""
    page.goto(f"{base}/")
    page.get_by_label("E-mail", exact=True).fill(email)
    page.get_by_label("Password", exact=True).fill(PASSWORD)
    page.get_by_role("button", name="Create account").click()
    expect(page.locator("#status")).to_have_text(f"Logged in as {email}")


def join_the_lobby(page) -> None:
    page.get_by_label("Room", exact=True).fill("chat:lobby")
    page.get_by_role("button", name="Join", exact=True).click()
    expect(page.locator("#room-title")).to_have_text("In chat:lobby")
    expect(page.get_by_role("button", name="Send", exact=True)).to_be_enabled()


@pytest.mark.slow
def test_make_run_makes_the_chat_namespace_where_two_browsers_talk(run, browser):
    """Step 3: the namespace `chat` that make run made, with the rules of the command the README shows, and two
    newcomers in two browsers in chat:lobby, without any grant: each sees the other, both read what one says,
    and one leaving shows in the other."""
    text = section("3. Talk in a room with two browsers")
    [command] = blocks(text, "sh")
    rules = command.strip().split(" namespace-put chat ", 1)[1]
    assert f"chat_rules=({rules})" in (ROOT / "scripts" / "run.sh").read_text()  # what make run types
    assert "rooms:   chat:<name> for every logged-in user (namespace chat made" in run.log()
    listing = shell(".venv/bin/flask --app wsgi channels namespace-list\n", run, stderr=subprocess.PIPE)
    listed = [json.loads(line) for line in listing.communicate(timeout=30)[0].decode().splitlines()]
    assert CHAT in listed, listed

    contexts = [browser.new_context(), browser.new_context()]
    try:
        first, second = (context.new_page() for context in contexts)
        for page in (first, second):
            page.set_default_timeout(10_000)
        emails = [f"room-{n}-{time.monotonic_ns()}@example.com" for n in (1, 2)]
        create_account(first, run.nginx, emails[0])
        join_the_lobby(first)
        expect(first.locator("#room-count")).to_have_text("1")  # "Here now: 1": you
        expect(first.locator("#room-people li.me")).to_have_count(1)

        create_account(second, run.nginx, emails[1])
        join_the_lobby(second)
        for page in (first, second):
            expect(page.locator("#room-count")).to_have_text("2")
            expect(page.locator("#room-people li")).to_have_count(2)

        second.get_by_label("Your message").fill("Hello from the second window")
        second.get_by_role("button", name="Send", exact=True).click()
        for page in (first, second):
            expect(page.locator("#room-messages li .text")).to_have_text(["Hello from the second window"])

        second.get_by_role("button", name="Leave", exact=True).click()
        expect(first.locator("#room-count")).to_have_text("1")
    finally:
        for context in contexts:
            context.close()
    for label in ("**Rooms**", "**Join**", "**Here now: 2**", "**Your message**", "**Send**", "**Leave**"):
        assert label in text, label  # the page's words, as the README names them


@pytest.mark.slow
def test_reset_a_password_through_the_local_mail(run, browser):
    text = section("5. Reset a password through the local mail")
    [forgot] = blocks(text, "sh")
    [console] = blocks(text, "")
    assert "127.0.0.1:8080" in forgot and "http://127.0.0.1:8025/" in text
    # The account of step 2.
    register = {"email": EMAIL, "password": PASSWORD}
    assert requests.post(f"{run.nginx}/auth/register", json=register, timeout=5).status_code == 201

    asked = shell(localize(forgot, run), run, stderr=subprocess.PIPE)  # curl's progress meter apart
    answer = asked.communicate(timeout=30)[0].decode()
    assert asked.returncode == 0 and answer.startswith("HTTP/1.1 202"), answer

    # make run's console shows the mail as the README does, its link first of all.
    subject_line, link_line = localize(console, run).splitlines()
    wait_until(lambda: subject_line in run.log(), timeout=15, message="the mail on make run's console")
    assert link_line.strip().removesuffix("...") in run.log()
    # The verification mail of the registration too: the two are sent side by side, in either order.
    wait_until(lambda: "Confirm your e-mail address" in run.log(), timeout=15, message="the verification mail")

    catcher = localize("http://127.0.0.1:8025/", run)
    context = browser.new_context()
    try:
        page = context.new_page()
        page.set_default_timeout(10_000)
        page.goto(catcher)
        mails = page.get_by_role("article").filter(has_text=EMAIL)  # not those of step 3's two accounts
        expect(mails).to_have_count(2)
        reset = mails.filter(has=page.get_by_role("heading", name="Reset your password"))
        expect(mails.filter(has=page.get_by_role("heading", name="Confirm your e-mail address"))).to_have_count(1)
        reset.get_by_role("link").click()

        expect(page.get_by_role("heading", name="Choose a new password")).to_be_visible()
        page.get_by_label("New password").fill(NEW_PASSWORD)
        page.get_by_role("button", name="Set the new password").click()
        expect(page.locator("#status")).to_contain_text("Your password is changed")

        page.get_by_label("E-mail", exact=True).fill(EMAIL)
        page.get_by_label("Password", exact=True).fill(NEW_PASSWORD)
        page.get_by_role("button", name="Log in", exact=True).click()
        expect(page.locator("#status")).to_have_text(f"Logged in as {EMAIL}")
    finally:
        context.close()
    old = requests.post(f"{run.nginx}/auth/login", json=register, timeout=5)
    assert old.status_code == 401


@pytest.mark.slow
def test_receive_a_signed_webhook_then_delete_the_endpoint(run, tmp_path):
    """Step 6 in one terminal, as typed: the commands that start the receiver, then, once it has verified a
    delivery, the ones that stop it and delete the endpoint (nothing is left to retry)."""
    text = section("6. Receive a signed webhook")
    [receiver] = blocks(text, "python")
    commands, cleanup = blocks(text, "sh")
    [printed] = re.findall(r"The receiver prints `([^`]+)`", text)
    saved_as = "/tmp/receiver.py"  # noqa: S108 - where the README has a developer save it
    assert "standardwebhooks" in receiver and "verify(" in receiver and saved_as in commands
    assert "kill %1" in cleanup and "DELETE" in cleanup and "It answers `HTTP/1.1 204`" in text
    port = free_port()
    here = {
        "127.0.0.1:8090": f"127.0.0.1:{port}",
        '"127.0.0.1", 8090': f'"127.0.0.1", {port}',
        saved_as: str(tmp_path / "receiver.py"),
    }
    assert '("127.0.0.1", 8090)' in receiver and "http://127.0.0.1:8090/" in commands
    (tmp_path / "receiver.py").write_text(localize(receiver, run, **here))
    # What is left after the deletion, asked with the same key: the endpoint is not among them.
    listed = localize('curl -s http://127.0.0.1:8080/admin/webhook-endpoints -H "Authorization: Bearer $KEY"', run)

    terminal = shell_reading_stdin(run)
    try:
        typed(terminal, localize(commands, run, **here))
        # A first attempt that found no receiver is retried in 5 s; the receiver may print before the
        # command that published has printed its own line.
        output = read_until(terminal, printed, 30, "published")
        typed(terminal, localize(cleanup, run) + f'echo "endpoint $ID"\necho "left: $({listed})"\n')
        # The end of what is typed (communicate closes the shell's stdin): the shell ends.
        output += terminal.communicate(timeout=30)[0].decode(errors="replace")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(terminal.pid, signal.SIGTERM)  # the receiver, if the shell did not end it
        terminal.wait(10)
        terminal.stdout.close()
    assert "published" in output and "Traceback" not in output, output
    assert terminal.returncode == 0, output
    assert "HTTP/1.1 204" in output, output
    [endpoint_id] = re.findall(r"^endpoint (\S+)$", output, re.MULTILINE)
    left = output.rpartition("left: ")[2]
    assert left.strip().startswith("{") and endpoint_id not in left, output


def shell_reading_stdin(run: MakeRun) -> subprocess.Popen:
    """A second terminal's bash reading what is typed into it (its stdin), so that commands typed later use
    what earlier ones set and the jobs they started (`%1`)."""
    return subprocess.Popen(
        ["bash", "-e", "-o", "pipefail", "-s"],
        cwd=ROOT,
        env=clean_env(DATA_DIR=str(run.data_dir)),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def typed(terminal: subprocess.Popen, commands: str) -> None:
    terminal.stdin.write(commands.encode())
    terminal.stdin.flush()


@pytest.mark.slow
def test_a_wrong_password_in_step_4_prints_the_services_error_and_a_right_one_a_token(run):
    """Step 4's login one-liner: the token with the right password; with a wrong one, the service's error in one
    line and a failing status, no Python traceback."""
    text = section("4. Publish from the command line")
    [login] = re.findall(r"^BASE=.*?\n(?:TOKEN=\$\(.*?\n(?:  .*\n)*)", text, re.MULTILINE)
    assert '"you@example.com"' in login and '"your password"' in login
    email = f"step4-{time.monotonic_ns()}@example.com"
    register = {"email": email, "password": PASSWORD}
    assert requests.post(f"{run.nginx}/auth/register", json=register, timeout=5).status_code == 201
    mine = localize(login, run).replace("you@example.com", email)

    right = shell(mine + 'echo "token: $TOKEN"\n', run)
    output = right.communicate(timeout=30)[0].decode()
    assert right.returncode == 0 and re.search(r"^token: [\w-]+\.[\w-]+\.[\w-]+$", output, re.MULTILINE), output

    wrong = shell(mine.replace('"your password"', '"not my password"') + 'echo "token: $TOKEN"\n', run)
    output = wrong.communicate(timeout=30)[0].decode()
    assert wrong.returncode == 1, output  # bash -e: the assignment's failing status stops the script
    assert output == "error: Wrong e-mail or password.\n", output
    assert "error: Wrong e-mail or password." in text  # the README says what it prints


def test_the_operations_guide_counts_the_mail_queue_that_is_really_there(run):
    """docs/operations.md's command names the key the queue is kept under, and works on make run's Redis."""
    guide = (ROOT / "docs" / "operations.md").read_text()
    [command] = [line for line in guide.splitlines() if line.startswith("redis-cli ") and "zcard" in line]
    assert f"'{Keys.mail_queue()}'" in command and "-p 6389 " in command
    here = command.replace("-p 6389 ", f"-p {run.ports['REDIS_PORT']} ")
    counted = subprocess.run(["bash", "-c", here], capture_output=True, text=True, timeout=10, check=True)
    assert counted.stdout.strip().isdigit(), counted


@pytest.mark.slow
def test_use_it_with_the_users_you_already_have(run):
    """Every command of step 8 in one terminal: an issuer with an HMAC secret, a token made with PyJWT and
    exchanged with curl, a room Ada is granted and present in, and the grant taken back from her stream."""
    text = section("8. Use it with the users you already have")
    commands = indented_blocks(text, "sh")
    assert len(commands) == 6 and commands[0].startswith("BASE=http://127.0.0.1:8080\n")
    script = localize("".join(commands), run)
    # "sleep 1" lets the stream open on a developer's machine; on a busy test machine, wait until it has.
    present = (
        'until curl -s "$BASE/channels/rooms:design/presence" -H "Authorization: Bearer $KEY" '
        "| python3 -c 'import json, sys; sys.exit(json.load(sys.stdin)[\"count\"] < 1)'; do sleep 0.1; done\n"
    )
    assert script.count("sleep 1\n") == 2
    script = script.replace("sleep 1\n", present, 1)

    terminal = shell(script, run)
    try:
        output = read_until(terminal, '"reason": "revoked"', 60, "Hello Ada")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(terminal.pid, signal.SIGTERM)  # the stream, in the background of that shell
        terminal.wait(10)
        terminal.stdout.close()
    assert "'external': {'issuer': 'myapp', 'sub': 'ada'}" in output, output
    assert "{'email': 'ada@myapp.example', 'email_verified': False, 'external'" in output, output
    assert '"secret"' not in output and '"name":"myapp"' in output.replace(" ", ""), output
    assert '"info":{"name":"Ada"}' in output.replace(" ", ""), output  # presence lists her with her info
    joined, said, left = (output.index(text) for text in ("event: presence.join", "Hello Ada", "event: unsubscribed"))
    assert joined < said < left, output
    assert 'data: {"channel": "rooms:design", "reason": "revoked"}' in output, output
    assert "Traceback" not in output and "% Total" not in output, output


def test_a_refused_exchange_in_step_8_prints_the_services_reason_not_a_traceback(run):
    """Step 8's commands up to the exchange, with a token signed by another secret: the exchange's error
    description in one line and a failing status; the access token and Ada's id are never read from it."""
    commands = indented_blocks(section("8. Use it with the users you already have"), "sh")
    script = localize("".join(commands[:4]), run)
    assert script.count('os.environ["SECRET"]') == 1
    script = script.replace('os.environ["SECRET"]', '"another secret of more than 32 bytes, not the one saved"')
    terminal = shell(script + 'echo "reached: ${TOKEN:-no token}"\n', run)
    output = terminal.communicate(timeout=60)[0].decode()
    assert terminal.returncode == 1, output
    assert re.search(r"^error: .*signature", output, re.MULTILINE | re.IGNORECASE), output
    assert "Traceback" not in output and "reached:" not in output, output
