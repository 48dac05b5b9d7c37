"""`GET /openapi.json` (the document) and `GET /docs` (Swagger UI reading it, served from its package)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import flask_swagger_ui
from flask import Blueprint, current_app, jsonify, render_template, send_from_directory

from .errors import not_found
from .openapi import build_document, operation
from .schemas import Body

bp = Blueprint("apidocs", __name__)

SWAGGER_UI = Path(flask_swagger_ui.__file__).parent / "dist"
SWAGGER_ASSETS = ("swagger-ui.css", "swagger-ui-bundle.js", "favicon-32x32.png")


class AssetPath(Body):
    """One of the files the page uses."""

    name: Literal[SWAGGER_ASSETS]


# Swagger UI draws its icons as data: images; everything else comes from this origin.
DOCS_CONTENT_SECURITY_POLICY = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
    "frame-ancestors 'none'; base-uri 'none'; form-action 'self'; object-src 'none'"
)


@bp.get("/openapi.json")
@operation("The OpenAPI 3.1 document of this service", tags=["documentation"], responses={200: None})
def openapi_document():
    """Built once per process from the routes and their models."""
    if "openapi_document" not in current_app.extensions:
        current_app.extensions["openapi_document"] = build_document(current_app)
    response = jsonify(current_app.extensions["openapi_document"])
    response.headers["Cache-Control"] = "public, max-age=300"
    return response


@bp.get("/docs")
@operation("The API reference, readable in a browser", tags=["documentation"], responses={200: ("text/html", "A page")})
def reference():
    """Swagger UI over /openapi.json."""
    headers = {"Content-Security-Policy": DOCS_CONTENT_SECURITY_POLICY, "Cache-Control": "public, max-age=300"}
    return render_template("docs.html"), 200, headers


@bp.get("/docs/assets/<name>")
@operation(
    "Swagger UI's files",
    tags=["documentation"],
    path=AssetPath,
    responses={200: ("*/*", "JavaScript, CSS or an icon")},
)
def asset(name: str):
    """Only the files the page uses, from the installed package."""
    if name not in SWAGGER_ASSETS:
        raise not_found("No such file.")
    return send_from_directory(SWAGGER_UI, name, max_age=86400)
