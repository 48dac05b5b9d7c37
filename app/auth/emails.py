"""E-mail addresses: the one plain form an account's address may take, and the form it is mailed in.

An address is `local@domain`. The local part is a dot-atom of ASCII letters, digits and
``!#$%&'*+/=?^_`{|}~-``; the domain is host-name labels, an internationalised one kept as given and
mailed in its IDNA (UTS #46) form. Everything a mail header parser reads as something else is refused:
quoted strings, comments, angle brackets, commas, colons, semicolons, spaces, and encoded words
(`=?charset?q?...?=`, which a parser decodes into any text, other mailboxes included). A mail then goes
to the stored address itself, never to what parsing a header made of it.
"""

from __future__ import annotations

import re

import idna

from ..http import has_control_characters

LOCAL_MAX, ADDRESS_MAX = 64, 254
_ATOM = r"[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+"
DOT_ATOM = re.compile(rf"{_ATOM}(?:\.{_ATOM})*")
ENCODED_WORD_START = "=?"
RULE = (
    "an e-mail address must be one plain local@domain: a local part of letters, digits, dots and "
    "!#$%&'*+/=?^_`{|}~- (no quoted strings, encoded words, spaces, commas, colons, semicolons, angle "
    "brackets or parentheses) and a domain of host name labels"
)


class NotPlainAddress(ValueError):
    """The text is not one plain address; the message says why, without repeating the text."""


def normalise(text: str) -> str:
    """The form addresses are compared and stored in: surrounding spaces dropped, lower case."""
    return text.strip().lower()


def plain_address(text: str) -> str:
    """The address as it is stored (normalised), or NotPlainAddress when it is not one plain address."""
    if has_control_characters(text):  # before trimming: a trailing newline is not a space to drop
        raise NotPlainAddress("an e-mail address must not contain control characters")
    address = normalise(text)
    local, at, domain = address.rpartition("@")
    if not at or not DOT_ATOM.fullmatch(local) or ENCODED_WORD_START in local:
        raise NotPlainAddress(RULE)
    if len(local) > LOCAL_MAX or len(address) > ADDRESS_MAX:
        raise NotPlainAddress(
            f"an e-mail address has at most {LOCAL_MAX} characters before the @ and {ADDRESS_MAX} in all"
        )
    if len(f"{local}@{ascii_domain(domain)}") > ADDRESS_MAX:
        raise NotPlainAddress(f"an e-mail address has at most {ADDRESS_MAX} characters in its IDNA form")
    return address


def ascii_domain(domain: str) -> str:
    """A domain of host name labels in its IDNA (ASCII) form, or NotPlainAddress."""
    labels = domain.split(".")
    if len(labels) < 2 or not all(labels) or labels[-1].isdigit():
        # Two labels at least (no bare host), none empty (no trailing dot), and no address in digits.
        raise NotPlainAddress(RULE)
    try:
        # Kept as given, so given in the form UTS #46 maps it to (no full-width dots or other look-alikes
        # that would make a second spelling of one mailbox).
        if idna.uts46_remap(domain, std3_rules=True, transitional=False) != domain:
            raise NotPlainAddress("the e-mail address's domain is not in its normal form (IDNA)")
        return idna.encode(domain, uts46=True, std3_rules=True, transitional=False).decode("ascii")
    except idna.IDNAError:
        raise NotPlainAddress("the e-mail address's domain is not a valid host name (IDNA)") from None


def mailbox(stored: str) -> str:
    """Where mail for a stored address goes: that address, its domain in IDNA form; NotPlainAddress when
    the stored text is not one plain address (an account kept from before the rule)."""
    address = plain_address(stored)
    local, _, domain = address.rpartition("@")
    return f"{local}@{ascii_domain(domain)}"
