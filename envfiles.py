"""Settings files beneath the real environment, for every process: gunicorn.conf.py (before gunicorn reads
PORT, WEB_CONCURRENCY or LOG_LEVEL), wsgi.py (before the app is imported) and so worker.py and the CLI.

Each variable comes from the first of these that names it, even with an empty value (which then means the
setting's own default); with APP_ENV=production in the real environment, from the environment alone (a file
that says APP_ENV=production stops the process instead: production is declared where its settings are):

1. the real environment (the shell, the platform, systemd);
2. `.env` beside this file: the developer's own settings, kept across restarts (git-ignored; start from
   `.env.example`). ENV_FILE names another file instead, or, set empty, none;
3. `$DATA_DIR/.env` (default var/.env), which `make run` writes at each start: its development defaults (its
   Redis, its mail catcher, loopback webhook receivers allowed, its metrics directory).

The `flask` command loads `.flaskenv` and `.env` from its working directory upward (and its --env-file)
before it imports the app: that is taken back first, so the CLI reads what gunicorn and the delivery process
read, in every environment.

`python envfiles.py` prints layer 2 as shell `export` lines for scripts/run.sh, which so hands the developer's
settings to nginx and the mail catcher as well.
"""

import os
import re
import shlex
import sys
from collections.abc import Mapping, MutableMapping
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VARIABLE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
PRODUCTION_IN_A_FILE = (
    "{}: APP_ENV=production is set in a settings file; production reads none: set APP_ENV=production, "
    "and every other setting, in the environment"
)


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


def startup_environment() -> dict[str, str] | None:
    """The environment this process was started with, before anything in it changed os.environ (Linux: the
    kernel keeps it in /proc/self/environ); None where that cannot be read."""
    try:
        block = Path("/proc/self/environ").read_bytes()
    except OSError:
        return None
    pairs = (entry.partition(b"=") for entry in block.split(b"\0") if entry)
    return {os.fsdecode(name): os.fsdecode(value) for name, _, value in pairs}


def flask_cli_env_files() -> list[Path]:
    """The settings files the `flask` command of this process loaded before it imported the app: `.flaskenv`
    and `.env` from the working directory upward, and its --env-file. None outside the Flask CLI, or without
    python-dotenv (then Flask loads nothing)."""
    if "flask.cli" not in sys.modules:
        return []
    import click
    from flask.cli import ScriptInfo

    context = click.get_current_context(silent=True)
    if context is None or context.find_object(ScriptInfo) is None:
        return []
    try:
        import dotenv
    except ImportError:
        return []
    found = [dotenv.find_dotenv(name, usecwd=True) for name in (".flaskenv", ".env")]
    found.append(context.find_root().params.get("env_file"))
    return [Path(path) for path in found if path]


def take_back_flask_env_files(environ: MutableMapping[str, str], started: Mapping[str, str] | None) -> None:
    """Remove from `environ` what the `flask` command set from its settings files: a name they hold that the
    environment the process `started` with did not (where that is unknown: a name holding the file's value).

    Raises EnvFileError when one of them said APP_ENV=production.
    """
    for path in flask_cli_env_files():
        import dotenv  # there are such files only where python-dotenv is installed

        for name, value in dotenv.dotenv_values(path, interpolate=False).items():
            came_from_file = name not in started if started is not None else environ.get(name) == value
            if not came_from_file or name not in environ:
                continue
            if name == "APP_ENV" and environ[name] == "production":
                raise EnvFileError(PRODUCTION_IN_A_FILE.format(path))
            del environ[name]


def refuse_production_in(found: dict[str, str], source: Path, environ: Mapping[str, str]) -> None:
    """EnvFileError when the file `source` would make this process a production one (APP_ENV unset above it)."""
    if "APP_ENV" not in environ and found.get("APP_ENV") == "production":
        raise EnvFileError(PRODUCTION_IN_A_FILE.format(source))


def fill_in(environ: MutableMapping[str, str], found: dict[str, str], source: Path) -> None:
    """Set the names `environ` leaves unset to what the file `source` says; a file may not declare production."""
    refuse_production_in(found, source, environ)
    for name, value in found.items():
        environ.setdefault(name, value)


def apply_env_files(environ: MutableMapping[str, str] = os.environ) -> None:
    """Fill in the variables `environ` leaves unset: from the developer's file, then from `make run`'s.

    Not in production (APP_ENV=production in the real environment): a working tree copied to a server
    must not bring `make run`'s development defaults along, loopback webhooks and plain-text mail among them.
    Whatever the `flask` command loaded from its own settings files is taken back first, in every environment.
    """
    if environ is os.environ:
        take_back_flask_env_files(environ, startup_environment())
    if environ.get("APP_ENV") == "production":
        return
    developer = developer_env_file(environ)
    if developer is not None:
        fill_in(environ, developer_settings(environ), developer)
    # DATA_DIR as the two layers above say: the developer's .env may move it.
    make_runs = Path(environ.get("DATA_DIR") or "var") / ".env"
    fill_in(environ, read_env_file(make_runs), make_runs)


def shell_exports(environ: MutableMapping[str, str]) -> str:
    """The developer's file as `export NAME=value` lines (quoted for a shell), for the names `environ` leaves unset."""
    found = developer_settings(environ)
    if found:
        refuse_production_in(found, developer_env_file(environ), environ)
    return "".join(f"export {name}={shlex.quote(value)}\n" for name, value in found.items() if name not in environ)


if __name__ == "__main__":  # scripts/run.sh: `exports=$(python envfiles.py)`, then `eval "$exports"`
    try:
        sys.stdout.write(shell_exports(os.environ))
    except EnvFileError as error:
        print(f"configuration error: {error}", file=sys.stderr)
        raise SystemExit(4) from None
