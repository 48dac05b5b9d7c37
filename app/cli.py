"""Operator commands: `flask --app wsgi users create` (and, with the event bus, `events publish`)."""

from __future__ import annotations

import click
from flask import Flask

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
