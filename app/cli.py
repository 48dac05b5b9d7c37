"""Operator commands: `flask --app wsgi users ...`, `events publish` and `api-keys ...`."""

from __future__ import annotations

import functools
import json
from urllib.parse import urlsplit, urlunsplit

import click
import redis
from flask import Flask, current_app

from .errors import ApiError


def init_app(app: Flask) -> None:
    """Add the `users`, `events` and `api-keys` command groups to `flask`."""
    users_group = click.Group("users", help="Manage user accounts.")

    @users_group.command("create")
    @click.option("--email", required=True)
    @click.option("--password", required=True, help="At least 8 characters.")
    @click.option("--role", type=click.Choice(["user", "admin"]), default="user", show_default=True)
    @_one_line_errors
    def create_user_command(email: str, password: str, role: str):
        """Create a user with a password."""
        from .auth.users import create_user

        user = create_user(email, password, role)
        click.echo(f"created {user['role']} {user['email']} ({user['id']})")

    app.cli.add_command(users_group)

    events_group = click.Group("events", help="Operate the event bus.")

    @events_group.command("publish")
    @click.option("--channel", required=True, help="user:<id>, broadcast, or any channel name.")
    @click.option("--event", "event_name", required=True)
    @click.option("--data", default="null", show_default=True, help="A JSON value.")
    @_one_line_errors
    def publish_command(channel: str, event_name: str, data: str):
        """Publish an event to a channel, as an admin would."""
        try:
            value = json.loads(data)
        except ValueError:
            raise click.BadParameter("must be JSON", param_hint="--data") from None
        published = current_app.extensions["event_bus"].publish(channel, event_name, value)
        click.echo(f"published {published.id} to {published.channel}")

    app.cli.add_command(events_group)

    keys_group = click.Group("api-keys", help="Manage the API keys backends use.")

    @keys_group.command("create")
    @click.option("--name", required=True, help="What uses the key, e.g. 'billing backend'.")
    @click.option("--scope", "scopes", multiple=True, required=True, help="events:publish, tokens:introspect, ...")
    @click.option("--channel", "channels", multiple=True, help="Where events:publish may publish: a name, user:* or *.")
    @_one_line_errors
    def create_key_command(name: str, scopes: tuple[str, ...], channels: tuple[str, ...]):
        """Create a key and print it: it is shown this once, and only its SHA-256 is kept."""
        from .apikeys.store import create_key

        raw, key = create_key(name, list(scopes), list(channels))
        click.echo(raw)
        click.echo(f"id {key['id']}, scopes {' '.join(key['scopes'])}", err=True)

    @keys_group.command("list")
    @_one_line_errors
    def list_keys_command():
        """List the keys (never the keys themselves)."""
        from .apikeys.store import list_keys

        for key in list_keys():
            channels = ",".join(key["channels"]) or "-"
            click.echo(
                f"{key['id']}  {key['name']}  {' '.join(key['scopes'])}  {channels}  last used {key['last_used_at']}"
            )

    @keys_group.command("delete")
    @click.argument("key_id")
    @_one_line_errors
    def delete_key_command(key_id: str):
        """Delete a key: it stops working at once, everywhere."""
        from .apikeys.store import delete_key

        if not delete_key(key_id):
            raise click.ClickException(f"no API key with id {key_id}")
        click.echo(f"deleted {key_id}")

    app.cli.add_command(keys_group)


def _one_line_errors(command):
    """An operator gets one line saying what went wrong and what to do, not a traceback."""

    @functools.wraps(command)
    def run(*args, **kwargs):
        try:
            return command(*args, **kwargs)
        except ApiError as error:
            raise click.ClickException(error.message) from None
        except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError) as error:
            url = _without_password(current_app.config["SETTINGS"].redis_url)
            raise click.ClickException(
                f"cannot reach Redis at {url} ({_first_line(error)}): start it (`make run` starts one and "
                "writes its URL to var/.env, which this command reads) or set REDIS_URL"
            ) from None

    return run


def _without_password(url: str) -> str:
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{parts.username or ''}:***@{host}"))


def _first_line(error: Exception) -> str:
    text = str(error).strip() or type(error).__name__
    return text.splitlines()[0]
