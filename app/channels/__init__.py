"""Channels of namespaces: their rules, who is granted them, who may read and publish, who is present.

- `namespaces`: the rules of each namespace, and the shape of a channel name `<namespace>:<name>`.
- `grants`: which users a channel of a `members` namespace admits, until when, with what info.
- `access`: who may subscribe and publish (imports namespaces and grants; the transports call it).
- `manage`: changes made through the API or the command line, announced so open subscriptions are
  checked again (imports namespaces and grants).
- `presence`: who reads a channel now, and its join and leave events.
- `views` and `schemas`: the HTTP endpoints (import every module above; none imports them).
"""
