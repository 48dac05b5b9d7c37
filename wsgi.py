"""The entry point of every process: `gunicorn -c gunicorn.conf.py wsgi:app` and `flask --app wsgi ...`.

Before the app is imported, $DATA_DIR/.env (default var/.env, written by `make run`) is applied beneath
the real environment: the CLI then talks to the Redis `make run` started and counts its metrics where
that server's /metrics reads them. It has to happen first because prometheus_client chooses its
multi-process mode from PROMETHEUS_MULTIPROC_DIR when it is imported. Real variables always win.
"""

import logging
import os
from pathlib import Path


def read_env_file(path: Path) -> dict[str, str]:
    """NAME=value lines (blank lines and # comments skipped, one level of quotes removed)."""
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        return {}
    found = {}
    for line in lines:
        name, sep, value = line.strip().partition("=")
        if sep and name and not name.startswith("#"):
            value = value.strip()
            if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
                value = value[1:-1]
            found[name.strip()] = value
    return found


for _name, _value in read_env_file(Path(os.environ.get("DATA_DIR") or "var") / ".env").items():
    os.environ.setdefault(_name, _value)
if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
    os.makedirs(os.environ["PROMETHEUS_MULTIPROC_DIR"], exist_ok=True)  # a cleaned var/ must not stop the CLI

from app import create_app  # noqa: E402 - after the environment is complete
from app.settings import SettingsError  # noqa: E402

try:
    app = create_app()
except SettingsError as error:
    # A sentence, not a traceback: a JSON line under gunicorn, plain text on the command line. Status 4 is
    # what gunicorn's arbiter reads as "the app failed to load": it stops, instead of starting one failing
    # worker after another.
    logging.getLogger("wsgi").critical("configuration error: %s", error)
    raise SystemExit(4) from None
