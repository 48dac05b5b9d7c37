"""make run's mail catcher (scripts/mailcatcher.py) on its own: SMTP in, a page and console lines out."""

from __future__ import annotations

import signal
import smtplib
import subprocess
from email.message import EmailMessage

import pytest
import requests

from tests.servers import ROOT, VENV_BIN, free_port, process_env, wait_until


@pytest.fixture
def catcher():
    smtp_port, web_port = free_port(), free_port()
    command = [str(VENV_BIN / "python"), "scripts/mailcatcher.py"]
    process = subprocess.Popen(
        [*command, "--smtp-port", str(smtp_port), "--web-port", str(web_port)],
        cwd=ROOT,
        env=process_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    page = f"http://127.0.0.1:{web_port}/"
    wait_until(lambda: requests.get(page, timeout=1).ok, message="the mail catcher's page")
    yield {"process": process, "smtp_port": smtp_port, "page": page}
    if process.poll() is None:
        process.kill()
        process.wait(10)


def send(port: int, to: str, subject: str, text: str) -> None:
    message = EmailMessage()
    message["From"], message["To"], message["Subject"] = "auth-rt <no-reply@localhost>", to, subject
    message.set_content(text)
    message.add_alternative("<p>the HTML part is not shown</p>", subtype="html")
    with smtplib.SMTP("127.0.0.1", port, timeout=10) as smtp:
        smtp.send_message(message)


def test_mails_are_shown_newest_first_escaped_with_their_links_clickable(catcher):
    send(catcher["smtp_port"], "first@example.com", "Confirm your e-mail address", "Open http://127.0.0.1:1/a.")
    link = "http://127.0.0.1:8080/reset-password#token=abc.DEF-123_x"
    send(catcher["smtp_port"], "second@example.com", "Reset <b>your</b> password", f"Open:\n\n{link}\n\n<script>")

    page = requests.get(catcher["page"], timeout=5)
    assert page.headers["Content-Security-Policy"].startswith("default-src 'none'")
    assert page.headers["Referrer-Policy"] == "no-referrer"
    body = page.text
    assert body.index("Reset &lt;b&gt;your&lt;/b&gt; password") < body.index("Confirm your e-mail address")
    assert f'<a href="{link}">{link}</a>' in body
    assert '<a href="http://127.0.0.1:1/a">' in body  # the full stop after a link is not part of it
    assert "<script>" not in body and "&lt;script&gt;" in body
    assert "the HTML part" not in body

    # Only this machine's names are answered: another site's name pointed at 127.0.0.1 reads nothing.
    rebound = requests.get(catcher["page"], headers={"Host": "attacker.example"}, timeout=5)
    assert rebound.status_code == 400 and "reset-password" not in rebound.text

    process = catcher["process"]
    process.send_signal(signal.SIGTERM)
    output = process.communicate(timeout=10)[0]
    assert process.returncode == 0, output
    assert f"mail:    to second@example.com: Reset <b>your</b> password\n         {link}\n" in output
    assert "Traceback" not in output


def test_a_taken_port_is_one_sentence(catcher):
    taken = catcher["smtp_port"]
    result = subprocess.run(
        [str(VENV_BIN / "python"), "scripts/mailcatcher.py", "--smtp-port", str(taken), "--web-port", str(free_port())],
        cwd=ROOT,
        env=process_env(),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 1
    assert result.stderr.startswith(f"mail catcher: cannot take SMTP on 127.0.0.1:{taken}: "), result.stderr
    assert "Traceback" not in result.stderr
