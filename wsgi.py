"""The entry point of every process: `gunicorn -c gunicorn.conf.py wsgi:app`, `flask --app wsgi ...` and, by
importing this, `python worker.py`.

Before the app is imported, the settings files fill in what the real environment leaves unset (envfiles.py:
the developer's `.env`, then `make run`'s `$DATA_DIR/.env`; none with APP_ENV=production), after what the
`flask` command loaded from its own `.env` and `.flaskenv` is taken back. So the CLI talks to the Redis `make run`
started and counts its metrics where that server's /metrics reads them. It has to happen first because
prometheus_client chooses its multi-process mode from PROMETHEUS_MULTIPROC_DIR when it is imported.
"""

import logging
import os
from typing import NoReturn

from envfiles import EnvFileError, apply_env_files


def _refuse(error: Exception) -> NoReturn:
    # A sentence, not a traceback: a JSON line under gunicorn, plain text on the command line. Status 4 is what
    # gunicorn's arbiter reads as "the app failed to load": it stops, instead of starting one failing worker
    # after another.
    logging.getLogger("wsgi").critical("configuration error: %s", error)
    raise SystemExit(4) from None


try:
    apply_env_files()
except EnvFileError as error:
    _refuse(error)
if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
    os.makedirs(os.environ["PROMETHEUS_MULTIPROC_DIR"], exist_ok=True)  # a cleaned var/ must not stop the CLI

from app import create_app  # noqa: E402 - after the environment is complete
from app.settings import SettingsError  # noqa: E402

try:
    app = create_app()
except SettingsError as error:
    _refuse(error)
