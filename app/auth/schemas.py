"""What the account and session endpoints take and answer (`U`, `T`, `S` in docs/api.md)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator, Field
from pydantic_core import PydanticCustomError

from ..schemas import Answer, Body, JsonValue, PlainText, ProviderName
from . import emails
from .devices import DEVICE_TOKEN_MAX
from .passkeys import CREDENTIAL_ID_TEXT_MAX, LOGIN_ID_MAX, NAME_MAX
from .users import PASSWORD_MAX, PASSWORD_MIN, ROLES


def _plain_address(value: str) -> str:
    try:
        return emails.plain_address(value)
    except emails.NotPlainAddress as refusal:
        raise PydanticCustomError("email", str(refusal)) from None


# An address the service stores or mails: one plain address (422 otherwise), normalised as stored.
Email = Annotated[
    str,
    Field(
        max_length=emails.ADDRESS_MAX,
        examples=["ada@example.com"],
        description="One plain `local@domain`: a dot-atom local part of ASCII letters, digits and "
        "``!#$%&'*+/=?^_`{|}~-`` (no quoted strings, encoded words `=?...?=`, spaces, commas, colons, "
        "semicolons, angle brackets or parentheses) and host name labels (an internationalised domain is "
        "kept as given and mailed in its IDNA form). Surrounding spaces are dropped; letters are kept in "
        "lower case.",
    ),
    AfterValidator(_plain_address),
]
# An address only compared with the accounts' own: one no account has, well-formed or not, is answered
# as an unknown address (it stores and mails nothing).
GivenEmail = Annotated[str, Field(max_length=emails.ADDRESS_MAX, examples=["ada@example.com"])]
NewPassword = Annotated[str, Field(min_length=PASSWORD_MIN, max_length=PASSWORD_MAX)]
# Any length: a password longer than any stored one is simply wrong (401), and is never hashed.
GivenPassword = Annotated[str, Field(description=f"Longer than {PASSWORD_MAX} characters: never matches.")]
Transport = Literal["cookie", "body"]
SessionId = Annotated[str, Field(pattern=r"^[0-9a-f]{32}$")]
# Checked by the service, not by shape: one that is not good for the account is simply not used.
DeviceToken = Annotated[str, Field(max_length=DEVICE_TOKEN_MAX)]


class Registration(Body):
    """A new account's address and password."""

    email: Email
    password: NewPassword


class TokensFor(Body):
    """Where a login's tokens should go, and a name for this device (every way of logging in takes them)."""

    transport: Transport = Field("cookie", description="cookie: HttpOnly cookies; body: tokens in the answer.")
    device: Annotated[PlainText, Field(max_length=200)] | None = Field(
        None, description="A name for this device (defaults to the User-Agent)."
    )


class Login(TokensFor):
    """Credentials, where the tokens should go, and a name for this device."""

    email: GivenEmail
    password: GivenPassword
    device_token: DeviceToken | None = Field(
        None, description="The device_token of this account's last body-transport login on this device, if any."
    )


class RefreshTokenBody(Body):
    """A refresh token in the body; without one, the refresh cookie is used."""

    refresh_token: Annotated[str, Field(max_length=512)] | None = None


class PasswordChange(Body):
    """The current password and the new one."""

    current_password: GivenPassword
    new_password: NewPassword


class Introspection(Body):
    """RFC 7662: the token to check, as a form field."""

    token: str
    token_type_hint: str | None = None


class SessionPath(Body):
    """A session id (another shape is 404)."""

    session_id: SessionId


class ExternalIdentity(Answer):
    """Who a user from a trusted issuer is there."""

    issuer: str = Field(description="The issuer's name here.")
    sub: str


class User(Answer):
    """`U`: a user as answers show them; a user from a trusted issuer has `external`, and its e-mail as the issuer
    gave it (or null)."""

    id: str
    email: str | None
    role: Literal[ROLES]
    email_verified: bool
    mfa_enabled: bool
    external: ExternalIdentity | None = None


class UserAnswer(Answer):
    """One user."""

    user: User


class Tokens(Answer):
    """`T`: a started or refreshed session; the tokens themselves only with transport `body`."""

    access_token: str | None = None
    refresh_token: str | None = None
    token_type: Literal["Bearer"]
    expires_in: int
    refresh_expires_in: int
    session_id: str
    user: User
    device_token: str | None = Field(
        None,
        description="Login with transport body only: proof that this device has logged in to the account, for "
        "the next login's body (it is counted per device then, not with guesses at the account). Good for "
        "nothing else; retired by a password reset, logging out everywhere, or deleting the account.",
    )


class Me(Answer):
    """The caller and their session."""

    user: User
    session_id: str


class Session(Answer):
    """`S`: one logged-in device."""

    id: str
    device: str | None
    created_at: str | None
    last_used_at: str | None
    ip: str | None
    current: bool


class Sessions(Answer):
    """The caller's sessions, most recently used first."""

    sessions: list[Session]


class IntrospectionAnswer(Answer):
    """`{"active": false}`, or the active token's claims."""

    active: bool
    sub: str | None = None
    role: str | None = None
    sid: str | None = None
    ver: int | None = None
    exp: int | None = None
    iat: int | None = None
    iss: str | None = None
    aud: str | None = None
    token_type: str | None = None
    client_id: str | None = Field(None, description="A client's access token (the OpenID provider's): its client.")
    scope: str | None = Field(None, description="A client's access token: the scope it was granted.")
    org_id: str | None = Field(None, description="The session's active organization, while the user is a member.")
    org_role: str | None = Field(None, description="The user's role in `org_id` now: owner, admin or member.")


class OAuthProviderPath(Body):
    """A configured OAuth provider (any other name is 404)."""

    provider: ProviderName


class NextPage(Body):
    """Where the browser goes after logging in: a path on this site (anything else means `/`)."""

    next: str | None = None


class ProviderReturn(Body):
    """What the provider's redirect back carries (read by the OAuth client, documented here)."""

    state: str | None = None
    code: str | None = None
    error: str | None = None
    error_description: str | None = None


# Account lifecycle (verification, reset, MFA). Tokens are checked by the service, not by shape: any
# string that is not a live token is 400 invalid_token, whatever its length.
MailedToken = Annotated[str, Field(description="The token from the link in the mail (after #token=).")]
TotpCode = Annotated[str, Field(description="Six digits from the authenticator app (spaces ignored).")]
RecoveryCode = Annotated[str, Field(description="One of the ten recovery codes (dashes and case ignored).")]


class EmailVerification(Body):
    """The token of a verification mail."""

    token: MailedToken


class ResetTokenCheck(Body):
    """The token of a reset mail, to learn whether it still works (it is not used)."""

    token: MailedToken


class ForgottenPassword(Body):
    """The address to send a reset link to (if an account has it)."""

    email: Email


class PasswordReset(Body):
    """The token of a reset mail and the new password."""

    token: MailedToken
    new_password: NewPassword


class TotpConfirmation(Body):
    """A current code from the secret being set up."""

    code: TotpCode


class TotpRemoval(Body):
    """The password and a second factor: a current code, or else a recovery code."""

    password: GivenPassword
    code: TotpCode | None = None
    recovery_code: RecoveryCode | None = None


class MfaLogin(Body):
    """The second step of a login: the mfa_token from the first, and a code or a recovery code."""

    mfa_token: Annotated[str, Field(description="From the 401 mfa_required answer of POST /auth/login.")]
    code: TotpCode | None = None
    recovery_code: RecoveryCode | None = None
    transport: Transport = Field("cookie", description="cookie: HttpOnly cookies; body: tokens in the answer.")
    device: Annotated[PlainText, Field(max_length=200)] | None = Field(
        None, description="A name for this device (defaults to the one given at the first step)."
    )
    device_token: DeviceToken | None = Field(
        None, description="As at the first step: kept in the answer while it is still good for this account."
    )


class TotpSetup(Answer):
    """A new secret, pending until confirmed: for the app, as text, URI and QR code."""

    secret: str = Field(description="Base32, for typing into the app.")
    otpauth_uri: str = Field(description="otpauth://totp/... (what the QR code holds).")
    qr_svg: str = Field(description="The URI as an inline SVG QR code.")


class RecoveryCodes(Answer):
    """Ten single-use codes, shown this once."""

    recovery_codes: list[str]


class Reauthentication(Body):
    """The password again, or a passkey (the `login_id` of POST /auth/passkeys/login/options and the
    credential), to mark this session as recently authenticated."""

    password: GivenPassword | None = Field(None, description="The account's password (or else a passkey).")
    login_id: LoginId | None = Field(None, description="With `credential`: from POST /auth/passkeys/login/options.")
    credential: AuthenticationResponse | None = None


class SessionStatus(Answer):
    """Whether the caller has a session: answered 200 either way, so a page can ask before it knows."""

    user: User | None = Field(description="The caller, when a valid access token came; else null.")
    session_id: str | None = Field(description="The caller's session id, with `user`; else null.")
    org_id: str | None = Field(
        None, description="With `user`: the session's active organization while the user is a member; else null."
    )
    can_refresh: bool = Field(
        description="A refresh cookie came with the request: without a user, POST /auth/refresh may open the "
        "session again (it may still answer 401 when that session has ended)."
    )


# Passkeys (WebAuthn). Credentials and options are WebAuthn Level 3's JSON forms, binary fields in
# base64url without padding; py_webauthn reads and checks them (a credential it cannot read is 400).
PasskeyName = Annotated[
    PlainText, Field(min_length=1, max_length=NAME_MAX, description="A name to tell the passkey by.")
]
LoginId = Annotated[str, Field(max_length=LOGIN_ID_MAX, description="From POST /auth/passkeys/login/options.")]
_BASE64URL = {"type": "string", "pattern": "^[A-Za-z0-9_-]*$"}
RegistrationResponse = Annotated[
    dict[str, JsonValue],
    Field(
        description="RegistrationResponseJSON: what `PublicKeyCredential.toJSON()` gives after "
        "`navigator.credentials.create()`.",
        json_schema_extra={
            "required": ["id", "rawId", "type", "response"],
            "properties": {
                "id": _BASE64URL,
                "rawId": _BASE64URL,
                "type": {"const": "public-key"},
                "response": {
                    "type": "object",
                    "required": ["clientDataJSON", "attestationObject"],
                    "properties": {
                        "clientDataJSON": _BASE64URL,
                        "attestationObject": _BASE64URL,
                        "transports": {"type": "array", "items": {"type": "string"}},
                    },
                },
                "authenticatorAttachment": {"type": ["string", "null"]},
                "clientExtensionResults": {"type": "object"},
            },
        },
    ),
]
AuthenticationResponse = Annotated[
    dict[str, JsonValue],
    Field(
        description="AuthenticationResponseJSON: what `PublicKeyCredential.toJSON()` gives after "
        "`navigator.credentials.get()`.",
        json_schema_extra={
            "required": ["id", "rawId", "type", "response"],
            "properties": {
                "id": _BASE64URL,
                "rawId": _BASE64URL,
                "type": {"const": "public-key"},
                "response": {
                    "type": "object",
                    "required": ["clientDataJSON", "authenticatorData", "signature"],
                    "properties": {
                        "clientDataJSON": _BASE64URL,
                        "authenticatorData": _BASE64URL,
                        "signature": _BASE64URL,
                        "userHandle": {"anyOf": [_BASE64URL, {"type": "null"}]},
                    },
                },
                "authenticatorAttachment": {"type": ["string", "null"]},
                "clientExtensionResults": {"type": "object"},
            },
        },
    ),
]


class PasskeyRegistration(Body):
    """The new passkey's credential, answering the last registration options, and a name for it."""

    credential: RegistrationResponse
    name: PasskeyName | None = Field(None, description="Default: `Passkey <date>`.")


class PasskeyRename(Body):
    """A passkey's new name."""

    name: PasskeyName


class PasskeyPath(Body):
    """A passkey's id: its credential id, base64url (another shape is 404)."""

    passkey_id: Annotated[str, Field(pattern=f"^[A-Za-z0-9_-]{{1,{CREDENTIAL_ID_TEXT_MAX}}}$")]


class PasskeyLoginStart(Body):
    """Who is logging in, if the page knows: the answer looks the same, and the login is for that account alone."""

    email: GivenEmail | None = None


class PasskeyLogin(TokensFor):
    """A passkey's answer to the login options of `login_id`, where the tokens should go, and a device name."""

    login_id: LoginId
    credential: AuthenticationResponse
    device_token: DeviceToken | None = Field(
        None, description="As at POST /auth/login: kept in the answer while it is still good for this account."
    )


class Passkey(Answer):
    """`P`: one of the caller's passkeys."""

    id: str = Field(description="The credential id (base64url).")
    name: str
    created_at: str
    last_used_at: str | None = Field(description="Null until the passkey is first used to log in.")


class Passkeys(Answer):
    """The caller's passkeys, oldest first."""

    passkeys: list[Passkey]


class PasskeyCreationOptions(Answer):
    """Options for `navigator.credentials.create()`."""

    options: dict[str, JsonValue] = Field(
        description="PublicKeyCredentialCreationOptionsJSON (for `PublicKeyCredential.parseCreationOptionsFromJSON`)."
    )


class PasskeyRequestOptions(Answer):
    """Options for `navigator.credentials.get()`, and the login_id the answer must name."""

    options: dict[str, JsonValue] = Field(
        description="PublicKeyCredentialRequestOptionsJSON (for `PublicKeyCredential.parseRequestOptionsFromJSON`); "
        "`allowCredentials` is always empty."
    )
    login_id: str = Field(description="Send it back with the credential; used once, within five minutes.")
