"""Record schemas on the wire: decode and validate inbound records, encode and decode receipts.

Values are UTF-8 JSON objects with a version field ``"v": 1``; keys are the chat id (UTF-8), so
the default partitioner gives a chat one partition. The JSON Schema files are
``topics/schemas/inbound.v1.json`` and ``receipt.v1.json`` (package data); ``SCHEMAS.md``
documents both. This module is the validator the worker runs (no jsonschema dependency).

Every way a record can be bad raises :class:`BadRecord` with a stable ``reason`` code (the
``reason`` header of the DLQ record) and a ``detail`` that names the field and the fix:

``empty``            no value (a tombstone) or an empty value
``bad-json``         the value is not UTF-8 JSON
``not-object``       the JSON is not an object
``unknown-version``  ``v`` is missing or not a version we read
``missing-chat-id``  no ``chat_id`` (or an empty one)
``wrong-type``       a field has the wrong type
"""

from __future__ import annotations

import base64
import binascii
import json
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import resources
from typing import Any, Literal

__all__ = [
    "REASONS",
    "SCHEMA_VERSION",
    "BadRecord",
    "InboundRecord",
    "MediaRef",
    "ReceiptRecord",
    "chat_key",
    "decode_inbound",
    "decode_receipt",
    "encode_inbound",
    "encode_receipt",
    "schema",
]

SCHEMA_VERSION = 1
Reason = Literal[
    "empty", "bad-json", "not-object", "unknown-version", "missing-chat-id", "wrong-type"
]
REASONS: tuple[str, ...] = (
    "empty",
    "bad-json",
    "not-object",
    "unknown-version",
    "missing-chat-id",
    "wrong-type",
)


class BadRecord(ValueError):
    """A record that cannot be decoded: ``reason`` is a stable code, ``detail`` says why."""

    def __init__(self, reason: Reason, detail: str) -> None:
        super().__init__(reason, detail)
        self.reason: Reason = reason
        self.detail = detail

    def __str__(self) -> str:
        return f"{self.reason}: {self.detail}"


@dataclass(frozen=True, slots=True)
class MediaRef:
    url: str | None = None
    path: str | None = None
    mime: str | None = None
    data: bytes | None = None


@dataclass(frozen=True, slots=True)
class InboundRecord:
    """A decoded inbound record (``id`` is ``None`` when the producer gave none)."""

    chat_id: str
    id: str | None = None
    text: str | None = None
    kind: Literal["message", "interaction"] = "message"
    sender: str | None = None
    channel: str | None = None
    ts: float | None = None
    media: MediaRef | None = None
    data: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ReceiptRecord:
    key: str
    chat_id: str
    message_id: str | None
    state: str
    inbound_id: str | None = None
    part: int = 1
    ts: float = 0.0


def schema(name: Literal["inbound", "receipt"], version: int = SCHEMA_VERSION) -> dict[str, Any]:
    """The JSON Schema document shipped as ``topics/schemas/<name>.v<version>.json``."""
    text = resources.files("topics").joinpath(f"schemas/{name}.v{version}.json").read_text()
    doc: dict[str, Any] = json.loads(text)
    return doc


def chat_key(chat_id: str) -> bytes:
    """The record key for a chat: its id in UTF-8 (one chat, one partition)."""
    return chat_id.encode()


def _load(raw: bytes | str | None, what: str) -> dict[str, Any]:
    if raw is None or len(raw) == 0:
        raise BadRecord("empty", f"the {what} record has no value; produce a JSON object")
    try:
        value = json.loads(raw)
    except (UnicodeDecodeError, ValueError) as exc:
        raise BadRecord(
            "bad-json", f"the {what} value is not UTF-8 JSON ({exc}); produce a JSON object"
        ) from None
    if not isinstance(value, dict):
        raise BadRecord(
            "not-object",
            f"the {what} value is JSON {type(value).__name__}, not an object; "
            'produce {"v": 1, "chat_id": ...}',
        )
    version = value.get("v")
    if version != SCHEMA_VERSION or isinstance(version, bool):
        got = "missing" if "v" not in value else repr(version)
        raise BadRecord(
            "unknown-version",
            f"field 'v' is {got}; this worker reads version {SCHEMA_VERSION} "
            f'(set "v": {SCHEMA_VERSION}, or upgrade the worker for newer versions)',
        )
    return value


def _opt_str(obj: Mapping[str, Any], name: str, where: str = "") -> str | None:
    value = obj.get(name)
    if value is None or isinstance(value, str):
        return value
    raise BadRecord(
        "wrong-type",
        f"field '{where}{name}' must be a string or null, got {type(value).__name__}",
    )


def _chat_id(value: dict[str, Any]) -> str:
    chat = value.get("chat_id")
    if chat is None or chat == "":
        raise BadRecord(
            "missing-chat-id",
            "field 'chat_id' is required: the chat the message belongs to (a non-empty string)",
        )
    if isinstance(chat, bool) or not isinstance(chat, str | int):
        raise BadRecord(
            "wrong-type",
            f"field 'chat_id' must be a string or an integer, got {type(chat).__name__}",
        )
    return str(chat)


def decode_inbound(raw: bytes | str | None) -> InboundRecord:
    """Decode and validate an inbound record value; raises :class:`BadRecord`."""
    value = _load(raw, "inbound")
    chat_id = _chat_id(value)
    rid = _opt_str(value, "id")
    if rid == "":
        raise BadRecord("wrong-type", "field 'id' must not be empty (omit it or give the id)")
    kind = value.get("kind", "message")
    if kind not in ("message", "interaction"):
        raise BadRecord(
            "wrong-type", f"field 'kind' must be 'message' or 'interaction', got {kind!r}"
        )
    ts = value.get("ts")
    if ts is not None and (isinstance(ts, bool) or not isinstance(ts, int | float)):
        raise BadRecord(
            "wrong-type", f"field 'ts' must be a number (seconds), got {type(ts).__name__}"
        )
    data = value.get("data", {})
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise BadRecord("wrong-type", f"field 'data' must be an object, got {type(data).__name__}")
    return InboundRecord(
        chat_id=chat_id,
        id=rid,
        text=_opt_str(value, "text"),
        kind=kind,
        sender=_opt_str(value, "sender"),
        channel=_opt_str(value, "channel"),
        ts=float(ts) if ts is not None else None,
        media=_media(value.get("media")),
        data=data,
    )


def _media(value: Any) -> MediaRef | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise BadRecord(
            "wrong-type", f"field 'media' must be an object or null, got {type(value).__name__}"
        )
    raw = _opt_str(value, "data", "media.")
    data: bytes | None = None
    if raw is not None:
        try:
            data = base64.b64decode(raw, validate=True)
        except (binascii.Error, ValueError):
            raise BadRecord("wrong-type", "field 'media.data' must be base64") from None
    return MediaRef(
        url=_opt_str(value, "url", "media."),
        path=_opt_str(value, "path", "media."),
        mime=_opt_str(value, "mime", "media."),
        data=data,
    )


def encode_inbound(record: InboundRecord) -> bytes:
    """The wire value of an inbound record (compact JSON, ``"v": 1``)."""
    out: dict[str, Any] = {"v": SCHEMA_VERSION, "chat_id": record.chat_id}
    if record.id is not None:
        out["id"] = record.id
    for name in ("text", "sender", "channel", "ts"):
        value = getattr(record, name)
        if value is not None:
            out[name] = value
    if record.kind != "message":
        out["kind"] = record.kind
    if record.media is not None:
        m = record.media
        media: dict[str, Any] = {
            k: v for k, v in (("url", m.url), ("path", m.path), ("mime", m.mime)) if v
        }
        if m.data is not None:
            media["data"] = base64.b64encode(m.data).decode()
        out["media"] = media
    if record.data:
        out["data"] = dict(record.data)
    return json.dumps(out, separators=(",", ":")).encode()


def encode_receipt(
    *,
    key: str,
    chat_id: str,
    message_id: str | None,
    state: str,
    inbound_id: str | None,
    part: int,
    ts: float | None = None,
) -> bytes:
    """The wire value of a sent receipt (``ts`` defaults to now)."""
    doc = {
        "v": SCHEMA_VERSION,
        "key": key,
        "chat_id": chat_id,
        "message_id": message_id,
        "state": state,
        "inbound_id": inbound_id,
        "part": part,
        "ts": time.time() if ts is None else ts,
    }
    return json.dumps(doc, separators=(",", ":")).encode()


def decode_receipt(raw: bytes | str | None) -> ReceiptRecord:
    """Decode a sent receipt; raises :class:`BadRecord`."""
    value = _load(raw, "receipt")
    chat_id = _chat_id(value)
    key = value.get("key")
    if not isinstance(key, str) or not key:
        raise BadRecord("wrong-type", "field 'key' must be a non-empty string")
    state = value.get("state")
    if not isinstance(state, str):
        raise BadRecord("wrong-type", "field 'state' must be a string")
    part = value.get("part", 1)
    if isinstance(part, bool) or not isinstance(part, int) or part < 1:
        raise BadRecord("wrong-type", f"field 'part' must be an integer >= 1, got {part!r}")
    ts = value.get("ts", 0.0)
    if isinstance(ts, bool) or not isinstance(ts, int | float):
        raise BadRecord("wrong-type", "field 'ts' must be a number")
    return ReceiptRecord(
        key=key,
        chat_id=chat_id,
        message_id=_opt_str(value, "message_id"),
        state=state,
        inbound_id=_opt_str(value, "inbound_id"),
        part=part,
        ts=float(ts),
    )
