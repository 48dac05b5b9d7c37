"""What the webhook receiver answers, and the admins' list of deliveries."""

from __future__ import annotations

from pydantic import Field

from ..schemas import Answer, Body, ProviderName


class WebhookProviderPath(Body):
    """A configured webhook provider (any other name is 404)."""

    name: ProviderName


class Recent(Body):
    """How many of the newest deliveries to list."""

    limit: int = Field(50, ge=1, le=1000)


class Received(Answer):
    """The delivery's id: `accepted` the first time, `duplicate` after."""

    id: str
    status: str | None = None
    duplicate: bool | None = None


class Deliveries(Answer):
    """A provider's recent deliveries, newest first."""

    deliveries: list[dict]
