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
from authlib.oauth2.rfc6749 import InvalidClientError, OAuth2Request
from authlib.oauth2.rfc9207 import IssuerParameter
from flask import Response
from flask import request as flask_request

from ..oidc import clients, endpoints
from ..oidc import grants as oidc_grants
from ..oidc.issuer import issuer
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


class QueryPayload(FormPayload):
    """The request's parameters: its query string alone (an authorization request; the consent form's own fields
    are not the request's)."""

    @property
    def data(self):
        """The query's fields (a MultiDict)."""
        return self._request.args


class QueryRequest(FlaskOAuth2Request):
    """Authlib's view of an authorization request, with `QueryPayload`."""

    def __init__(self, request):
        super().__init__(request)
        self.payload = QueryPayload(request)


class Issuer(IssuerParameter):
    """RFC 9207: every authorization response (errors included) names the issuer, against mix-up attacks."""

    def get_issuer(self) -> str:
        """The provider's issuer (from the settings, never the request)."""
        return issuer()


class AuthorizationServer(FlaskAuthorizationServer):
    """The service's authorization server: RFC 8693's token exchange (which authenticates no client) and the
    OpenID provider's grants and endpoints, for the registered clients (app/oidc/)."""

    def __init__(self):
        super().__init__(query_client=clients.get_client, save_token=lambda token, request: None)
        self.register_grant(TokenExchangeGrant)
        oidc_grants.register(self)
        endpoints.register(self)
        self.issuer_parameter = Issuer()
        self.register_extension(self.issuer_parameter)

    def create_oauth2_request(self, request):
        """Authlib's view of the Flask request at hand, its parameters from the form only (or the view's own, an
        authorization request's from the query)."""
        if isinstance(request, OAuth2Request):
            return request
        return FormRequest(flask_request)

    def authenticate_client(self, request, methods, endpoint="token"):
        """The client, by one of `methods`; a client that fails to authenticate is 401 invalid_client, whichever
        way it tried."""
        try:
            return super().authenticate_client(request, methods, endpoint)
        except InvalidClientError as error:
            error.status_code = 401
            raise

    def handle_response(self, status_code, payload, headers):
        """A grant's answer is a response already (built as every login's is); an error's, a dict."""
        if isinstance(payload, Response):
            return payload
        return super().handle_response(status_code, payload, headers)
