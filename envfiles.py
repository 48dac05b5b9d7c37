"""Settings files beneath the real environment, for every process: gunicorn.conf.py (before gunicorn reads
PORT, WEB_CONCURRENCY or LOG_LEVEL), wsgi.py (before the app is imported) and so worker.py and the CLI.

Each variable comes from the first of these that names it, even with an empty value (which then means the
setting's own default); with APP_ENV=production in the real environment, from the environment alone:

1. the real environment (the shell, the platform, systemd);
2. `.env` beside this file: the developer's own settings, kept across restarts (git-ignored; start from
   `.env.example`). ENV_FILE names another file instead, or, set empty, none;
3. `$DATA_DIR/.env` (default var/.env), which `make run` writes at each start: its development defaults (its
   Redis, its mail catcher, loopback webhook receivers allowed, its metrics directory).

`python envfiles.py` prints layer 2 as shell `export` lines for scripts/run.sh, which so hands the developer's
settings to nginx and the mail catcher as well.
"""

import os
import re
import shlex
import sys
from collections.abc import MutableMapping
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VARIABLE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class EnvFileError(ValueError):
    """A line of a settings file that is not NAME=value."""


def read_env_file(path: Path) -> dict[str, str]:
    """NAME=value lines of a file, or {} when there is none.

    Blank lines and lines starting with # are skipped, `export ` before a name is allowed, one pair of quotes
    around a value is removed, and nothing else is interpreted: no $VAR expansion, no escapes, no comment after
    a value.
    """
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        return {}
    found = {}
    for number, line in enumerate(lines, start=1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        name, sep, value = line.removeprefix("export ").partition("=")
        name, value = name.strip(), value.strip()
        if not sep or not VARIABLE_NAME.fullmatch(name):
            raise EnvFileError(f"{path}, line {number}: expected NAME=value")  # the line itself may hold a secret
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        found[name] = value
    return found


def developer_env_file(environ: MutableMapping[str, str]) -> Path | None:
    """The developer's settings file: `.env` beside this file, or what ENV_FILE names (set empty: none)."""
    if "ENV_FILE" in environ:
        return Path(environ["ENV_FILE"]) if environ["ENV_FILE"].strip() else None
    return ROOT / ".env"


def developer_settings(environ: MutableMapping[str, str]) -> dict[str, str]:
    """What the developer's file says, less ENV_FILE: only the real environment chooses the file."""
    developer = developer_env_file(environ)
    found = read_env_file(developer) if developer else {}
    found.pop("ENV_FILE", None)
    return found


def apply_env_files(environ: MutableMapping[str, str] = os.environ) -> None:
    """Fill in the variables `environ` leaves unset: from the developer's file, then from `make run`'s.

    Not in production (APP_ENV=production in the real environment): a working tree copied to a server
    must not bring `make run`'s development defaults along, loopback webhooks and plain-text mail among them.
    """
    if environ.get("APP_ENV") == "production":
        return
    for name, value in developer_settings(environ).items():
        environ.setdefault(name, value)
    # DATA_DIR as the two layers above say: the developer's .env may move it.
    for name, value in read_env_file(Path(environ.get("DATA_DIR") or "var") / ".env").items():
        environ.setdefault(name, value)


def shell_exports(environ: MutableMapping[str, str]) -> str:
    """The developer's file as `export NAME=value` lines (quoted for a shell), for the names `environ` leaves unset."""
    found = developer_settings(environ)
    return "".join(f"export {name}={shlex.quote(value)}\n" for name, value in found.items() if name not in environ)


if __name__ == "__main__":  # scripts/run.sh: `exports=$(python envfiles.py)`, then `eval "$exports"`
    try:
        sys.stdout.write(shell_exports(os.environ))
    except EnvFileError as error:
        print(f"configuration error: {error}", file=sys.stderr)
        raise SystemExit(4) from None
