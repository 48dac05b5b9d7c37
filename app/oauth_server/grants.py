"""The grant types of the token endpoint, as Authlib grant classes. RFC 8693's token exchange: a trusted
issuer's token (the subject token) for a session of this service.

The exchange authenticates no client: the subject token is the credential. The answer is `T`, built as
every login's is (app/auth/answers.py), with `issued_token_type`.
"""

from __future__ import annotations

from authlib.oauth2.rfc6749 import InvalidGrantError, InvalidRequestError, OAuth2Error
from authlib.oauth2.rfc6749.grants import BaseGrant, TokenEndpointMixin
from flask import request

from ..auth.answers import device_name, token_response
from ..auth.guards import cross_site_request
from ..http import has_control_characters
from ..issuers import exchange
from ..issuers.keys import TokenRefused
from ..metrics import LOGINS
from . import throttle

# RFC 8693 names (URNs, not secrets).
TOKEN_EXCHANGE = "urn:ietf:params:oauth:grant-type:token-exchange"  # noqa: S105
ACCESS_TOKEN_TYPE = "urn:ietf:params:oauth:token-type:access_token"  # noqa: S105
SUBJECT_TOKEN_TYPES = (
    "urn:ietf:params:oauth:token-type:jwt",
    ACCESS_TOKEN_TYPE,
    "urn:ietf:params:oauth:token-type:id_token",
)
TRANSPORTS = ("body", "cookie")
DEVICE_MAX = 200
# The fields of an exchange: each at most once (RFC 6749, 3.2).
FIELDS = ("grant_type", "subject_token", "subject_token_type", "requested_token_type", "transport", "device")


class CrossSiteRefused(OAuth2Error):
    """403: a cookie-transport exchange started by a foreign page (the session cookies' cross-site rule)."""

    error = "csrf_rejected"
    status_code = 403
    description = "Cross-site request refused."


class TokenExchangeGrant(BaseGrant, TokenEndpointMixin):
    """RFC 8693: `subject_token` of a trusted issuer for a session here (no client authentication)."""

    GRANT_TYPE = TOKEN_EXCHANGE
    TOKEN_ENDPOINT_AUTH_METHODS = ["none"]

    def validate_token_request(self):
        """The form's fields: 400 invalid_request for a missing or repeated one, or one of an unknown value. Limited
        as a login, per client address: it logs a person in."""
        throttle.take_per_address("login")
        given = self.request.payload.datalist
        for name in FIELDS:
            if len(given.get(name, [])) > 1:
                raise InvalidRequestError(f"The field {name} must be given once.")
        form = self.request.payload.data
        for name in ("subject_token", "subject_token_type"):
            if not form.get(name):
                raise InvalidRequestError(f"The field {name} is required.")
        if form["subject_token_type"] not in SUBJECT_TOKEN_TYPES:
            raise InvalidRequestError(f"subject_token_type must be one of {', '.join(SUBJECT_TOKEN_TYPES)}.")
        if form.get("requested_token_type", ACCESS_TOKEN_TYPE) != ACCESS_TOKEN_TYPE:
            raise InvalidRequestError(f"Only an access token is issued ({ACCESS_TOKEN_TYPE}).")
        if "actor_token" in form:
            raise InvalidRequestError("Delegation (actor_token) is not supported.")
        if form.get("transport", "body") not in TRANSPORTS:
            raise InvalidRequestError("transport must be body or cookie.")
        device = form.get("device")
        if device is not None and (len(device) > DEVICE_MAX or has_control_characters(device)):
            raise InvalidRequestError(f"device must have at most {DEVICE_MAX} characters, none of them control ones.")
        if form.get("transport") == "cookie" and cross_site_request():
            # Setting session cookies for a request another site's page made would log its browser in (login CSRF).
            raise CrossSiteRefused()

    def create_token_response(self):
        """Exchange the subject token (400 invalid_grant for any token that is not accepted) and answer `T`."""
        form = self.request.payload.data
        try:
            done = exchange.exchange(form["subject_token"], device_name(form.get("device")), request.remote_addr)
        except TokenRefused as refused:
            LOGINS.labels("failure").inc()
            exchange.record_refusal(refused)
            raise InvalidGrantError(str(refused)) from None
        LOGINS.labels("success").inc()
        user, session = done.user, done.session
        answer = token_response(
            user,
            session.session_id,
            user["role"],
            int(user["token_version"]),
            session.refresh_token,
            form.get("transport", "body"),
            extra={"issued_token_type": ACCESS_TOKEN_TYPE},
        )
        return 200, answer, []
