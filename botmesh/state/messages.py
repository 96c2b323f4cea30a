"""The message model: every record that crosses the layers, defined once.

``Inbound`` (a message or interaction, as handlers see it and as it travels on the inbound
topic), ``Media``, ``Outbound`` (a send, as the provider gets it), ``SendResult`` and
``Receipt`` (what went out, as the receipts topic carries it). They are ``msgspec`` structs:
frozen, typed, and decoded from JSON with validation in one pass. The JSON Schema files of
the wire (``botmesh/topics/schemas/*.json``) are generated from these classes
(``python -m botmesh.topics.schemas``), and a test keeps them in step.

The records that go on the wire carry a version field ``"v": 1`` (the struct tag).
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from typing import Annotated, Any, Literal

import msgspec

from botmesh.state.errors import BadRecord, MediaUnavailableReason, Reason

__all__ = [
    "DELIVERY_ORDER",
    "DELIVERY_STATES",
    "RECEIPT_VERSION",
    "SCHEMA_VERSION",
    "DeliveryState",
    "DeliveryStatus",
    "Inbound",
    "Media",
    "Outbound",
    "OutboxState",
    "Receipt",
    "ReceiptV1",
    "SendResult",
    "no_surrogates",
    "surrogate_at",
]

#: The version of the wire records (``"v"``).
SCHEMA_VERSION = 1

NonEmpty = Annotated[str, msgspec.Meta(min_length=1)]

# -- checks on construction --------------------------------------------------------------
# msgspec checks types when it decodes, not in ``__init__``: a record built in code
# (``Inbound(chat_id=None)``, ``Outbound("c", media="https://…")``) would be journaled as it
# is, handled now, and refused only when a replay decodes it. Each struct below checks its
# fields in ``__post_init__`` (run on construction, on ``msgspec.structs.replace`` and on
# decoding), with the rules of its annotations, and raises ``BadRecord`` naming the field:
# nothing is journaled. Decoding wraps it in ``msgspec.ValidationError`` (its cause).

_MEDIA_REASONS = ("not-durable", "provider-mismatch", "rehydrate-failed")


def _got(value: object) -> str:
    return f"{type(value).__name__} {value!r}"[:80]


def _refuse(what: str, field: str, expected: str, value: object) -> BadRecord:
    return BadRecord(
        Reason.WRONG_TYPE, f"{what} field '{field}' must be {expected}, got {_got(value)}", field
    )


def _chat_id(what: str, value: object) -> None:
    if isinstance(value, str) and value:
        return
    reason = Reason.MISSING_CHAT_ID if value is None or value == "" else Reason.WRONG_TYPE
    raise BadRecord(
        reason,
        f"{what} field 'chat_id' must be a non-empty string (the chat's id; write an integer "
        f"id as its decimal string), got {_got(value)}",
        "chat_id",
    )


def _optional_str(what: str, owner: object, *names: str, prefix: str = "") -> None:
    for name in names:
        value = getattr(owner, name)
        if value is not None and not isinstance(value, str):
            raise _refuse(what, prefix + name, "a string or None", value)


def _mapping(what: str, field: str, value: object, *, optional: bool = False) -> None:
    if value is None and optional:
        return
    if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
        expected = "a dict with string keys" + (" or None" if optional else "")
        raise _refuse(what, field, expected, value)


def _media(what: str, value: object, field: str = "media") -> None:
    if value is not None and not isinstance(value, Media):
        raise _refuse(
            what,
            field,
            "a botmesh.Media or None (Media(url=...), Media(path=...), Media(data=...))",
            value,
        )


def surrogate_at(value: object, path: str) -> tuple[str, int] | None:
    """Where ``value`` (a string, or JSON-like dicts and lists of them) holds a lone
    surrogate (``"\\ud800"``: not text, so no journal or channel can encode it as UTF-8):
    the path of the string (``path``, ``path.key``, ``path[2]``; a dict key is named by
    its dict) and the index in it; ``None`` when it holds none."""
    if isinstance(value, str):
        if value.isascii():
            return None
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:
            return path, exc.start
        return None
    if isinstance(value, dict):
        for key, item in value.items():
            found = surrogate_at(key, path) if isinstance(key, str) else None
            found = found or surrogate_at(item, f"{path}.{key}")
            if found is not None:
                return found
        return None
    if isinstance(value, list | tuple):
        for i, item in enumerate(value):
            found = surrogate_at(item, f"{path}[{i}]")
            if found is not None:
                return found
    return None


def no_surrogates(what: str, fields: Mapping[str, object]) -> None:
    """Refuse a record whose text holds a lone surrogate: ``BadRecord`` naming the field,
    at the door, so every journal backend and every channel behaves the same."""
    for name, value in fields.items():
        if value is None or (isinstance(value, str) and value.isascii()):
            continue
        found = surrogate_at(value, name)
        if found is not None:
            field, index = found
            raise BadRecord(
                Reason.WRONG_TYPE,
                f"{what} field '{field}' holds a lone surrogate at index {index}: it is not "
                "text and cannot be encoded as UTF-8 (a string decoded with "
                "errors='surrogateescape' or cut inside a UTF-16 pair?); decode the input "
                "as UTF-8 (errors='replace' keeps what is readable) before building it",
                field,
            )


def _media_fields(media: object, prefix: str = "media.") -> dict[str, object]:
    if not isinstance(media, Media):
        return {}
    names = ("url", "path", "mime", "id", "provider", "name", "extra", "ref")
    return {prefix + n: getattr(media, n) for n in names}


class OutboxState(StrEnum):
    """The states of a send (an outbox record), under the reference's names."""

    #: Journaled; about to go out, going out, or waiting its turn.
    PENDING = "pending"
    #: An attempt failed with a retryable error; retried after a backoff.
    FAILED = "failed"
    #: The provider accepted it (``message_id`` recorded).
    SENT = "sent"
    #: Failed for good (final error, retries spent, or an earlier part dead).
    DEAD = "dead"
    #: Its outcome was lost in a crash (``on_ambiguous="skip"``), or an earlier part's was.
    UNKNOWN = "unknown"
    #: Cancelled before it went out (``app.cancel``, a cancelled campaign): never sent, and
    #: a later send under its key is answered from this record, not sent.
    CANCELLED = "cancelled"


class Media(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """A media reference: a URL, a path, inline bytes (base64 in JSON), or a channel's own
    token (``id``: a Telegram ``file_id``, a Meta media id).

    On an inbound, ``provider`` names the channel that received it. The inbox journals a
    durable reference (``ref``: ``{"v": n, "data": ...}``, from the provider's
    ``serialize_media_ref``), never the inline bytes; a replay rebuilds the media from it.
    When it cannot, ``unavailable`` says why and ``load_media_of`` fails with that reason.
    """

    url: str | None = None
    path: str | None = None
    data: bytes | None = None
    mime: str | None = None
    #: The channel's media token (Telegram ``file_id``, WhatsApp media id, …).
    id: str | None = None
    #: The channel that received this media (a provider's ``name``).
    provider: str | None = None
    #: A file name, when the channel gave one (email attachments, documents).
    name: str | None = None
    #: Channel details the adapter needs again (message key, attachment index, digest, …).
    extra: dict[str, Any] = {}
    #: The durable reference journaled in place of the media (``{"v": n, "data": ...}``).
    ref: dict[str, Any] | None = None
    #: Set on a replayed inbound whose media could not be rebuilt.
    unavailable: MediaUnavailableReason | None = None

    def __post_init__(self) -> None:
        _optional_str("Media", self, "url", "path", "mime", "id", "provider", "name")
        if self.data is not None and not isinstance(self.data, bytes | bytearray | memoryview):
            raise _refuse("Media", "data", "bytes or None", self.data)
        _mapping("Media", "extra", self.extra)
        _mapping("Media", "ref", self.ref, optional=True)
        if self.unavailable is not None and self.unavailable not in _MEDIA_REASONS:
            raise _refuse(
                "Media", "unavailable", f"one of {_MEDIA_REASONS} or None", self.unavailable
            )


class Inbound(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, tag_field="v", tag=1):
    """One inbound message or interaction.

    ``id`` is the inbound record id, stable across redeliveries of the same message (the
    channel's message id). On Kafka a record without one gets ``<topic>:<partition>:<offset>``;
    in process it is required. Send keys derive from it (``<id>:<n>``).
    """

    id: NonEmpty = ""
    chat_id: NonEmpty
    text: str | None = None
    kind: Literal["message", "interaction"] = "message"
    sender: str | None = None
    channel: str | None = None
    ts: float | None = None
    media: Media | None = None
    data: dict[str, Any] = {}

    def __post_init__(self) -> None:
        if not isinstance(self.id, str):
            raise _refuse(
                "Inbound",
                "id",
                "a string (the channel's message id, stable across redeliveries)",
                self.id,
            )
        _chat_id("Inbound", self.chat_id)
        _optional_str("Inbound", self, "text", "sender", "channel")
        if self.kind not in ("message", "interaction"):
            raise _refuse("Inbound", "kind", "'message' or 'interaction'", self.kind)
        ts = self.ts
        if ts is not None and (isinstance(ts, bool) or not isinstance(ts, int | float)):
            raise _refuse("Inbound", "ts", "a number (Unix seconds) or None", ts)
        _media("Inbound", self.media)
        _mapping("Inbound", "data", self.data)
        no_surrogates(
            "Inbound",
            {
                "id": self.id,
                "chat_id": self.chat_id,
                "text": self.text,
                "sender": self.sender,
                "channel": self.channel,
                "data": self.data or None,
                **_media_fields(self.media),
            },
        )


class Outbound(msgspec.Struct, frozen=True, omit_defaults=True):
    """One send as the provider receives it (the idempotency key is never in it)."""

    chat_id: str
    text: str | None = None
    media: Media | None = None
    options: dict[str, Any] = {}

    def __post_init__(self) -> None:
        _chat_id("a send's", self.chat_id)
        _optional_str("a send's", self, "text")
        _media("a send's", self.media)
        _mapping("a send's", "options", self.options)
        no_surrogates(
            "a send's",
            {
                "chat_id": self.chat_id,
                "text": self.text,
                "options": self.options or None,
                **_media_fields(self.media),
            },
        )


class DeliveryState(StrEnum):
    """What a channel said of a message after it accepted it (its status webhooks)."""

    #: The channel's servers took it (WhatsApp ``sent``, Twilio ``sent``): no news for us.
    SENT = "sent"
    #: It reached the user's device.
    DELIVERED = "delivered"
    #: The user read it.
    READ = "read"
    #: It will never arrive (WhatsApp ``failed``, Twilio ``undelivered``/``failed``).
    FAILED = "failed"


#: Each delivery state by its name (a channel's status of that name, as it is).
DELIVERY_STATES = {s.value: s for s in DeliveryState}

#: How far each delivery state is along the way: a status that is not further along than
#: the one a send has already (a copy, or one overtaken by a later one) changes nothing.
#: ``failed`` is final.
DELIVERY_ORDER = {
    DeliveryState.SENT: 0,
    DeliveryState.DELIVERED: 1,
    DeliveryState.READ: 2,
    DeliveryState.FAILED: 3,
}


class DeliveryStatus(
    msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, tag_field="v", tag=1
):
    """One status webhook of a channel about a message it accepted: produced by the gateway
    to ``<prefix>.statuses`` keyed by ``chat_id``, joined by the chat's owner to the send
    whose journaled ``message_id`` it names.

    ``code`` and ``error`` are the channel's own (WhatsApp ``131047`` and its title,
    Twilio ``30003``…), on ``failed`` only. ``id`` names the event when the channel gives
    one (else the gateway derives one from the message id and the status)."""

    chat_id: NonEmpty
    message_id: NonEmpty
    status: DeliveryState
    channel: str | None = None
    id: str = ""
    #: When the channel says it happened (seconds since the epoch).
    ts: float | None = None
    code: str | None = None
    error: str | None = None

    def __post_init__(self) -> None:
        _chat_id("DeliveryStatus", self.chat_id)
        _optional_str("DeliveryStatus", self, "channel", "code", "error")
        if not isinstance(self.message_id, str) or not self.message_id:
            raise _refuse("DeliveryStatus", "message_id", "a non-empty string", self.message_id)
        if self.status not in DELIVERY_ORDER:
            raise _refuse(
                "DeliveryStatus", "status", "sent, delivered, read or failed", self.status
            )

    @property
    def event_id(self) -> str:
        """``id``, else ``<message id>:<status>`` (a channel that names no event sends each
        status of a message once)."""
        return self.id or f"{self.message_id}:{self.status}"


class SendResult(msgspec.Struct, frozen=True):
    """What the provider answered: its own message id."""

    message_id: str


#: The version of a receipt (``"v"``): 2 added the delivery state (``delivery``,
#: ``delivery_code``, ``delivery_error``), so one send may have several receipts.
RECEIPT_VERSION = 2


class Receipt(msgspec.Struct, frozen=True, kw_only=True, tag_field="v", tag=RECEIPT_VERSION):
    """A settled send (``sent``, ``dead``, ``unknown``, ``cancelled``), and each change of
    a sent send's delivery state after that (``delivery``: what the channel's status
    webhooks said: ``delivered``, ``read``, ``failed``).

    Published at least once on ``<prefix>.sent`` by the Kafka worker; ``key`` and
    ``delivery`` together (the idempotency key, and the delivery state) let consumers drop
    the copies.
    """

    key: NonEmpty
    chat_id: NonEmpty
    message_id: str | None
    state: OutboxState
    inbound_id: str | None = None
    part: Annotated[int, msgspec.Meta(ge=1)] = 1
    ts: float = 0.0
    #: Set when the send's fallback went out instead of it: the key it went out under
    #: (``<key>~fallback``); absent when the send itself went out.
    fallback_key: str | None = None
    #: How far the sent message got, as the channel's status webhooks said (``None``: no
    #: status yet, or a channel without them).
    delivery: DeliveryState | None = None
    #: The channel's error code and title when ``delivery`` is ``failed``.
    delivery_code: str | None = None
    delivery_error: str | None = None


class ReceiptV1(msgspec.Struct, frozen=True, kw_only=True, tag_field="v", tag=1):
    """A receipt of version 1 (before delivery states), as earlier workers wrote them:
    read as a ``Receipt`` without a delivery state (``upgrade``)."""

    key: NonEmpty
    chat_id: NonEmpty
    message_id: str | None
    state: OutboxState
    inbound_id: str | None = None
    part: Annotated[int, msgspec.Meta(ge=1)] = 1
    ts: float = 0.0
    fallback_key: str | None = None

    def upgrade(self) -> Receipt:
        return Receipt(**msgspec.structs.asdict(self))
