"""Journal records: their states, the JSON the journal stores, and read-only views.

An inbox record (key ``<scope>/in/<id>``)::

    {"id", "state": InboxState, "attempts", "token", "lease", "message", "error",
     "created", "updated", "source", "failed_first", "published", "replayed"}

(``replayed``: a replay from the journal ran it, not a delivery; a later rerun gets the
journaled message too. ``message.media`` is the channel's durable reference:
``botmesh.state.media_replay``.)

An outbox record (key ``<scope>/out/<key>``)::

    {"key", "state": OutboxState, "attempts", "token", "lease", "inflight", "payload",
     "fp", "part", "parts", "previous_part", "after", "inbound_id", "message_id", "error",
     "created", "updated", "ambiguous", "published", "resolved", "retry_at", "failed_first",
     "at", "deadline", "delivery", "op", "target"}

Records are sparse: a field at its default (``None``, ``False``, part 1 of 1) is left out,
and readers use ``.get`` with the default; ``revise(value, now, field=None)`` removes a
field. That keeps every journal write small (the memory backend copies each value; the
file backend encodes it).

``lease`` is ``{"owner", "boot", "until"}`` or ``None``; ``token`` is the fencing token,
raised by every claim. ``inflight`` is true from "about to call the provider" until the
outcome is recorded: a crash in between is the ambiguous window. ``previous_part`` links a
part of a split text to the part before it; ``after`` links a send to the send of its chat
it must wait for (per-chat order across a deferral). ``ambiguous`` marks a send found in
flight after a crash. ``at`` is a scheduled send's time (epoch seconds, on its first
part): it is not sent before. ``deadline`` (epoch seconds, on every part) is when a send
not yet delivered dies ``expired`` instead of going out late (never one that may have
gone out: ``inflight`` or ``ambiguous``). ``published`` is ``False`` on a settled send
whose receipt the runtime has not yet seen acknowledged (only runtimes that publish
receipts write it). ``delivery`` is what the channel's status webhooks said of a sent
send: ``{"state": "delivered" | "read" | "failed", "ts", "code", "error"}``
(``botmesh.state.statuses``). ``op`` (``"edit"`` or ``"delete"``) makes the record an edit
or a delete of the message ``target`` (the channel's message id of a sent send's part,
``botmesh.state.edits``), not a send.

Errors are journaled in one shape (``encode_error``): ``{"type", "message", "retryable",
"reason"}``, never the exception object.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import msgspec

from botmesh.state.errors import Reason
from botmesh.state.messages import DELIVERY_STATES, Inbound, Outbound, OutboxState, Receipt

__all__ = [
    "SETTLED",
    "InboxRecord",
    "InboxState",
    "Json",
    "OutboxRecord",
    "OutboxState",
    "decode_inbound",
    "decode_outbound",
    "encode_error",
    "encode_inbound",
    "encode_outbound",
    "error_of",
    "receipt_of",
    "revise",
]

#: A journal record: a JSON object.
Json = dict[str, Any]


class InboxState(StrEnum):
    """The states of an inbound (an inbox record)."""

    #: Journaled; its handlers run, will run, or ran without being marked done yet.
    PENDING = "pending"
    #: Its handlers settled.
    DONE = "done"
    #: It ran out of attempts (``inbox.max_attempts``).
    DEAD = "dead"


#: The outbox states a send ends in; each gets a receipt.
SETTLED = frozenset(
    {OutboxState.SENT, OutboxState.DEAD, OutboxState.UNKNOWN, OutboxState.CANCELLED}
)


def revise(value: Json, now: float, **changes: Any) -> Json:
    """A copy of a record with ``changes`` applied (a ``None`` change removes the field)
    and ``updated`` set to ``now``."""
    new = dict(value)
    for name, change in changes.items():
        if change is None:
            new.pop(name, None)
        else:
            new[name] = change
    new["updated"] = now
    return new


def encode_error(kind: str, message: str, *, retryable: bool, reason: Reason | None) -> Json:
    """The one JSON shape of a journaled error (``reason``: why the record is dead, or
    ``None`` for a failed attempt that will be retried)."""
    return {"type": kind, "message": message, "retryable": retryable, "reason": reason}


def error_of(exc: BaseException, reason: Reason | None) -> Json:
    """How an exception is journaled: its class name, message and ``retryable``."""
    return encode_error(
        type(exc).__name__,
        str(exc),
        retryable=bool(getattr(exc, "retryable", True)),
        reason=reason,
    )


def encode_inbound(message: Inbound) -> Json:
    """The journaled form of an inbound (JSON; bytes base64).
    ``botmesh.state.media_replay.journaled`` first replaces its media with a durable
    reference where the provider has one."""
    value: Json = msgspec.to_builtins(message)
    return value


def decode_inbound(raw: Mapping[str, Any]) -> Inbound:
    """Rebuild a journaled inbound; raises ``msgspec.ValidationError`` on a bad record."""
    return msgspec.convert(raw, Inbound)


def encode_outbound(message: Outbound) -> Json:
    """The journaled payload of a send; raises ``TypeError`` when it is not JSON."""
    value: Json = msgspec.to_builtins(message)
    return value


def decode_outbound(raw: Mapping[str, Any]) -> Outbound:
    return msgspec.convert(raw, Outbound)


_OUTBOX_STATES = {s.value: s for s in OutboxState}


def receipt_of(value: Json, now: float) -> Receipt:
    """The receipt of an outbox record (with its delivery state, once a channel's status
    webhook set one: ``botmesh.state.statuses``)."""
    delivery = value.get("delivery")
    seen: dict[str, Any] = {}
    if isinstance(delivery, Mapping) and delivery.get("state") in DELIVERY_STATES:
        seen = {
            "delivery": DELIVERY_STATES[delivery["state"]],
            "delivery_code": delivery.get("code"),
            "delivery_error": delivery.get("error"),
        }
    return Receipt(
        key=value["key"],
        chat_id=value["payload"]["chat_id"],
        message_id=value.get("message_id"),
        state=_OUTBOX_STATES[value["state"]],
        inbound_id=value.get("inbound_id"),
        part=value.get("part", 1),
        ts=now,
        fallback_key=_fallback_key(value),
        **seen,
    )


def _fallback_key(value: Json) -> str | None:
    spec = value.get("fallback")
    if isinstance(spec, dict) and spec.get("used"):
        return str(spec.get("key"))
    return None


@dataclass(frozen=True, slots=True, kw_only=True)
class _RecordView:
    """What inbox and outbox records have in common."""

    attempts: int
    token: int
    lease_owner: str | None
    lease_until: float | None
    error: Mapping[str, Any] | None
    created: float
    updated: float
    version: int

    @staticmethod
    def _common(value: Mapping[str, Any], version: int) -> dict[str, Any]:
        lease = value.get("lease") or {}
        return {
            "attempts": value.get("attempts", 0),
            "token": value.get("token", 0),
            "lease_owner": lease.get("owner"),
            "lease_until": lease.get("until"),
            "error": value.get("error"),
            "created": value.get("created", 0.0),
            "updated": value.get("updated", 0.0),
            "version": version,
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class InboxRecord(_RecordView):
    """A read-only view of one inbox record (``app.durability.inbox.list()``)."""

    id: str
    state: InboxState
    message: Mapping[str, Any]

    @classmethod
    def from_value(cls, value: Mapping[str, Any], version: int) -> InboxRecord:
        return cls(
            id=value["id"],
            state=InboxState(value["state"]),
            message=value.get("message", {}),
            **cls._common(value, version),
        )

    def inbound(self) -> Inbound:
        return decode_inbound(self.message)


@dataclass(frozen=True, slots=True, kw_only=True)
class OutboxRecord(_RecordView):
    """A read-only view of one outbox record (``app.durability.outbox.list()``)."""

    key: str
    state: OutboxState
    chat_id: str
    inflight: bool
    part: int
    parts: int
    previous_part: str | None
    after: str | None
    inbound_id: str | None
    message_id: str | None
    payload: Mapping[str, Any]
    ambiguous: bool = False
    published: bool = True

    @classmethod
    def from_value(cls, value: Mapping[str, Any], version: int) -> OutboxRecord:
        return cls(
            key=value["key"],
            state=OutboxState(value["state"]),
            chat_id=value["payload"]["chat_id"],
            inflight=bool(value.get("inflight")),
            part=value.get("part", 1),
            parts=value.get("parts", 1),
            previous_part=value.get("previous_part"),
            after=value.get("after"),
            inbound_id=value.get("inbound_id"),
            message_id=value.get("message_id"),
            payload=value["payload"],
            ambiguous=bool(value.get("ambiguous")),
            published=value.get("published", True) is not False,
            **cls._common(value, version),
        )

    def outbound(self) -> Outbound:
        return decode_outbound(self.payload)
