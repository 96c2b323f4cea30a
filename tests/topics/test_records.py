"""Records on the wire: round trips of ``botmesh.state.messages`` structs, and one ``Reason`` per
way
a record can be bad, with a detail that names the field and the fix."""

from __future__ import annotations

import json
from typing import Any

import pytest

import botmesh.topics.records
from botmesh.state.errors import BadRecord, Reason
from botmesh.state.messages import Inbound, Media, OutboxState, Receipt
from botmesh.topics import (
    SCHEMA_VERSION,
    chat_key,
    decode_inbound,
    decode_receipt,
    encode_inbound,
    encode_receipt,
)
from botmesh.topics.records import decode_request

#: The reasons a value can be refused for when it is decoded (the others are the engine's).
DECODE_REASONS = {
    Reason.EMPTY,
    Reason.BAD_JSON,
    Reason.NOT_OBJECT,
    Reason.UNKNOWN_VERSION,
    Reason.MISSING_CHAT_ID,
    Reason.WRONG_TYPE,
}

#: (raw value, reason, words the detail must hold). ``tests/topics/test_schemas.py`` runs the
#: same cases through the JSON Schema files.
BAD_INBOUND: list[tuple[bytes | str | None, Reason, str]] = [
    (None, Reason.EMPTY, "no value"),
    (b"", Reason.EMPTY, "no value"),
    ("", Reason.EMPTY, "no value"),
    (b"{not json", Reason.BAD_JSON, "not UTF-8 JSON"),
    (b"\xff\xfe", Reason.BAD_JSON, "not UTF-8 JSON"),
    (b"   ", Reason.BAD_JSON, "not UTF-8 JSON"),
    (b'{"v": 1, "chat_id": "c"} {}', Reason.BAD_JSON, "trailing characters"),
    (b'{"v": 2, "chat_id": "c", oops', Reason.BAD_JSON, "not UTF-8 JSON"),
    (b"[1, 2]", Reason.NOT_OBJECT, "is an array, not a JSON object"),
    (b'"text"', Reason.NOT_OBJECT, "is a string, not a JSON object"),
    (b"null", Reason.NOT_OBJECT, "is null, not a JSON object"),
    (b"7", Reason.NOT_OBJECT, "is a number, not a JSON object"),
    (b'{"chat_id": "c"}', Reason.UNKNOWN_VERSION, "'v' is missing"),
    (b'{"v": 2, "chat_id": "c"}', Reason.UNKNOWN_VERSION, "'v' is 2"),
    (b'{"v": 0, "chat_id": "c"}', Reason.UNKNOWN_VERSION, "'v' is 0"),
    (b'{"v": true, "chat_id": "c"}', Reason.UNKNOWN_VERSION, "'v' is true"),
    (b'{"v": "1", "chat_id": "c"}', Reason.UNKNOWN_VERSION, "'v' is \"1\""),
    (b'{"v": 1.0, "chat_id": "c"}', Reason.UNKNOWN_VERSION, "'v' is 1.0"),
    (b'{"v": null, "chat_id": "c"}', Reason.UNKNOWN_VERSION, "'v' is null"),
    (b'{"v": 2, "chat_id": 5, "text": 5}', Reason.UNKNOWN_VERSION, 'set "v": 1'),
    (b'{"v": 1}', Reason.MISSING_CHAT_ID, "'chat_id' is required"),
    (b'{"v": 1, "chat_id": ""}', Reason.MISSING_CHAT_ID, "'chat_id' is required"),
    (b'{"v": 1, "chat_id": null}', Reason.MISSING_CHAT_ID, "'chat_id' is required"),
    (b'{"v": 1, "chat_id": ["c"]}', Reason.WRONG_TYPE, "'chat_id' must be a non-empty string or"),
    (b'{"v": 1, "chat_id": true}', Reason.WRONG_TYPE, "or an integer, got a boolean"),
    (b'{"v": 1, "chat_id": 4.5}', Reason.WRONG_TYPE, "or an integer, got a number"),
    (b'{"v": 1, "chat_id": "c", "text": 5}', Reason.WRONG_TYPE, "'text' must be a string or null"),
    (b'{"v": 1, "chat_id": 42, "text": 5}', Reason.WRONG_TYPE, "'text' must be a string or null"),
    (b'{"v": 1, "chat_id": "c", "id": ""}', Reason.WRONG_TYPE, "'id' must be a non-empty string"),
    (b'{"v": 1, "chat_id": "c", "id": null}', Reason.WRONG_TYPE, "(or omit it), got null"),
    (b'{"v": 1, "chat_id": "c", "id": 7}', Reason.WRONG_TYPE, "'id' must be"),
    (b'{"v": 1, "chat_id": "c", "kind": "poke"}', Reason.WRONG_TYPE, "'kind' must be one of"),
    (b'{"v": 1, "chat_id": "c", "kind": null}', Reason.WRONG_TYPE, "'kind' must be one of"),
    (b'{"v": 1, "chat_id": "c", "sender": {}}', Reason.WRONG_TYPE, "'sender' must be a string"),
    (b'{"v": 1, "chat_id": "c", "channel": 1}', Reason.WRONG_TYPE, "'channel' must be a string"),
    (b'{"v": 1, "chat_id": "c", "ts": "now"}', Reason.WRONG_TYPE, "'ts' must be a number"),
    (b'{"v": 1, "chat_id": "c", "ts": true}', Reason.WRONG_TYPE, "got a boolean"),
    (b'{"v": 1, "chat_id": "c", "data": [1]}', Reason.WRONG_TYPE, "'data' must be an object"),
    (b'{"v": 1, "chat_id": "c", "data": null}', Reason.WRONG_TYPE, "'data' must be an object"),
    (b'{"v": 1, "chat_id": "c", "media": "x"}', Reason.WRONG_TYPE, "'media' must be an object"),
    (b'{"v":1,"chat_id":"c","media":{"url":1}}', Reason.WRONG_TYPE, "'media.url' must be"),
    (b'{"v":1,"chat_id":"c","media":{"mime":[]}}', Reason.WRONG_TYPE, "'media.mime' must be"),
    (b'{"v":1,"chat_id":"c","media":{"data":"@@"}}', Reason.WRONG_TYPE, "not base64"),
    (b'{"v":1,"chat_id":"c","media":{"data":5}}', Reason.WRONG_TYPE, "'media.data' must be base64"),
]


def test_minimal_inbound() -> None:
    msg = decode_inbound(b'{"v": 1, "chat_id": "c1", "text": "hi"}')
    assert msg == Inbound(chat_id="c1", text="hi")
    assert (msg.id, msg.kind, msg.data, msg.media, msg.ts) == ("", "message", {}, None, None)


@pytest.mark.parametrize(("raw", "chat"), [(b"42", "42"), (b"-1001234567890", "-1001234567890")])
def test_integer_chat_id_reads_as_its_decimal_string(raw: bytes, chat: str) -> None:
    msg = decode_inbound(b'{"v": 1, "chat_id": ' + raw + b', "id": "m", "text": "t"}')
    assert msg == Inbound(id="m", chat_id=chat, text="t")


def test_inbound_round_trip() -> None:
    msg = Inbound(
        id="m-1",
        chat_id="c",
        text="t",
        kind="interaction",
        sender="u",
        channel="tg",
        ts=1.5,
        media=Media(url="https://x/y.png", mime="image/png", data=b"\x00\x01"),
        data={"button": "ok", "n": [1, 2]},
    )
    raw = encode_inbound(msg)
    assert decode_inbound(raw) == msg
    assert decode_inbound(raw.decode()) == msg  # a str value decodes too
    assert json.loads(raw)["media"]["data"] == "AAE="


def test_encode_inbound_is_compact_versioned_and_leaves_defaults_out() -> None:
    raw = encode_inbound(Inbound(chat_id="c", text="hi"))
    assert raw == b'{"v":1,"chat_id":"c","text":"hi"}'
    assert json.loads(raw)["v"] == SCHEMA_VERSION


def test_unknown_fields_are_ignored() -> None:
    raw = b'{"v":1,"chat_id":"c","future":[1,2],"media":{"url":"u","size":9}}'
    assert decode_inbound(raw) == Inbound(chat_id="c", media=Media(url="u"))


def test_a_whole_number_ts_reads_as_seconds() -> None:
    assert decode_inbound(b'{"v":1,"chat_id":"c","ts":1764676800}').ts == 1764676800.0


@pytest.mark.parametrize(("raw", "reason", "words"), BAD_INBOUND)
def test_bad_inbound_reasons(raw: bytes | str | None, reason: Reason, words: str) -> None:
    with pytest.raises(BadRecord) as info:
        decode_inbound(raw)
    bad = info.value
    assert bad.reason is reason
    assert words in bad.detail
    assert str(bad).startswith(f"{reason}: ")


#: JSON nested deeper than the decoder takes (it stops at Python's recursion limit).
DEEP = [
    b"[" * 100_000 + b"]" * 100_000,
    b'{"v": 1, "chat_id": "c", "data": ' + b'{"a": ' * 5_000 + b"1" + b"}" * 5_001,
    b'{"v": 1, "chat_id": "c", "extra": ' + b"[" * 5_000 + b"]" * 5_000 + b"}",
    b'{"v": 1, "id": "r", "chat_id": "c", "text": "x", "options": '
    + b'{"a": ' * 5_000
    + b"1"
    + b"}" * 5_001,
]


@pytest.mark.parametrize("raw", DEEP)
def test_json_nested_too_deeply_is_bad_json_not_a_crash(raw: bytes) -> None:
    """Before, the decoder's ``RecursionError`` left the worker (status 70 at every start,
    the partition stalled)."""
    for decode, what in ((decode_inbound, "inbound"), (decode_request, "request")):
        with pytest.raises(BadRecord) as info:
            decode(raw)
        assert info.value.reason is Reason.BAD_JSON
        assert f"the {what} value is nested too deeply to decode" in info.value.detail


def test_every_decode_reason_has_a_case() -> None:
    assert {reason for _, reason, _ in BAD_INBOUND} == DECODE_REASONS
    assert set(Reason) > DECODE_REASONS


def test_details_say_what_to_do() -> None:
    fixes = {
        b"": "produce a JSON object",
        b"[]": 'produce {"v": 1',
        b'{"chat_id": "c"}': 'set "v": 1',
        b'{"v": 1}': "a non-empty string",
        b'{"v": 1, "chat_id": "c", "id": ""}': "(or omit it)",
    }
    for raw, fix in fixes.items():
        with pytest.raises(BadRecord) as info:
            decode_inbound(raw)
        assert fix in info.value.detail, raw


def test_free_text_is_never_quoted_in_a_detail() -> None:
    secret = "token-0123456789"
    for raw in (
        f'{{"v": 1, "chat_id": "c", "ts": "{secret}"}}',
        f'{{"v": 1, "chat_id": "c", "media": {{"data": "{secret}!"}}}}',
        f'{{"v": 1, "chat_id": "c", "data": "{secret}"}}',
    ):
        with pytest.raises(BadRecord) as info:
            decode_inbound(raw)
        assert secret not in info.value.detail, raw


def test_valid_records_take_one_decode(monkeypatch: pytest.MonkeyPatch) -> None:
    """The slow path (``_diagnose``) runs only for refused records and integer chat ids."""
    calls: list[bytes | str] = []
    real = botmesh.topics.records._diagnose

    def spy(raw: bytes | str, what: str, struct: type[Any], why: str) -> Any:
        calls.append(raw)
        return real(raw, what, struct, why)

    monkeypatch.setattr(botmesh.topics.records, "_diagnose", spy)
    decode_inbound(b'{"v":1,"id":"m","chat_id":"c","text":"t","media":{"data":"AAE="}}')
    decode_receipt(_receipt_bytes())
    assert calls == []
    decode_inbound(b'{"v":1,"chat_id":7}')
    assert calls == [b'{"v":1,"chat_id":7}']


_DROP = object()


def _receipt_bytes(**fields: object) -> bytes:
    """A receipt value; a field given as ``_DROP`` is left out."""
    doc: dict[str, object] = {
        "v": 1,
        "key": "k",
        "chat_id": "c",
        "message_id": "p-1",
        "state": "sent",
        "inbound_id": "m",
        "part": 1,
        "ts": 2.0,
    }
    doc.update(fields)
    return json.dumps({k: v for k, v in doc.items() if v is not _DROP}).encode()


@pytest.mark.parametrize("state", [OutboxState.SENT, OutboxState.DEAD, OutboxState.UNKNOWN])
def test_receipt_round_trip(state: OutboxState) -> None:
    receipt = Receipt(
        key="m-1:1#2",
        chat_id="c",
        message_id="p-9" if state is OutboxState.SENT else None,
        state=state,
        inbound_id="m-1",
        part=2,
        ts=3.0,
    )
    raw = encode_receipt(receipt)
    assert decode_receipt(raw) == receipt
    assert decode_receipt(raw).state is state
    assert list(json.loads(raw)) == [
        "v",
        "key",
        "chat_id",
        "message_id",
        "state",
        "inbound_id",
        "part",
        "ts",
        "fallback_key",
        "delivery",
        "delivery_code",
        "delivery_error",
    ]
    assert json.loads(raw)["v"] == 2


def test_a_version_1_receipt_is_read_without_a_delivery_state() -> None:
    raw = b'{"v":1,"key":"k","chat_id":"c","message_id":"m","state":"sent","ts":1.0}'
    receipt = decode_receipt(raw)
    assert (receipt.key, receipt.state, receipt.delivery) == ("k", "sent", None)
    with pytest.raises(BadRecord) as bad:
        decode_receipt(raw.replace(b'"v":1', b'"v":3'))
    assert bad.value.reason == "unknown-version"


@pytest.mark.parametrize(
    ("raw", "reason", "words"),
    [
        (None, Reason.EMPTY, "no value"),
        (b"{", Reason.BAD_JSON, "not UTF-8 JSON"),
        (b"[]", Reason.NOT_OBJECT, "not a JSON object"),
        (_receipt_bytes(v=9), Reason.UNKNOWN_VERSION, "'v' is 9"),
        (_receipt_bytes(v=_DROP), Reason.UNKNOWN_VERSION, "'v' is missing"),
        (_receipt_bytes(chat_id=_DROP), Reason.MISSING_CHAT_ID, "'chat_id' is required"),
        (_receipt_bytes(chat_id=5), Reason.WRONG_TYPE, "'chat_id' must be a non-empty string"),
        (_receipt_bytes(key=_DROP), Reason.WRONG_TYPE, "'key' is required"),
        (_receipt_bytes(key=""), Reason.WRONG_TYPE, "'key' must be a non-empty string"),
        (_receipt_bytes(message_id=_DROP), Reason.WRONG_TYPE, "'message_id' is required"),
        (_receipt_bytes(state="gone"), Reason.WRONG_TYPE, "'state' must be one of"),
        (
            _receipt_bytes(part=0),
            Reason.WRONG_TYPE,
            "integer >= 1 (or omit it), got 0",
        ),
        (_receipt_bytes(part=1.5), Reason.WRONG_TYPE, "'part' must be an integer"),
        (_receipt_bytes(ts="now"), Reason.WRONG_TYPE, "'ts' must be a number"),
    ],
)
def test_bad_receipts(raw: bytes | None, reason: Reason, words: str) -> None:
    with pytest.raises(BadRecord) as info:
        decode_receipt(raw)
    assert info.value.reason is reason
    assert words in info.value.detail


def test_chat_key() -> None:
    assert chat_key("chat-é") == "chat-é".encode()
    assert chat_key(decode_inbound(b'{"v":1,"chat_id":42}').chat_id) == b"42"
