"""Record schemas: decode/encode round trips and one reason per way a record can be bad."""

from __future__ import annotations

import json

import pytest

from topics import (
    REASONS,
    BadRecord,
    InboundRecord,
    MediaRef,
    chat_key,
    decode_inbound,
    decode_receipt,
    encode_inbound,
    encode_receipt,
    schema,
)


def test_minimal_inbound() -> None:
    rec = decode_inbound(b'{"v": 1, "chat_id": "c1", "text": "hi"}')
    assert rec == InboundRecord(chat_id="c1", text="hi")
    assert rec.kind == "message" and rec.id is None and rec.data == {}


def test_integer_chat_id_reads_as_string() -> None:
    assert decode_inbound(b'{"v": 1, "chat_id": 42}').chat_id == "42"


def test_inbound_round_trip() -> None:
    rec = InboundRecord(
        chat_id="c",
        id="m-1",
        text="t",
        kind="interaction",
        sender="u",
        channel="tg",
        ts=1.5,
        media=MediaRef(url="https://x/y.png", mime="image/png", data=b"\x00\x01"),
        data={"button": "ok"},
    )
    raw = encode_inbound(rec)
    assert json.loads(raw)["v"] == 1
    assert decode_inbound(raw) == rec


def test_unknown_fields_are_ignored() -> None:
    assert decode_inbound(b'{"v":1,"chat_id":"c","future":[1,2]}').chat_id == "c"


@pytest.mark.parametrize(
    ("raw", "reason", "words"),
    [
        (None, "empty", "no value"),
        (b"", "empty", "no value"),
        (b"{not json", "bad-json", "not UTF-8 JSON"),
        (b"\xff\xfe", "bad-json", "not UTF-8 JSON"),
        (b"[1, 2]", "not-object", "JSON list, not an object"),
        (b'"text"', "not-object", "JSON str"),
        (b'{"chat_id": "c"}', "unknown-version", "'v' is missing"),
        (b'{"v": 2, "chat_id": "c"}', "unknown-version", "'v' is 2"),
        (b'{"v": true, "chat_id": "c"}', "unknown-version", "'v' is True"),
        (b'{"v": "1", "chat_id": "c"}', "unknown-version", "'v' is '1'"),
        (b'{"v": 1}', "missing-chat-id", "'chat_id' is required"),
        (b'{"v": 1, "chat_id": ""}', "missing-chat-id", "'chat_id' is required"),
        (b'{"v": 1, "chat_id": null}', "missing-chat-id", "'chat_id' is required"),
        (b'{"v": 1, "chat_id": ["c"]}', "wrong-type", "'chat_id' must be a string"),
        (b'{"v": 1, "chat_id": true}', "wrong-type", "'chat_id' must be a string"),
        (b'{"v": 1, "chat_id": "c", "text": 5}', "wrong-type", "'text' must be a string"),
        (b'{"v": 1, "chat_id": "c", "id": ""}', "wrong-type", "'id' must not be empty"),
        (b'{"v": 1, "chat_id": "c", "kind": "poke"}', "wrong-type", "'kind' must be"),
        (b'{"v": 1, "chat_id": "c", "ts": "now"}', "wrong-type", "'ts' must be a number"),
        (b'{"v": 1, "chat_id": "c", "data": [1]}', "wrong-type", "'data' must be an object"),
        (b'{"v": 1, "chat_id": "c", "media": "x"}', "wrong-type", "'media' must be an object"),
        (b'{"v":1,"chat_id":"c","media":{"url":1}}', "wrong-type", "'media.url' must be"),
        (b'{"v":1,"chat_id":"c","media":{"data":"@@"}}', "wrong-type", "base64"),
    ],
)
def test_bad_inbound_reasons(raw: bytes | None, reason: str, words: str) -> None:
    with pytest.raises(BadRecord) as info:
        decode_inbound(raw)
    assert info.value.reason == reason
    assert reason in REASONS
    assert words in info.value.detail
    assert str(info.value).startswith(f"{reason}: ")


def test_receipt_round_trip() -> None:
    raw = encode_receipt(
        key="m-1:1", chat_id="c", message_id="p-9", state="sent", inbound_id="m-1", part=2, ts=3.0
    )
    rec = decode_receipt(raw)
    assert (rec.key, rec.chat_id, rec.message_id, rec.state, rec.inbound_id, rec.part, rec.ts) == (
        "m-1:1",
        "c",
        "p-9",
        "sent",
        "m-1",
        2,
        3.0,
    )
    assert json.loads(raw)["v"] == 1


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (b'{"v":1,"chat_id":"c","state":"sent"}', "wrong-type"),
        (b'{"v":1,"chat_id":"c","key":"k","state":"sent","part":0}', "wrong-type"),
        (b'{"v":1,"key":"k","state":"sent"}', "missing-chat-id"),
        (b'{"v":9,"key":"k"}', "unknown-version"),
    ],
)
def test_bad_receipts(raw: bytes, reason: str) -> None:
    with pytest.raises(BadRecord) as info:
        decode_receipt(raw)
    assert info.value.reason == reason


def test_schema_files_ship_and_match_the_decoder() -> None:
    inbound, receipt = schema("inbound"), schema("receipt")
    assert inbound["properties"]["v"] == {"const": 1, "description": "schema version"}
    assert set(inbound["required"]) == {"v", "chat_id"}
    assert set(InboundRecord.__dataclass_fields__) <= set(inbound["properties"])
    fields = json.loads(
        encode_receipt(key="k", chat_id="c", message_id=None, state="sent", inbound_id=None, part=1)
    )
    assert set(receipt["required"]) == set(fields)


def test_chat_key() -> None:
    assert chat_key("chat-é") == "chat-é".encode()
