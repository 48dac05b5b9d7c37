"""API keys: credentials for backends and other systems, which must not log in as a person."""

from __future__ import annotations

from flask import Flask

from .store import VERIFY_API_KEY, verify_key


def init_app(app: Flask) -> None:
    """Register the script that checks a key in one round trip, and offer the check to the guards."""
    app.extensions["verify_api_key"] = app.extensions["redis"].register_script(VERIFY_API_KEY)
    app.extensions["api_key_verifier"] = verify_key
