"""Organizations: users belong to them with a role (owner, admin, member) and are invited by mail.

Modules: `store` keeps organizations, members and invitations in Redis (each decision about who may do
what to a membership is one Lua step on the organization's hash slot); `manage` checks, records audit
entries and announces membership changes; `views` serves `/orgs` and `/admin/orgs`; `live` tells every
worker that a membership changed, so open connections lose the organization's channels.
"""
