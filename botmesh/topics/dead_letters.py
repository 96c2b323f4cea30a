"""Dead letters on the wire: the records of ``<prefix>.inbound.dlq``, ``<prefix>.requests.dlq``
and ``<prefix>.outbox.dlq``, their headers, and how they are read back.

A dead letter's key is the chat id (so a chat's dead letters keep one partition) and its
value is JSON; its headers are UTF-8 text, readable with ``kafka-console-consumer
--property print.headers=true`` or ``kcat -J``:

====================  ============================================================
header                what it holds
====================  ============================================================
``reason``            why it is dead (a ``botmesh.state.errors.Reason``: ``send-refused``,
                      ``retries-exhausted``, ``attempts-exhausted``, ``bad-json``…)
``detail``            one line for a human (the fix, when there is one)
``error.class``       the class of the last error (``PermanentSendError``…)
``error.message``     its message (credentials in URLs masked; at most 400 chars)
``attempts``          attempts charged
``failed.first``      when the first attempt failed (Unix seconds)
``failed.last``       when the last attempt failed, i.e. when it died
``idempotency.key``   the send's key (outbox)
``inbound.id``        the inbound message's id (inbound; outbox: the message that
                      caused the send, when a handler sent it)
``chat.id``           the chat
``source.topic``      where the inbound was read: topic,
``source.partition``  partition
``source.offset``     and offset (an outbox dead letter: those of the inbound that
                      caused it, when the journal still knows)
``dead.ts``           when the dead letter was produced
====================  ============================================================

The value of an outbox dead letter is the journaled send: ``{"v": 1, "key", "chat_id",
"text", "media", "options", "part", "parts"}``; of an inbound one the message as read (a
dead letter the journal copied is the journaled message, the same JSON as on
``<prefix>.inbound``). Pure data: no Kafka client.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from botmesh.state.errors import Reason

__all__ = [
    "DETAIL_MAX",
    "DeadLetter",
    "Headers",
    "dead_letter_headers",
    "inbound_dead_letter",
    "outbox_dead_letter",
    "read_dead_letter",
    "redact",
]

Headers = list[tuple[str, bytes]]

#: The longest ``detail`` or ``error.message`` header, in characters.
DETAIL_MAX = 400

_CREDENTIALS = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*://)[^/@\s]+@")


def redact(text: str) -> str:
    """``scheme://user:secret@host`` -> ``scheme://***@host``."""
    return _CREDENTIALS.sub(r"\1***@", text)


def dead_letter_headers(
    *,
    reason: str,
    detail: str = "",
    error_class: str | None = None,
    error_message: str | None = None,
    attempts: int | None = None,
    failed_first: float | None = None,
    failed_last: float | None = None,
    key: str | None = None,
    inbound_id: str | None = None,
    chat_id: str | None = None,
    source: tuple[str, int, int] | None = None,
    now: float | None = None,
) -> Headers:
    """The headers of one dead letter (absent values are left out)."""
    pairs: list[tuple[str, str | None]] = [
        ("reason", reason),
        ("detail", redact(detail)[:DETAIL_MAX] if detail else None),
        ("error.class", error_class),
        ("error.message", redact(error_message)[:DETAIL_MAX] if error_message else None),
        ("attempts", str(attempts) if attempts is not None else None),
        ("failed.first", f"{failed_first:.3f}" if failed_first is not None else None),
        ("failed.last", f"{failed_last:.3f}" if failed_last is not None else None),
        ("idempotency.key", key),
        ("inbound.id", inbound_id),
        ("chat.id", chat_id),
    ]
    if source is not None:
        topic, partition, offset = source
        pairs += [
            ("source.topic", topic),
            ("source.partition", str(partition)),
            ("source.offset", str(offset)),
        ]
    pairs.append(("dead.ts", f"{time.time() if now is None else now:.3f}"))
    return [(k, v.encode()) for k, v in pairs if v is not None]


def _source(where: object) -> tuple[str, int, int] | None:
    """``topic:partition:offset`` (the inbox's ``source``) parsed; ``None`` when it is not."""
    if not isinstance(where, str):
        return None
    topic, _, rest = where.rpartition(":")
    topic, _, partition = topic.rpartition(":")
    if not topic or not partition.isdigit() or not rest.isdigit():
        return None
    return topic, int(partition), int(rest)


def _json(value: object) -> bytes:
    return redact(json.dumps(value, separators=(",", ":"), ensure_ascii=False)).encode()


def _error_headers(value: Mapping[str, Any]) -> dict[str, Any]:
    error = value.get("error") or {}
    last = error.get("last") or {}
    return {
        "reason": str(error.get("reason") or "unknown"),
        "error_class": error.get("type") or last.get("type"),
        "error_message": error.get("message"),
        "attempts": int(value.get("attempts", 0)),
        "failed_first": value.get("failed_first", value.get("updated")),
        "failed_last": value.get("updated"),
    }


def outbox_dead_letter(
    value: Mapping[str, Any], source: str | None
) -> tuple[bytes, bytes, Headers]:
    """Key, value and headers of the dead letter of a dead send (its journaled record)."""
    payload = value.get("payload") or {}
    chat = str(payload.get("chat_id", ""))
    body = {"v": 1, "key": value["key"], **payload}
    if value.get("parts", 1) > 1:
        body.update(part=value.get("part", 1), parts=value["parts"])
    errors = _error_headers(value)
    detail = (
        "it was not delivered by its deadline and never went out; `botmesh dlq retry` sends "
        "it now, without a deadline"
        if errors["reason"] == Reason.EXPIRED
        else "the provider refused the send, or its retries ran out; "
        "`botmesh dlq retry` sends it again"
    )
    headers = dead_letter_headers(
        **errors,
        detail=detail,
        key=value["key"],
        inbound_id=value.get("inbound_id"),
        chat_id=chat,
        source=_source(source),
    )
    return chat.encode(), _json(body), headers


def inbound_dead_letter(
    value: Mapping[str, Any], source: str | None
) -> tuple[bytes, bytes, Headers]:
    """Key, value and headers of the dead letter of a dead inbound (its journaled record)."""
    message = value.get("message") or {}
    chat = str(message.get("chat_id", ""))
    headers = dead_letter_headers(
        **_error_headers(value),
        detail="its handlers did not complete within inbox.max_attempts; "
        "`botmesh dlq replay` runs it again",
        inbound_id=value.get("id"),
        chat_id=chat,
        source=_source(source),
    )
    return chat.encode(), _json(message), headers


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """A dead letter as read back from its topic."""

    topic: str
    partition: int
    offset: int
    timestamp: float
    key: str | None
    value: bytes
    headers: dict[str, str] = field(default_factory=dict)

    @property
    def reason(self) -> str:
        return self.headers.get("reason", "")

    @property
    def chat_id(self) -> str | None:
        return self.headers.get("chat.id") or self.key

    @property
    def send_key(self) -> str | None:
        """The idempotency key of a dead send (outbox dead letters)."""
        return self.headers.get("idempotency.key")

    @property
    def inbound_id(self) -> str | None:
        found = self.headers.get("inbound.id")
        if found:
            return found
        try:
            parsed = json.loads(self.value)
        except ValueError:
            return None
        got = parsed.get("id") if isinstance(parsed, dict) else None
        return got if isinstance(got, str) else None

    @property
    def dead_ts(self) -> float:
        try:
            return float(self.headers.get("dead.ts", ""))
        except ValueError:
            return self.timestamp

    def body(self) -> Any:
        """The value as JSON when it is, else its text (or ``None`` when not UTF-8)."""
        try:
            return json.loads(self.value)
        except ValueError:
            try:
                return self.value.decode()
            except UnicodeDecodeError:
                return None

    def as_json(self) -> dict[str, Any]:
        return {
            "topic": self.topic,
            "partition": self.partition,
            "offset": self.offset,
            "timestamp": self.timestamp,
            "key": self.key,
            "headers": self.headers,
            "value": self.body(),
        }


def read_dead_letter(  # noqa: PLR0917 (the parts of a consumed record, in order)
    topic: str,
    partition: int,
    offset: int,
    timestamp_ms: int | None,
    key: bytes | None,
    value: bytes | None,
    headers: Sequence[tuple[str, bytes | None]] | None,
) -> DeadLetter:
    """A dead letter from the parts of a consumed record."""
    text = {k: (v or b"").decode(errors="replace") for k, v in headers or ()}
    return DeadLetter(
        topic=topic,
        partition=partition,
        offset=offset,
        timestamp=(timestamp_ms or 0) / 1000.0,
        key=key.decode(errors="replace") if key is not None else None,
        value=value or b"",
        headers=text,
    )
