"""Accounts, passwords, access tokens, refresh-token families and sessions."""
