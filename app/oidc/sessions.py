"""Client sessions: an authorization a user gives a client is a session of this service (app/auth/sessions.py),
whose record names the client (`client_id`), the browser session it was authorized from (`authorized_from`) and
the scope granted. The user's index of client sessions (session id -> client id) is written in the step that
starts such a session, and outlives the sessions it names, so that whoever learns of ended sessions can tell
which were a client's.
"""

from __future__ import annotations

from ..auth import sessions


def client_sessions(user_id: str) -> dict[str, str]:
    """The user's client sessions as the index has them: session id -> client id (ended ones included, until the
    index forgets them)."""
    return sessions.client_sessions(user_id)
