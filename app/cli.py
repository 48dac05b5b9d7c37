"""Operator commands: `flask --app wsgi users create` and `flask --app wsgi events publish`."""

from __future__ import annotations

import json

import click
from flask import Flask, current_app

from .errors import ApiError


def init_app(app: Flask) -> None:
    users_group = click.Group("users", help="Manage user accounts.")

    @users_group.command("create")
    @click.option("--email", required=True)
    @click.option("--password", required=True, help="At least 8 characters.")
    @click.option("--role", type=click.Choice(["user", "admin"]), default="user", show_default=True)
    def create_user_command(email: str, password: str, role: str):
        """Create a user with a password."""
        from .auth.users import create_user

        try:
            user = create_user(email, password, role)
        except ApiError as error:
            raise click.ClickException(error.message) from None
        click.echo(f"created {user['role']} {user['email']} ({user['id']})")

    app.cli.add_command(users_group)

    events_group = click.Group("events", help="Operate the event bus.")

    @events_group.command("publish")
    @click.option("--channel", required=True, help="user:<id>, broadcast, or any channel name.")
    @click.option("--event", "event_name", required=True)
    @click.option("--data", default="null", show_default=True, help="A JSON value.")
    def publish_command(channel: str, event_name: str, data: str):
        """Publish an event to a channel, as an admin would."""
        try:
            value = json.loads(data)
        except ValueError:
            raise click.BadParameter("must be JSON", param_hint="--data") from None
        try:
            published = current_app.extensions["event_bus"].publish(channel, event_name, value)
        except ApiError as error:
            raise click.ClickException(error.message) from None
        click.echo(f"published {published.id} to {published.channel}")

    app.cli.add_command(events_group)
