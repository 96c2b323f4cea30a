"""JSON Schema files of the wire records, generated from the message model.

``inbound.v1.json``, ``receipt.v1.json`` and ``request.v1.json`` (package data;
``topics.schema(name)`` loads one) are ``msgspec.json.schema`` of
``botmesh.state.messages.Inbound``,
``Receipt`` and ``botmesh.topics.records.SendRequest``, with a title, an ``$id``, a description per
field, the one form the decoder accepts beyond the struct (a ``chat_id`` given as an integer,
inbound or request) and what the request decoder checks beyond it (``text`` or ``media``; no
``#`` in ``id`` or ``key``). Regenerate them with ``python -m botmesh.topics.schemas``
(``make schemas``); ``tests/topics/test_schemas.py`` fails when a file is out of step.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Final, Literal

import msgspec

from botmesh.state.messages import RECEIPT_VERSION, SCHEMA_VERSION, DeliveryStatus, Inbound, Receipt
from botmesh.topics.records import SendRequest

__all__ = ["NAMES", "VERSIONS", "Name", "build", "path", "render", "stale", "write"]

Name = Literal["inbound", "receipt", "request", "status"]
NAMES: Final[tuple[Name, ...]] = ("inbound", "receipt", "request", "status")
#: Each record's version (its file is ``<name>.v<version>.json``).
VERSIONS: Final[dict[Name, int]] = {
    "inbound": SCHEMA_VERSION,
    "receipt": RECEIPT_VERSION,
    "request": SCHEMA_VERSION,
    "status": SCHEMA_VERSION,
}

_STRUCTS: Final[dict[Name, type[msgspec.Struct]]] = {
    "inbound": Inbound,
    "receipt": Receipt,
    "request": SendRequest,
    "status": DeliveryStatus,
}
_TITLES: Final[dict[Name, str]] = {
    "inbound": "botmesh inbound message or interaction",
    "receipt": "botmesh receipt of a settled send, or of its delivery state",
    "status": "botmesh delivery status of a message a channel accepted",
    "request": "botmesh send request (a send from outside a handler)",
}
#: An id or key without ``#`` (botmesh keeps it for the parts of a split text).
_NO_HASH: Final = "^[^#]+$"
_DESCRIPTIONS: Final[dict[Name, str]] = {
    "inbound": (
        "Value of a record on <prefix>.inbound; the record key is the chat id (UTF-8). "
        "Unknown fields are ignored (forward compatible). Generated from "
        "botmesh.state.messages.Inbound by `python -m botmesh.topics.schemas`: do not edit."
    ),
    "status": (
        "Value of a record on <prefix>.statuses: what a channel's status webhook said of a "
        "message it accepted, produced by the webhook gateway; the record key is the chat id "
        "(UTF-8). The chat's owner joins it to the send by message_id. Unknown fields are "
        "ignored. Generated from botmesh.state.messages.DeliveryStatus by "
        "`python -m botmesh.topics.schemas`: do not edit."
    ),
    "receipt": (
        "Value of a record on <prefix>.sent, published at least once for every settled send "
        "(state sent, dead, unknown or cancelled) and for every change of a sent send's "
        "delivery state (delivered, read, failed); the record key is the chat id (UTF-8). "
        "Consumers drop copies by `key` and `delivery` together. Version 1 receipts (no "
        "delivery fields) are still read. Unknown fields are ignored. Generated from "
        "botmesh.state.messages.Receipt by `python -m botmesh.topics.schemas`: do not edit."
    ),
    "request": (
        "Value of a record on <prefix>.requests: a send from outside a handler, journaled and "
        "delivered by the worker that owns the chat, in order with the chat's other sends; the "
        "record key is the chat id (UTF-8). It needs text or media. Unknown fields are ignored. "
        "Generated from botmesh.topics.records.SendRequest by "
        "`python -m botmesh.topics.schemas`: do not edit."
    ),
}
#: What each field means. Every field of a struct needs one (``build`` refuses a struct field
#: without one, and a description of a field the struct does not have).
_FIELDS: Final[dict[str, dict[str, str]]] = {
    "Inbound": {
        "v": "schema version",
        "id": (
            "inbound record id, stable across redeliveries (the channel's message id); "
            "omit it when there is none and the worker uses <topic>:<partition>:<offset>. "
            "Send keys derive from it (<id>:<n>)"
        ),
        "chat_id": (
            "the chat the message belongs to, also the record key; "
            "an integer is read as its decimal string"
        ),
        "text": "message text",
        "kind": "a message, or a button/command interaction",
        "sender": "who sent it",
        "channel": "the channel it came from",
        "ts": "seconds since the epoch",
        "media": "a media reference",
        "data": "channel-specific payload (interaction data, buttons...)",
    },
    "Media": {
        "url": "where the media can be fetched",
        "path": "a local path to the media",
        "data": "inline bytes, base64",
        "mime": "MIME type, e.g. image/png",
        "id": "the channel's media token (Telegram file_id, WhatsApp media id)",
        "provider": "the channel that received the media (a provider name)",
        "name": "a file name, when the channel gave one",
        "extra": "channel details the adapter needs again (message key, attachment index)",
        "ref": "a durable media reference {v, data}, as the inbox journals it",
        "unavailable": (
            "why a replayed message's media cannot be rebuilt: not-durable, "
            "provider-mismatch or rehydrate-failed"
        ),
    },
    "Receipt": {
        "v": "schema version",
        "key": (
            "idempotency key of the send (explicit, else <inbound id>:<n>; part n>1 is key#n): "
            "consumers drop receipts whose key they have seen"
        ),
        "chat_id": "the chat it went to, also the record key",
        "message_id": "the provider's message id (null unless sent)",
        "state": (
            "how the send settled: sent, dead or unknown (pending and failed are journal "
            "states that never go on the wire)"
        ),
        "inbound_id": "id of the inbound whose handler sent it (null outside a handler)",
        "part": "part number of a split text",
        "ts": (
            "seconds since the epoch, when the receipt was made: when the send settled, or "
            "when a receipt left unpublished by a crash was published again"
        ),
        "fallback_key": (
            "set when the send's fallback went out instead of it (the key it went out "
            "under, <key>~fallback; docs/fallbacks.md); null when the send itself did"
        ),
        "delivery": (
            "how far the sent message got, as the channel's status webhooks said: delivered, "
            "read or failed (null: no status yet, or a channel without them); each change "
            "gets a receipt of its own"
        ),
        "delivery_code": "the channel's error code when delivery is failed (WhatsApp 131047)",
        "delivery_error": "the channel's error title when delivery is failed",
    },
    "DeliveryStatus": {
        "v": "schema version",
        "chat_id": "the chat the message went to (our recipient), also the record key",
        "message_id": "the channel's id of the message, as its send API returned it",
        "status": ("what the channel says: sent (its servers took it), delivered, read or failed"),
        "channel": "the channel that posted the status",
        "id": "the channel's id of the event, when it gives one",
        "ts": "when the channel says it happened, seconds since the epoch",
        "code": "the channel's error code, on failed",
        "error": "the channel's error title, on failed",
    },
    "SendRequest": {
        "v": "schema version",
        "id": (
            "request id, unique per request and the same when the request is produced again; "
            "the send's idempotency key is req:<id> unless key is given"
        ),
        "chat_id": (
            "the chat to send to, also the record key; an integer is read as its decimal string"
        ),
        "text": "the text to send (text or media is required)",
        "media": "a media reference sent with the text, or instead of it",
        "key": (
            "the send's idempotency key (default req:<id>): a second request with a recorded "
            "key is answered from the outbox, not sent again; its receipts carry it"
        ),
        "options": "channel options passed to the provider as they are (parse_mode, reply_to...)",
        "at": (
            "a scheduled send: epoch seconds; it goes out at or after this time, never before "
            "(a time past: it is journaled for the sweeper and goes out now)"
        ),
        "expires_at": (
            "the send's deadline, epoch seconds: not delivered by then, it dies expired (its "
            "dead letter, reason expired, and its receipt dead) and never goes out"
        ),
        "edit": (
            "the key of a send of the bot to edit to text, instead of sending: the channel's "
            "message id is the one the journal recorded; journaled under key (req:<id>), so "
            "it is made once"
        ),
        "delete": (
            "the key of a send of the bot to delete (every part), instead of sending; "
            "journaled under key (req:<id>), so it is made once"
        ),
    },
}


def build(name: Name) -> dict[str, Any]:
    """The JSON Schema document of ``name``, from its struct."""
    struct = _STRUCTS[name]
    generated = msgspec.json.schema(struct)
    defs: dict[str, Any] = generated["$defs"]
    top = defs.pop(struct.__name__)
    for def_name, definition in [(struct.__name__, top), *defs.items()]:
        _describe(def_name, definition)
    props = top["properties"]
    if name in ("inbound", "request"):
        # The one form the decoder accepts beyond the struct (botmesh.topics.records).
        text = props["chat_id"].pop("description")
        props["chat_id"] = {"anyOf": [props["chat_id"], {"type": "integer"}], "description": text}
    if name == "inbound":
        # The struct's default "" means "none given"; on the wire the field is left out.
        del props["id"]["default"]
    if name == "request":
        # What decode_request checks beyond the struct.
        props["id"]["pattern"] = _NO_HASH
        props["key"]["anyOf"][0]["pattern"] = _NO_HASH
        top["anyOf"] = [
            {"required": ["text"], "properties": {"text": {"type": "string"}}},
            {"required": ["media"], "properties": {"media": {"type": "object"}}},
            {"required": ["edit", "text"], "properties": {"text": {"type": "string"}}},
            {"required": ["delete"]},
        ]
    doc: dict[str, Any] = {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": f"https://botmesh.dev/schemas/{name}.v{VERSIONS[name]}.json",
        "title": f"{_TITLES[name]}, version {VERSIONS[name]}",
        "description": _DESCRIPTIONS[name],
    }
    doc |= {k: v for k, v in top.items() if k not in ("title", "description")}
    if defs:
        doc["$defs"] = defs
    return doc


def _describe(def_name: str, definition: dict[str, Any]) -> None:
    props: dict[str, Any] = definition.get("properties", {})
    if not props:
        return
    docs = _FIELDS.get(def_name, {})
    if set(docs) != set(props):
        raise ValueError(
            f"botmesh/topics/schemas: {def_name} fields {sorted(props)} but descriptions for "
            f"{sorted(docs)}; describe each field in _FIELDS[{def_name!r}]"
        )
    for field, prop in props.items():
        prop.setdefault("description", docs[field])


def render(name: Name) -> str:
    """The file text of ``name``'s schema (2-space JSON, one trailing newline)."""
    return json.dumps(build(name), indent=2, ensure_ascii=False) + "\n"


def path(name: Name) -> Path:
    """Where ``name``'s schema file lives in the source tree."""
    return Path(__file__).with_name(f"{name}.v{VERSIONS[name]}.json")


def stale() -> list[Path]:
    """The schema files whose text differs from what ``render`` makes now."""
    return [path(n) for n in NAMES if not path(n).exists() or path(n).read_text() != render(n)]


def write() -> list[Path]:
    """Regenerate the schema files; returns the ones that changed."""
    changed = stale()
    for n in NAMES:
        if path(n) in changed:
            path(n).write_text(render(n))
    return changed
