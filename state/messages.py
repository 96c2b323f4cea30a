"""Plain records that cross the layers: inbound messages, outbound sends, provider results.

No Kafka, no Faust: ``topics/`` maps these to and from the wire, ``providers/`` sends them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = ["Inbound", "Media", "Outbound", "Receipt", "SendResult"]


@dataclass(frozen=True, slots=True)
class Media:
    """A media reference: a URL, a path, or inline bytes (journaled base64)."""

    url: str | None = None
    path: str | None = None
    data: bytes | None = None
    mime: str | None = None


@dataclass(frozen=True, slots=True)
class Inbound:
    """One inbound message or interaction, as the bot's handlers see it.

    ``id`` is the inbound record id: stable across redeliveries of the same message (the
    channel's message id, or the Kafka topic/partition/offset when the channel has none).
    """

    id: str
    chat_id: str
    text: str | None = None
    kind: Literal["message", "interaction"] = "message"
    sender: str | None = None
    channel: str | None = None
    ts: float | None = None
    media: Media | None = None
    data: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Outbound:
    """One send as the provider receives it (the idempotency key is never in it)."""

    chat_id: str
    text: str | None = None
    media: Media | None = None
    options: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class SendResult:
    """What the provider answered: its own message id."""

    message_id: str


@dataclass(frozen=True, slots=True)
class Receipt:
    """What went out: published on the sent-receipts topic by the Kafka worker."""

    key: str
    chat_id: str
    message_id: str | None
    state: str
    inbound_id: str | None = None
    part: int = 1
