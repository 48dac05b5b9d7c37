"""Operator commands: `flask --app wsgi users ...`, `events publish`, `api-keys ...`, `channels ...`,
`clients ...`, `keys ...` and `redis migrate-keys`."""

from __future__ import annotations

import functools
import json

import click
import redis
from flask import Flask, current_app

from . import audit
from .channels.namespaces import PUBLISH_RULES, SUBSCRIBE_RULES
from .errors import ApiError
from .redis import describe_redis, redis_error, redis_url_setting


def init_app(app: Flask) -> None:
    """Add the `users`, `events`, `api-keys`, `channels`, `clients`, `keys` and `redis` command groups to `flask`."""
    users_group = click.Group("users", help="Manage user accounts.")

    @users_group.command("create")
    @click.option("--email", required=True)
    @click.option("--password", required=True, help="At least 8 characters.")
    @click.option("--role", type=click.Choice(["user", "admin"]), default="user", show_default=True)
    @click.option("--verified", is_flag=True, help="Count the address as verified (no mail is sent either way).")
    @_one_line_errors
    def create_user_command(email: str, password: str, role: str, verified: bool):
        """Create a user with a password."""
        from .auth.emails import NotPlainAddress, plain_address
        from .auth.users import create_user

        try:
            email = plain_address(email)
        except NotPlainAddress as refusal:
            raise click.ClickException(f"The e-mail address is refused: {refusal}.") from None
        user = create_user(email, password, role, email_verified=verified)
        click.echo(f"created {user['role']} {user['email']} ({user['id']})")

    @users_group.command("list")
    @click.option("--email", help="Only the user with this address.")
    @click.option("--limit", type=click.IntRange(1, 100000), default=100, show_default=True)
    @_one_line_errors
    def list_users_command(email: str | None, limit: int):
        """List users, newest first: id, e-mail, role, verified, MFA, created."""
        from .auth.users import admin_view, list_users

        for user in map(admin_view, list_users(email=email, limit=limit)):
            verified = "verified" if user["email_verified"] else "unverified"
            mfa = "mfa" if user["mfa_enabled"] else "-"
            click.echo(f"{user['id']}  {user['email']}  {user['role']}  {verified}  {mfa}  {user['created_at']}")

    @users_group.command("set-role")
    @click.argument("user")
    @click.argument("role", type=click.Choice(["user", "admin"]))
    @_one_line_errors
    def set_role_command(user: str, role: str):
        """Change the role of USER (an id or an e-mail address); it applies on their next request."""
        from .auth.users import set_role

        found = _user_or_fail(user)
        set_role(found["id"], role)
        click.echo(f"{found['email']} ({found['id']}) is now {role}")

    @users_group.command("revoke-sessions")
    @click.argument("user")
    @_one_line_errors
    def revoke_sessions_command(user: str):
        """Log USER out on every device at once (live connections close too)."""
        from .auth.sessions import logout_all

        found = _user_or_fail(user)
        logout_all(found["id"])
        click.echo(f"ended every session of {found['email']} ({found['id']})")

    @users_group.command("reset-mfa")
    @click.argument("user")
    @_one_line_errors
    def reset_mfa_command(user: str):
        """Turn USER's two-factor authentication off and end every session (the owner is mailed)."""
        from .auth.mfa import reset

        found = _user_or_fail(user)
        reset(found["id"])
        click.echo(f"two-factor authentication is off for {found['email']} ({found['id']}); every session ended")

    @users_group.command("delete")
    @click.argument("user")
    @click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
    @_one_line_errors
    def delete_user_command(user: str, yes: bool):
        """Delete USER and every record of theirs; their sessions end at once."""
        from .auth.users import delete_user

        found = _user_or_fail(user)
        if not yes:
            click.confirm(f"Delete {found['email']} ({found['id']}) and all their records?", abort=True)
        delete_user(found["id"])
        click.echo(f"deleted {found['email']} ({found['id']})")

    @users_group.command("import")
    @click.argument("file", type=click.Path(exists=True, dir_okay=False, allow_dash=True))
    @click.option("--dry-run", is_flag=True, help="Check every line and report what would happen; change nothing.")
    @_one_line_errors
    def import_users_command(file: str, dry_run: bool):
        """Import users from FILE ('-': standard input), one JSON object a line: email, password_hash (bcrypt,
        Django pbkdf2_sha256 or argon2, kept as it is), email_verified, role, id, created_at. Prints each line
        refused (and why) or already present (left unchanged), then a summary; exits 1 if a line was refused."""
        from .auth.transfer import import_lines

        with click.open_file(file, "rb") as lines:
            report = import_lines(lines, dry_run=dry_run)
        for line in report.lines():
            click.echo(line)
        click.echo(report.summary(dry_run))
        if report.refused:
            raise click.exceptions.Exit(1)

    @users_group.command("export")
    @click.option("--output", "-o", type=click.Path(dir_okay=False), help="A new file, readable by its owner only.")
    @_one_line_errors
    def export_users_command(output: str | None):
        """Write every user that logs in with an address, password hashes included, as JSON lines (the format
        `users import` reads), to standard output or a new file."""
        from .auth.transfer import export_lines, open_private

        count = 0
        try:
            target = open_private(output) if output else None
        except FileExistsError:
            raise click.ClickException(f"{output} exists: export to a new file") from None
        try:
            for line in export_lines():
                click.echo(line, file=target)
                count += 1
        finally:
            if target is not None:
                target.close()
            # Every hash left the service, even when writing stopped part-way: an auditor should know.
            audit.record("users.exported", details={"users": count, "to": "file" if output else "stdout"})
        click.echo(f"exported {count} users", err=True)

    @users_group.command("reindex")
    @_one_line_errors
    def reindex_users_command():
        """Add every user to the search by e-mail prefix (for users made by a version before it); safe to repeat."""
        from .auth.indexes import build_email_order
        from .redis import get_redis

        click.echo(f"indexed {build_email_order(get_redis())} users that were missing from the e-mail search")

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
    @click.option(
        "--channel",
        "channels",
        multiple=True,
        help="Where events:publish may publish: a channel name, <namespace>:* (user:* every user's) or *.",
    )
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

    channels_group = click.Group("channels", help="Manage namespaces and who is granted their channels.")

    @channels_group.command("namespace-put")
    @click.argument("namespace")
    @click.option("--subscribe", type=click.Choice(SUBSCRIBE_RULES), default="members", show_default=True)
    @click.option("--publish", type=click.Choice(PUBLISH_RULES), default="server", show_default=True)
    @click.option("--presence", is_flag=True, help="Keep who reads its channels.")
    @click.option("--join-leave", is_flag=True, help="Publish presence.join and presence.leave (needs --presence).")
    @click.option(
        "--presence-diff",
        is_flag=True,
        help="Joins and leaves together, one presence.diff at a time (needs --join-leave).",
    )
    @click.option("--proxy-url", help="With --subscribe proxy: the application's URL asked about each subscriber.")
    @click.option("--rotate-proxy-secret", is_flag=True, help="With --subscribe proxy: a new signing secret.")
    @click.option("--keep-existing", is_flag=True, help="Leave the namespace as it is if there is one (and say so).")
    @_one_line_errors
    def namespace_put_command(
        namespace: str,
        subscribe: str,
        publish: str,
        presence: bool,
        join_leave: bool,
        presence_diff: bool,
        proxy_url: str | None,
        rotate_proxy_secret: bool,
        keep_existing: bool,
    ):
        """Create NAMESPACE or replace its rules (open subscriptions are checked again). A proxy namespace's
        signing secret is printed (as proxy_secret) by the command that makes it, never again."""
        from .channels.namespaces import Namespace, get_namespace
        from .channels.proxy import define
        from .redis import get_redis

        existing = get_namespace(get_redis(), namespace) if keep_existing else None
        if existing is not None:
            click.echo(json.dumps(existing.answer()))
            click.echo(f"namespace {namespace} exists: kept as it is", err=True)
            return
        rules = Namespace(
            namespace,
            subscribe,
            publish,
            presence,
            join_leave,
            proxy_url,
            rotate_secret=rotate_proxy_secret,
            presence_diff=presence_diff,
        )
        click.echo(json.dumps(define(rules)))

    @channels_group.command("namespace-list")
    @_one_line_errors
    def namespace_list_command():
        """List the namespaces, one JSON object a line."""
        from .channels.namespaces import list_namespaces
        from .redis import get_redis

        for namespace in list_namespaces(get_redis()):
            click.echo(json.dumps(namespace.answer()))

    @channels_group.command("namespace-delete")
    @click.argument("namespace")
    @_one_line_errors
    def namespace_delete_command(namespace: str):
        """Delete NAMESPACE: open subscriptions to its channels end."""
        from .channels.manage import remove_namespace

        remove_namespace(namespace)
        click.echo(f"deleted namespace {namespace}")

    @channels_group.command("grant")
    @click.argument("channel")
    @click.argument("user")
    @click.option("--info", help="A JSON object shown in presence (at most 1 KiB).")
    @click.option("--expires-in", type=click.FloatRange(min=0, min_open=True), help="Seconds until it runs out.")
    @_one_line_errors
    def grant_command(channel: str, user: str, info: str | None, expires_in: float | None):
        """Grant USER (an id or an e-mail address) CHANNEL (<namespace>:<name>)."""
        from .channels.manage import grant_member

        found = _user_or_fail(user)
        try:
            value = json.loads(info) if info is not None else None
        except ValueError:
            raise click.BadParameter("must be a JSON object", param_hint="--info") from None
        if value is not None and not isinstance(value, dict):
            raise click.BadParameter("must be a JSON object", param_hint="--info")
        grant_member(channel, found["id"], value, expires_in)
        click.echo(f"granted {channel} to {found['email']} ({found['id']})")

    @channels_group.command("revoke")
    @click.argument("channel")
    @click.argument("user")
    @_one_line_errors
    def revoke_command(channel: str, user: str):
        """Take CHANNEL away from USER (an id or an e-mail address); their open subscriptions end."""
        from .channels.manage import revoke_member

        found = _user_or_fail(user)
        revoke_member(channel, found["id"])
        click.echo(f"revoked {channel} from {found['email']} ({found['id']})")

    @channels_group.command("members")
    @click.argument("channel")
    @_one_line_errors
    def members_command(channel: str):
        """List CHANNEL's grants in force: user id, expiry (or -), info."""
        from .channels.grants import members
        from .channels.manage import namespace_of
        from .redis import get_redis

        namespace_of(channel)
        for member in members(get_redis(), channel):
            info = json.dumps(member["info"]) if member["info"] is not None else "-"
            click.echo(f"{member['user_id']}  {member['expires_at'] or '-'}  {info}")

    app.cli.add_command(channels_group)

    from .oidc.clients import GRANT_TYPES, SCOPES, TYPES

    clients_group = click.Group("clients", help="Manage the applications that log users in with this service.")

    @clients_group.command("create")
    @click.option("--name", required=True, help="Shown to users when they are asked for consent.")
    @click.option("--type", "client_type", type=click.Choice(TYPES), required=True)
    @click.option("--redirect-uri", "redirect_uris", multiple=True, help="An exact redirect URI (repeat for more).")
    @click.option(
        "--grant-type",
        "grant_types",
        multiple=True,
        type=click.Choice(GRANT_TYPES),
        help="Default: authorization_code and refresh_token.",
    )
    @click.option(
        "--scope",
        "scopes",
        multiple=True,
        type=click.Choice(SCOPES),
        help="What it may ask for (default: openid).",
    )
    @click.option("--post-logout-redirect-uri", "logout_uris", multiple=True, help="Where logout may send users.")
    @click.option("--backchannel-logout-uri", help="Where logout tokens are POSTed (the outgoing webhooks' rules).")
    @click.option("--first-party", is_flag=True, help="The product's own application: no consent page.")
    @click.option("--audience", help="The aud of its access tokens (default: its client_id).")
    @_one_line_errors
    def create_client_command(
        name: str,
        client_type: str,
        redirect_uris: tuple[str, ...],
        grant_types: tuple[str, ...],
        scopes: tuple[str, ...],
        logout_uris: tuple[str, ...],
        backchannel_logout_uri: str | None,
        first_party: bool,
        audience: str | None,
    ):
        """Register a client; print its client_id and, for a confidential client, its secret (shown this once)."""
        from .oidc.clients import DEFAULT_GRANT_TYPES, DEFAULT_SCOPES, OAuthClient, create_client

        asked = OAuthClient(
            client_id="",
            name=name,
            type=client_type,
            redirect_uris=redirect_uris,
            grant_types=grant_types or DEFAULT_GRANT_TYPES,
            scopes=scopes or DEFAULT_SCOPES,
            post_logout_redirect_uris=logout_uris,
            backchannel_logout_uri=backchannel_logout_uri,
            first_party=first_party,
            audience=audience or "",
        )
        client, secret = create_client(asked)
        click.echo(f"client_id {client.client_id}")
        if secret is not None:
            click.echo(f"client_secret {secret}")
            click.echo("the secret is shown this once: only its SHA-256 is kept", err=True)

    @clients_group.command("list")
    @_one_line_errors
    def list_clients_command():
        """List the clients, oldest first, one JSON object a line (never a secret)."""
        from .oidc.clients import list_clients

        for client in list_clients():
            click.echo(json.dumps(client.answer()))

    @clients_group.command("delete")
    @click.argument("client_id")
    @_one_line_errors
    def delete_client_command(client_id: str):
        """Delete CLIENT_ID: every token and session issued to it ends."""
        from .oidc.clients import delete_client

        if not delete_client(client_id):
            raise click.ClickException(f"no OAuth client with id {client_id}")
        click.echo(f"deleted {client_id}")

    @clients_group.command("rotate-secret")
    @click.argument("client_id")
    @_one_line_errors
    def rotate_client_secret_command(client_id: str):
        """Give CLIENT_ID (a confidential client) a new secret and print it; the old one stops working at once."""
        from .oidc.clients import rotate_secret

        secret = rotate_secret(client_id)
        if secret is None:
            raise click.ClickException(f"no OAuth client with id {client_id}")
        click.echo(f"client_secret {secret}")

    app.cli.add_command(clients_group)

    signing_keys_group = click.Group("keys", help="Manage the OpenID provider's signing keys.")

    @signing_keys_group.command("rotate")
    @_one_line_errors
    def rotate_signing_key_command():
        """Make a new key (of OIDC_ID_TOKEN_ALG's algorithm) that signs from now on; print its kid. The key it
        replaces stays published until the tokens it signed have expired."""
        from .oidc.keys import iso, rotate

        key, previous = rotate()
        click.echo(key.kid)
        replaced = f"; {previous.kid} no longer signs, published until {iso(previous.published_until())}"
        click.echo(f"{key.alg} key {key.kid} signs from now on{replaced if previous else ''}", err=True)

    # A kid is a base64url thumbprint: one in 64 begins with '-', which must not be read as an option.
    @signing_keys_group.command("retire", context_settings={"ignore_unknown_options": True})
    @click.argument("kid")
    @click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
    @_one_line_errors
    def retire_signing_key_command(kid: str, yes: bool):
        """Remove KID from the JWKS at once: tokens it signed stop verifying. The key that signs now cannot be
        retired: rotate first."""
        from .oidc.keys import KeyRefused, retire

        if not yes:
            click.confirm(f"Retire {kid}? Tokens it signed stop verifying at once.", abort=True)
        try:
            retire(kid)
        except KeyRefused as refusal:
            raise click.ClickException(str(refusal)) from None
        click.echo(f"retired {kid}")

    @signing_keys_group.command("list")
    @_one_line_errors
    def list_signing_keys_command():
        """List the published keys, the one that signs first: kid, algorithm, created, until when it is published."""
        from .oidc.keys import iso, list_keys

        for key in list_keys():
            until = "signs now" if key.published_until is None else f"published until {iso(key.published_until)}"
            unreadable = "" if key.readable else "  (does not open with this SECRET_KEY)"
            click.echo(f"{key.kid}  {key.alg}  created {iso(key.created_at)}  {until}{unreadable}")

    app.cli.add_command(signing_keys_group)

    redis_group = click.Group("redis", help="Maintain the data in Redis.")

    @redis_group.command("migrate-keys")
    @_one_line_errors
    def migrate_keys_command():
        """Rename the keys of a database from before hash-tagged key names (run once, on one Redis).

        Users, recovery codes, OAuth links, received webhooks and queued mail move; sessions and
        pending mailed or MFA tokens are deleted (everyone logs in again).
        """
        from .keymigration import migrate
        from .redis import get_redis, is_cluster

        client = get_redis()
        if is_cluster(client):
            raise click.ClickException("migrate on the single Redis the data was written to, then move to a cluster")
        counts = migrate(client)
        click.echo(f"moved {counts['moved']} keys, deleted {counts['dropped']} (sessions and pending tokens)")

    app.cli.add_command(redis_group)


def _user_or_fail(id_or_email: str) -> dict:
    from .auth.users import find_user

    user = find_user(id_or_email)
    if user is None:
        raise click.ClickException(f"no user {id_or_email}")
    return user


def _one_line_errors(command):
    """An operator gets one line saying what went wrong and what to do, not a traceback."""

    @functools.wraps(command)
    def run(*args, **kwargs):
        try:
            return command(*args, **kwargs)
        except ApiError as error:
            raise click.ClickException(error.message) from None
        except (
            redis.exceptions.ConnectionError,
            redis.exceptions.TimeoutError,
            redis.exceptions.ClusterDownError,
            redis.exceptions.RedisClusterException,
        ) as error:
            where = describe_redis(current_app.config["SETTINGS"].redis_url)
            raise click.ClickException(
                f"cannot reach Redis at {where} ({redis_error(error)}): start it (`make run` starts one and "
                f"writes its URL to var/.env, which this command reads) or set {redis_url_setting()}"
            ) from None

    return run
