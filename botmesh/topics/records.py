"""Records on the wire: decode and validate inbound records and send requests, encode and
decode receipts.

The inbound and receipt records are the message model of :mod:`botmesh.state.messages` (``Inbound``,
``Media``, ``Receipt``), defined there once; the send request (:class:`SendRequest`, a send
from outside a handler, on ``<prefix>.requests``) is defined here, on the same ``Media``.
This module only puts them on the wire and takes them off. Values are UTF-8 JSON objects with
a version field ``"v": 1``; keys are the chat id (UTF-8), so the default partitioner gives a
chat one partition. The JSON Schema files ``botmesh/topics/schemas/inbound.v1.json``,
``receipt.v1.json`` and ``request.v1.json`` are generated from the same structs
(``python -m botmesh.topics.schemas``); ``SCHEMAS.md`` documents them.

Decoding is one ``msgspec`` pass that validates as it parses. Only a record that pass refuses
takes the slow path, which parses it again without types and looks at its structure to say
why, as a :class:`~botmesh.state.errors.BadRecord` whose ``reason`` (a
:class:`~botmesh.state.errors.Reason`,
the DLQ ``reason`` header) is stable and whose ``detail`` names the field and the fix:

``empty``            no value (a tombstone) or an empty value
``bad-json``         the value is not UTF-8 JSON, or is nested more than 256 levels deep
``not-object``       the JSON is not an object
``unknown-version``  ``v`` is missing or not a version we read (``1``)
``missing-chat-id``  no ``chat_id``, or a null or empty one
``wrong-type``       another field has the wrong type or value (an empty ``id``, a ``kind``
                     other than ``message``/``interaction``, ``media.data`` not base64, a
                     request without ``text`` or ``media``, a ``#`` in a request's key…)

One form the structs refuse is accepted on purpose: a ``chat_id`` (of an inbound or a
request) given as a JSON integer is read as its decimal string (chat ids of some channels are
numbers). Such a record takes the slow path (about three passes instead of one). Unknown
fields are ignored.
"""

from __future__ import annotations

import json
import re
from functools import cache
from importlib import resources
from typing import Annotated, Any, Final, Literal, TypeVar, cast

import msgspec
import msgspec.inspect as mi

from botmesh.state.errors import BadRecord, Reason
from botmesh.state.messages import (
    RECEIPT_VERSION,
    SCHEMA_VERSION,
    DeliveryStatus,
    Inbound,
    Media,
    Receipt,
    ReceiptV1,
)

__all__ = [
    "REQUEST_KEY_PREFIX",
    "SCHEMA_VERSION",
    "SendRequest",
    "chat_key",
    "decode_inbound",
    "decode_receipt",
    "decode_request",
    "decode_status",
    "encode_inbound",
    "encode_receipt",
    "encode_request",
    "encode_status",
    "schema",
]

#: The idempotency key of a request that gives none is ``req:<request id>``.
REQUEST_KEY_PREFIX = "req:"

_NonEmpty = Annotated[str, msgspec.Meta(min_length=1)]
#: A time as epoch seconds (a finite number, not before 1970).
_Epoch = Annotated[float, msgspec.Meta(ge=0, le=1e11)]


class SendRequest(
    msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, tag_field="v", tag=1
):
    """A send from outside a handler (another service, a cron, an operator), on
    ``<prefix>.requests`` keyed by chat id: the chat's owner journals it and delivers it in
    order with the chat's other sends.

    ``id`` names the request (stable when it is produced again); ``key`` is the send's
    idempotency key, default ``req:<id>`` (:attr:`idempotency_key`), so a request delivered
    or produced twice sends once. It needs ``text`` or ``media``.

    ``at`` (epoch seconds) makes it a scheduled send: journaled when the owner reads it,
    sent at or after ``at`` by the owner's sweeper, whichever worker owns the chat by then
    (a request with an ``at`` in the past is journaled for the sweeper and goes out now:
    ``botmesh broadcast`` sends so, cancellable until each goes). ``expires_at`` (epoch
    seconds) is its deadline: not delivered by then, it dies ``expired`` (its dead letter on
    ``<prefix>.outbox.dlq``, its receipt ``dead``) and never goes out.
    """

    id: _NonEmpty
    chat_id: _NonEmpty
    text: str | None = None
    media: Media | None = None
    key: _NonEmpty | None = None
    options: dict[str, Any] = {}
    at: _Epoch | None = None
    expires_at: _Epoch | None = None
    #: The key of a send of the bot to edit to ``text`` (``ctx.edit``), instead of sending.
    edit: _NonEmpty | None = None
    #: The key of a send of the bot to delete (``ctx.delete``), instead of sending.
    delete: _NonEmpty | None = None

    @property
    def idempotency_key(self) -> str:
        """The send's idempotency key: ``key``, else ``req:<id>``."""
        return self.key if self.key is not None else REQUEST_KEY_PREFIX + self.id


class _Unversioned(msgspec.Struct, frozen=True, tag_field="v", tag=0):
    """A record with ``"v": 0``. A tagged struct alone decodes a record whose ``v`` is
    missing; in a union with this one, msgspec requires ``v``. Decoding to it means
    ``unknown-version``."""


_S = TypeVar("_S", bound=msgspec.Struct)
_INBOUND: Final = msgspec.json.Decoder(Inbound | _Unversioned)
_RECEIPT: Final = msgspec.json.Decoder(Receipt | ReceiptV1 | _Unversioned)
_STATUS: Final = msgspec.json.Decoder(DeliveryStatus | _Unversioned)
_REQUEST: Final = msgspec.json.Decoder(SendRequest | _Unversioned)
_UNTYPED: Final = msgspec.json.Decoder()
_ENCODER: Final = msgspec.json.Encoder()
_MISSING: Final = object()
_NOUN: Final = {"inbound": "message", "receipt": "send", "request": "send", "status": "message"}
#: The structs whose ``chat_id`` may be given as an integer (read as its decimal string).
_INT_CHAT: Final = (Inbound, SendRequest)
#: Longest piece of a bad value quoted in a ``detail`` (only enum, literal and numeric values
#: are quoted: free text could hold anything).
_QUOTE_MAX = 40


def schema(
    name: Literal["inbound", "receipt", "request", "status"], version: int | None = None
) -> dict[str, Any]:
    """The JSON Schema document shipped as ``botmesh/topics/schemas/<name>.v<version>.json``
    (``version``: the newest, by default)."""
    if version is None:
        version = RECEIPT_VERSION if name == "receipt" else SCHEMA_VERSION
    text = resources.files("botmesh.topics").joinpath(f"schemas/{name}.v{version}.json").read_text()
    doc: dict[str, Any] = json.loads(text)
    return doc


def chat_key(chat_id: str) -> bytes:
    """The record key for a chat: its id in UTF-8 (one chat, one partition)."""
    return chat_id.encode()


def decode_inbound(raw: bytes | str | None) -> Inbound:
    """Decode and validate an inbound record value; raises :class:`~botmesh.state.errors.BadRecord`.

    ``id`` is ``""`` when the record has none (the worker then uses
    ``<topic>:<partition>:<offset>``).
    """
    return _decode(raw, "inbound", Inbound, _INBOUND)


def decode_receipt(raw: bytes | str | None) -> Receipt:
    """Decode and validate a receipt value (version 2, or 1: read without a delivery
    state); raises :class:`~botmesh.state.errors.BadRecord`."""
    receipt = _decode(raw, "receipt", Receipt, _RECEIPT)
    return receipt.upgrade() if isinstance(receipt, ReceiptV1) else receipt


def _check_change(request: SendRequest) -> None:
    """What an edit or a delete request must be (beyond the struct)."""
    if request.edit is not None and request.delete is not None:
        raise BadRecord(
            Reason.WRONG_TYPE,
            "the request has both 'edit' and 'delete': give one (the key of the send to change)",
        )
    if request.edit is not None and not request.text:
        raise BadRecord(
            Reason.WRONG_TYPE,
            "an 'edit' request needs the new 'text' (a non-empty string)",
        )
    if request.media is not None or request.at is not None or request.expires_at is not None:
        raise BadRecord(
            Reason.WRONG_TYPE,
            "an 'edit' or 'delete' request takes no 'media', 'at' or 'expires_at': it changes "
            "a message that went out, now; send a new message for those",
        )


def decode_status(raw: bytes | str | None) -> DeliveryStatus:
    """Decode and validate a delivery status value (``<prefix>.statuses``); raises
    :class:`~botmesh.state.errors.BadRecord`."""
    return _decode(raw, "status", DeliveryStatus, _STATUS)


def encode_status(status: DeliveryStatus) -> bytes:
    """A delivery status as the gateway produces it to ``<prefix>.statuses``."""
    return _ENCODER.encode(status)


def decode_request(raw: bytes | str | None) -> SendRequest:
    """Decode and validate a send request value; raises :class:`~botmesh.state.errors.BadRecord`
    (beyond the struct: it needs ``text`` or ``media``, neither its ``id`` nor its ``key``
    may hold ``#``, which botmesh keeps for the parts of a split text, and its
    ``expires_at`` must come after its ``at``)."""
    request = _decode(raw, "request", SendRequest, _REQUEST)
    if request.edit is not None or request.delete is not None:
        _check_change(request)
    elif request.text is None and request.media is None:
        raise BadRecord(
            Reason.WRONG_TYPE,
            "the request has neither 'text' nor 'media': give a string 'text', a 'media' "
            "object, or both",
        )
    for field, value in (("id", request.id), ("key", request.key)):
        if value is not None and "#" in value:
            raise BadRecord(
                Reason.WRONG_TYPE,
                f"field '{field}' must not contain '#' (botmesh names the parts of a split "
                "text 'key#2', 'key#3'…); use another separator, e.g. ':' or '/'",
            )
    at, expires = request.at, request.expires_at
    if at is not None and expires is not None and expires <= at:
        raise BadRecord(
            Reason.WRONG_TYPE,
            f"field 'expires_at' ({expires}) is not after 'at' ({at}): the send would "
            "expire before it may go out; give a later 'expires_at' or leave it out",
        )
    return request


#: The deepest nesting of arrays and objects a record may have, on every Python version:
#: 3.11's decoders stop near ``sys.getrecursionlimit()`` (1000 frames, fewer the deeper the
#: caller's stack), 3.12's and 3.13's C decoders only much deeper, so without a limit of our
#: own a record refused on one would be taken on another.
_MAX_DEPTH: Final = 256
_JSON_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"')  # brackets inside strings do not nest
_BRACKET = re.compile(rb"[\[\]{}]")


def _too_deep(raw: bytes | str) -> bool:
    """Whether ``raw`` nests arrays and objects more than ``_MAX_DEPTH`` levels deep."""
    data = raw.encode("utf-8", "surrogatepass") if isinstance(raw, str) else raw
    if data.count(b"[") + data.count(b"{") <= _MAX_DEPTH:
        return False  # the usual record: too few brackets to nest that deep
    depth = 0
    for bracket in _BRACKET.findall(_JSON_STRING.sub(b"", data)):
        depth += 1 if bracket in b"[{" else -1
        if depth > _MAX_DEPTH:
            return True
    return False


def _decode(
    raw: bytes | str | None, what: str, struct: type[_S], decoder: msgspec.json.Decoder[Any]
) -> _S:
    """One typed decode on the valid path; the reason worked out on refusal."""
    if not raw:
        raise _empty(what)
    if _too_deep(raw):
        raise _nested(what)
    try:
        return _decode_or_diagnose(raw, what, struct, decoder)
    except RecursionError:  # msgspec (or the slow path) stopped at a recursion limit first
        raise _nested(what) from None


def _nested(what: str) -> BadRecord:
    return BadRecord(
        Reason.BAD_JSON,
        f"the {what} value is nested too deeply to decode (arrays or objects inside each "
        f"other, more than {_MAX_DEPTH} levels); produce a flatter JSON object",
    )


def _decode_or_diagnose(
    raw: bytes | str, what: str, struct: type[_S], decoder: msgspec.json.Decoder[Any]
) -> _S:
    try:
        value = decoder.decode(raw)
    except msgspec.ValidationError as exc:
        return _diagnose(raw, what, struct, str(exc))
    except msgspec.DecodeError as exc:
        raise _bad_json(what, exc) from None
    if not isinstance(value, _Unversioned):  # the struct, or an older version of it
        return cast(_S, value)
    return _diagnose(raw, what, struct, "v is 0")


def encode_inbound(msg: Inbound) -> bytes:
    """The wire value of an inbound record: compact JSON, ``"v": 1`` first, defaults left out
    (an ``id`` of ``""`` is left out too)."""
    return _ENCODER.encode(msg)


def encode_receipt(receipt: Receipt) -> bytes:
    """The wire value of a receipt: compact JSON, ``"v": 2`` first, every field present."""
    return _ENCODER.encode(receipt)


def encode_request(request: SendRequest) -> bytes:
    """The wire value of a send request: compact JSON, ``"v": 1`` first, defaults left out."""
    return _ENCODER.encode(request)


# -- the slow path: say why a record was refused ---------------------------------------------


def _empty(what: str) -> BadRecord:
    return BadRecord(Reason.EMPTY, f"the {what} record has no value; produce a JSON object")


def _bad_json(what: str, exc: msgspec.DecodeError) -> BadRecord:
    return BadRecord(
        Reason.BAD_JSON, f"the {what} value is not UTF-8 JSON ({exc}); produce a JSON object"
    )


def _diagnose(raw: bytes | str, what: str, struct: type[_S], why: str) -> _S:
    """Raise the :class:`BadRecord` that says why the typed decoder refused ``raw`` (``why``
    is msgspec's message, quoted only when no field explains the refusal).

    The one refused form accepted: an inbound or a request whose ``chat_id`` is an integer,
    decoded here with the id as its decimal string.
    """
    try:
        value = _UNTYPED.decode(raw)
    except msgspec.DecodeError as exc:  # the typed decoder stopped before the bad JSON
        raise _bad_json(what, exc) from None
    if not isinstance(value, dict):
        raise BadRecord(
            Reason.NOT_OBJECT,
            f"the {what} value is {_json_type(value)}, not a JSON object; "
            f'produce {{"v": {SCHEMA_VERSION}, "chat_id": ...}}',
        )
    version = value.get("v", _MISSING)
    newest = RECEIPT_VERSION if what == "receipt" else SCHEMA_VERSION
    if type(version) is not int or not 1 <= version <= newest:
        got = "missing" if version is _MISSING else _quote(version)
        raise BadRecord(
            Reason.UNKNOWN_VERSION,
            f"field 'v' is {got}; this worker reads version {newest} "
            f'(set "v": {newest}, or upgrade the worker for newer versions)',
        )
    chat = value.get("chat_id")
    if chat is None or chat == "":
        raise BadRecord(
            Reason.MISSING_CHAT_ID,
            f"field 'chat_id' is required: the chat the {_NOUN[what]} belongs to "
            "(a non-empty string)",
        )
    if struct in _INT_CHAT and not isinstance(chat, str):
        if type(chat) is not int:
            raise BadRecord(
                Reason.WRONG_TYPE,
                f"field 'chat_id' must be a non-empty string or an integer, got {_json_type(chat)}",
            )
        value["chat_id"] = str(chat)
        try:
            return cast(_S, _typed(struct).decode(_ENCODER.encode(value)))
        except msgspec.ValidationError:
            pass  # another field is wrong too: say which
    _check_fields(value, struct, "")
    raise BadRecord(Reason.WRONG_TYPE, f"the {what} record does not fit v1: {why}")


def _check_fields(value: dict[str, Any], struct: type[msgspec.Struct], prefix: str) -> None:
    """``wrong-type`` for the first field of ``value`` that ``struct`` does not accept."""
    for name, annotation, info in _fields(struct):
        field = f"{prefix}{name}"
        if name not in value:
            if info.required:
                raise BadRecord(
                    Reason.WRONG_TYPE,
                    f"field '{field}' is required: give {_words(info.type)}",
                )
            continue
        got = value[name]
        try:
            _typed(annotation).decode(_ENCODER.encode(got))
        except msgspec.ValidationError:
            pass
        else:
            continue
        inner = _struct_of(info.type)
        if inner is not None and isinstance(got, dict):
            _check_fields(got, inner, f"{field}.")
        omit = "" if info.required else " (or omit it)"
        raise BadRecord(
            Reason.WRONG_TYPE,
            f"field '{field}' must be {_words(info.type)}{omit}, got {_got(got, info.type)}",
        )


@cache
def _fields(struct: type[msgspec.Struct]) -> tuple[tuple[str, Any, mi.Field], ...]:
    """``(wire name, annotation, inspected field)`` for each field but the tag."""
    annotations = {f.encode_name: f.type for f in msgspec.structs.fields(struct)}
    info = mi.type_info(struct)
    assert isinstance(info, mi.StructType)
    return tuple((f.encode_name, annotations[f.encode_name], f) for f in info.fields)


@cache
def _typed(annotation: Any) -> msgspec.json.Decoder[Any]:
    return msgspec.json.Decoder(annotation)


def _struct_of(t: mi.Type) -> type[msgspec.Struct] | None:
    for part in t.types if isinstance(t, mi.UnionType) else (t,):
        if isinstance(part, mi.StructType):
            return part.cls
    return None


def _words(t: mi.Type) -> str:
    """What a field takes, in words (``a non-empty string``, ``a number or null``...)."""
    if isinstance(t, mi.UnionType):
        return " or ".join(_words(p) for p in t.types)
    if isinstance(t, mi.StrType):
        return "a non-empty string" if t.min_length else "a string"
    if isinstance(t, mi.IntType):
        return "an integer" + (f" >= {t.ge}" if t.ge is not None else "")
    if isinstance(t, mi.FloatType):
        return "a number"
    if isinstance(t, mi.BytesType):
        return "base64 text"
    if isinstance(t, mi.NoneType):
        return "null"
    if isinstance(t, mi.LiteralType | mi.EnumType):
        values = t.values if isinstance(t, mi.LiteralType) else [m.value for m in t.cls]
        return "one of " + ", ".join(repr(v) for v in values)
    if isinstance(t, mi.DictType | mi.StructType):
        return "an object"
    return str(t)


def _got(value: Any, t: mi.Type) -> str:
    """The bad value in words: its JSON type, or the value itself when the type was right
    (an enum string, a number out of range) and it is safe to quote."""
    if value == "":
        return "an empty string"
    kinds = t.types if isinstance(t, mi.UnionType) else (t,)
    if isinstance(value, str):
        if any(isinstance(k, mi.BytesType) for k in kinds):
            return "a string that is not base64"
        if any(isinstance(k, mi.LiteralType | mi.EnumType) for k in kinds):
            return _quote(value)
    if type(value) in (int, float) and any(isinstance(k, mi.IntType) for k in kinds):
        return _quote(value)
    return _json_type(value)


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object"


def _quote(value: Any) -> str:
    text = _ENCODER.encode(value).decode()
    return text if len(text) <= _QUOTE_MAX else text[: _QUOTE_MAX - 1] + "…"
