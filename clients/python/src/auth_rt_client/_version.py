"""The package's version, and the User-Agent every request sends."""

__version__ = "0.1.0"
USER_AGENT = f"auth-rt-client/{__version__}"
