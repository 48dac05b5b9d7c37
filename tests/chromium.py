"""Debian's Chromium as the tests launch it (Playwright drives it; `browser` in tests/conftest.py is the one
launched per test process: Playwright's sync API allows one at a time in a thread).

The headless shell (Debian's chromium-headless-shell, what Playwright itself runs headless) is the same engine
without the desktop browser around it: the browser tests cost it about 60% less CPU than `chromium --headless`.
A machine with only `chromium` runs them there."""

from __future__ import annotations

import shutil

CHROMIUM = shutil.which("chromium-headless-shell") or shutil.which("chromium") or "/usr/bin/chromium-headless-shell"
INSECURE_HOST = "auth-rt.test"
# As this machine's notes advise: no sandbox as root, and no background traffic to the outside.
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    # A name that is not localhost yet reaches this machine: a page there is not a secure context.
    f"--host-resolver-rules=MAP {INSECURE_HOST} 127.0.0.1",
]
