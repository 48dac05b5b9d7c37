"""The service's OAuth 2.0 authorization server: Authlib's, with our grants registered and our answers.

Authlib parses the token request, picks the grant by `grant_type` and answers errors in RFC 6749's shape
(with `Cache-Control: no-store`); the grants say what is ours. Parameters are read from the form body only,
never from the query string, so that no token is ever in a URL (and so in a log).
"""

from __future__ import annotations

from collections import defaultdict
from functools import cached_property

from authlib.integrations.flask_oauth2 import AuthorizationServer as FlaskAuthorizationServer
from authlib.integrations.flask_oauth2.requests import FlaskOAuth2Payload, FlaskOAuth2Request
from flask import Response
from flask import request as flask_request

from .grants import TokenExchangeGrant


class FormPayload(FlaskOAuth2Payload):
    """The request's parameters: its form body alone."""

    @property
    def data(self):
        """The form's fields (a MultiDict)."""
        return self._request.form

    @cached_property
    def datalist(self):
        """Every value of each field, to refuse a field given twice."""
        values = defaultdict(list)
        for name in self.data:
            values[name].extend(self.data.getlist(name))
        return values


class FormRequest(FlaskOAuth2Request):
    """Authlib's view of the request, with `FormPayload`."""

    def __init__(self, request):
        super().__init__(request)
        self.payload = FormPayload(request)


class AuthorizationServer(FlaskAuthorizationServer):
    """The token endpoint's server: no registered clients yet (the token exchange authenticates none)."""

    def __init__(self):
        super().__init__(query_client=lambda client_id: None, save_token=lambda token, request: None)
        self.register_grant(TokenExchangeGrant)

    def create_oauth2_request(self, request):
        """Authlib's view of the Flask request at hand, its parameters from the form only."""
        return FormRequest(flask_request)

    def handle_response(self, status_code, payload, headers):
        """A grant's answer is a response already (built as every login's is); an error's, a dict."""
        if isinstance(payload, Response):
            return payload
        return super().handle_response(status_code, payload, headers)
