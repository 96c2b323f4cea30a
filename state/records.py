"""Inbox and outbox records: the JSON objects the journal stores, and read-only views.

An inbox record (key ``<scope>/in/<id>``)::

    {"t": "in", "id", "state": pending|done|dead, "attempts", "token", "lease",
     "message", "error", "created", "updated"}

An outbox record (key ``<scope>/out/<key>``)::

    {"t": "out", "key", "state": pending|failed|sent|dead|unknown, "attempts", "token",
     "lease", "inflight", "payload", "fp", "part", "parts", "previous_part", "inbound_id",
     "message_id", "error", "created", "updated", "ambiguous"}

``ambiguous`` is set on a send found in flight after a crash (marked unknown or resent).
``lease`` is ``{"owner", "boot", "until"}`` or ``None``; ``token`` is the fencing token,
raised by every claim. ``inflight`` is true from "about to call the provider" until the
outcome is recorded: a crash in between is the ambiguous window. Binary media is base64.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from state.messages import Inbound, Media, Outbound

__all__ = [
    "INBOX_STATES",
    "OUTBOX_STATES",
    "InboxRecord",
    "OutboxRecord",
    "decode_inbound",
    "decode_outbound",
    "encode_inbound",
    "encode_outbound",
    "error_of",
]

INBOX_STATES = ("pending", "done", "dead")
OUTBOX_STATES = ("pending", "failed", "sent", "dead", "unknown")

Json = dict[str, Any]


def _encode_media(media: Media | None) -> Json | None:
    if media is None:
        return None
    return {
        "url": media.url,
        "path": media.path,
        "data": base64.b64encode(media.data).decode("ascii") if media.data is not None else None,
        "mime": media.mime,
    }


def _decode_media(raw: Mapping[str, Any] | None) -> Media | None:
    if raw is None:
        return None
    data = raw.get("data")
    return Media(
        url=raw.get("url"),
        path=raw.get("path"),
        data=base64.b64decode(data) if data is not None else None,
        mime=raw.get("mime"),
    )


def encode_inbound(message: Inbound, *, media_refs: bool = True) -> Json:
    """The journaled form of an inbound. ``data`` must be JSON (it is copied as it is)."""
    return {
        "id": message.id,
        "chat_id": message.chat_id,
        "text": message.text,
        "kind": message.kind,
        "sender": message.sender,
        "channel": message.channel,
        "ts": message.ts,
        "media": _encode_media(message.media) if media_refs else None,
        "data": dict(message.data),
    }


def decode_inbound(raw: Mapping[str, Any]) -> Inbound:
    """Rebuild an inbound; raises ``KeyError``/``TypeError``/``ValueError`` on a bad record."""
    kind = raw.get("kind", "message")
    if kind not in ("message", "interaction"):
        raise ValueError(f"unknown inbound kind {kind!r}")
    text = raw.get("text")
    if text is not None and not isinstance(text, str):
        raise TypeError("inbound text must be a string")
    return Inbound(
        id=str(raw["id"]),
        chat_id=str(raw["chat_id"]),
        text=text,
        kind=kind,
        sender=raw.get("sender"),
        channel=raw.get("channel"),
        ts=raw.get("ts"),
        media=_decode_media(raw.get("media")),
        data=dict(raw.get("data") or {}),
    )


def encode_outbound(message: Outbound) -> Json:
    return {
        "chat_id": message.chat_id,
        "text": message.text,
        "media": _encode_media(message.media),
        "options": {k: v for k, v in message.options.items() if k != "idempotency_key"},
    }


def decode_outbound(raw: Mapping[str, Any]) -> Outbound:
    return Outbound(
        chat_id=str(raw["chat_id"]),
        text=raw.get("text"),
        media=_decode_media(raw.get("media")),
        options=dict(raw.get("options") or {}),
    )


def error_of(exc: BaseException) -> Json:
    """How an error is journaled: type, message, retryable. Never the object itself."""
    return {
        "type": type(exc).__name__,
        "message": str(exc),
        "retryable": bool(getattr(exc, "retryable", True)),
    }


def _lease_view(value: Mapping[str, Any]) -> tuple[str | None, float | None]:
    lease = value.get("lease")
    if not lease:
        return None, None
    return lease.get("owner"), lease.get("until")


@dataclass(frozen=True, slots=True)
class InboxRecord:
    """A read-only view of one inbox record (``durability.inbox.list()``)."""

    id: str
    state: str
    attempts: int
    token: int
    lease_owner: str | None
    lease_until: float | None
    error: Mapping[str, Any] | None
    created: float
    updated: float
    message: Mapping[str, Any]
    version: int

    @classmethod
    def from_value(cls, value: Mapping[str, Any], version: int) -> InboxRecord:
        owner, until = _lease_view(value)
        return cls(
            id=value["id"],
            state=value["state"],
            attempts=value.get("attempts", 0),
            token=value.get("token", 0),
            lease_owner=owner,
            lease_until=until,
            error=value.get("error"),
            created=value.get("created", 0.0),
            updated=value.get("updated", 0.0),
            message=value.get("message", {}),
            version=version,
        )

    def inbound(self) -> Inbound:
        return decode_inbound(self.message)


@dataclass(frozen=True, slots=True)
class OutboxRecord:
    """A read-only view of one outbox record (``durability.outbox.list()``)."""

    key: str
    state: str
    chat_id: str
    attempts: int
    token: int
    inflight: bool
    lease_owner: str | None
    lease_until: float | None
    part: int
    parts: int
    previous_part: str | None
    inbound_id: str | None
    message_id: str | None
    error: Mapping[str, Any] | None
    created: float
    updated: float
    payload: Mapping[str, Any]
    version: int
    ambiguous: bool = False

    @classmethod
    def from_value(cls, value: Mapping[str, Any], version: int) -> OutboxRecord:
        owner, until = _lease_view(value)
        return cls(
            key=value["key"],
            state=value["state"],
            chat_id=value["payload"]["chat_id"],
            attempts=value.get("attempts", 0),
            token=value.get("token", 0),
            inflight=bool(value.get("inflight")),
            lease_owner=owner,
            lease_until=until,
            part=value.get("part", 1),
            parts=value.get("parts", 1),
            previous_part=value.get("previous_part"),
            inbound_id=value.get("inbound_id"),
            message_id=value.get("message_id"),
            error=value.get("error"),
            created=value.get("created", 0.0),
            updated=value.get("updated", 0.0),
            payload=value["payload"],
            version=version,
            ambiguous=bool(value.get("ambiguous")),
        )

    def outbound(self) -> Outbound:
        return decode_outbound(self.payload)
