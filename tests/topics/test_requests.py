"""Send requests on the wire (``<prefix>.requests``): round trips of ``SendRequest``, the
default idempotency key, and one ``Reason`` per way a request can be bad, with a detail that
names the field and the fix (the same diagnosis as an inbound's)."""

from __future__ import annotations

import json

import pytest

from botmesh.state.errors import BadRecord, Reason
from botmesh.state.messages import Media
from botmesh.topics import SendRequest, decode_request, encode_request, schema
from botmesh.topics.records import REQUEST_KEY_PREFIX

#: (raw value, reason, words the detail must hold). ``tests/topics/test_schemas.py`` runs the
#: same cases through the JSON Schema file.
BAD_REQUESTS: list[tuple[bytes | str | None, Reason, str]] = [
    (None, Reason.EMPTY, "the request record has no value"),
    (b"", Reason.EMPTY, "no value"),
    (b"{not json", Reason.BAD_JSON, "the request value is not UTF-8 JSON"),
    (b"[1]", Reason.NOT_OBJECT, "is an array, not a JSON object"),
    (b'{"id": "r", "chat_id": "c", "text": "t"}', Reason.UNKNOWN_VERSION, "'v' is missing"),
    (b'{"v": 2, "id": "r", "chat_id": "c", "text": "t"}', Reason.UNKNOWN_VERSION, "'v' is 2"),
    (b'{"v": 1, "id": "r", "text": "t"}', Reason.MISSING_CHAT_ID, "the chat the send belongs"),
    (b'{"v": 1, "id": "r", "chat_id": "", "text": "t"}', Reason.MISSING_CHAT_ID, "'chat_id'"),
    (b'{"v": 1, "id": "r", "chat_id": [1], "text": "t"}', Reason.WRONG_TYPE, "or an integer"),
    (b'{"v": 1, "chat_id": "c", "text": "t"}', Reason.WRONG_TYPE, "field 'id' is required"),
    (b'{"v": 1, "id": "", "chat_id": "c", "text": "t"}', Reason.WRONG_TYPE, "'id' must be a non"),
    (b'{"v": 1, "id": 7, "chat_id": "c", "text": "t"}', Reason.WRONG_TYPE, "'id' must be"),
    (b'{"v": 1, "id": "r", "chat_id": "c", "text": 5}', Reason.WRONG_TYPE, "'text' must be a"),
    (b'{"v": 1, "id": "r", "chat_id": "c"}', Reason.WRONG_TYPE, "neither 'text' nor 'media'"),
    (
        b'{"v": 1, "id": "r", "chat_id": "c", "text": null, "media": null}',
        Reason.WRONG_TYPE,
        "neither 'text' nor 'media'",
    ),
    (b'{"v":1,"id":"r","chat_id":"c","media":{"url":1}}', Reason.WRONG_TYPE, "'media.url' must"),
    (b'{"v":1,"id":"r","chat_id":"c","media":"x"}', Reason.WRONG_TYPE, "'media' must be an obj"),
    (b'{"v":1,"id":"r","chat_id":"c","text":"t","key":""}', Reason.WRONG_TYPE, "'key' must be"),
    (b'{"v":1,"id":"r","chat_id":"c","text":"t","key":3}', Reason.WRONG_TYPE, "'key' must be"),
    (b'{"v":1,"id":"r","chat_id":"c","text":"t","key":"a#2"}', Reason.WRONG_TYPE, "'key' must not"),
    (b'{"v":1,"id":"r#1","chat_id":"c","text":"t"}', Reason.WRONG_TYPE, "'id' must not contain"),
    (b'{"v":1,"id":"r","chat_id":"c","text":"t","options":[]}', Reason.WRONG_TYPE, "'options'"),
    (b'{"v":1,"id":"r","chat_id":"c","text":"t","at":-1}', Reason.WRONG_TYPE, "'at' must be"),
    (b'{"v":1,"id":"r","chat_id":"c","text":"t","at":"9am"}', Reason.WRONG_TYPE, "'at' must"),
    (
        b'{"v":1,"id":"r","chat_id":"c","text":"t","at":100,"expires_at":50}',
        Reason.WRONG_TYPE,
        "'expires_at' (50.0) is not after 'at'",
    ),
]


@pytest.mark.parametrize(("raw", "reason", "words"), BAD_REQUESTS)
def test_a_bad_request_is_refused_with_its_reason(
    raw: bytes | str | None, reason: Reason, words: str
) -> None:
    with pytest.raises(BadRecord) as caught:
        decode_request(raw)
    assert caught.value.reason == reason
    assert words in caught.value.detail, caught.value.detail


def test_minimal_request_and_its_default_key() -> None:
    request = decode_request(b'{"v": 1, "id": "cron-1", "chat_id": "42", "text": "hi"}')
    assert request == SendRequest(id="cron-1", chat_id="42", text="hi")
    assert (request.media, request.key, request.options) == (None, None, {})
    assert request.idempotency_key == REQUEST_KEY_PREFIX + "cron-1" == "req:cron-1"


def test_an_explicit_key_is_the_idempotency_key() -> None:
    request = SendRequest(id="r", chat_id="c", text="t", key="invoice-88")
    assert request.idempotency_key == "invoice-88"


def test_round_trip_with_media_and_options() -> None:
    request = SendRequest(
        id="op-7",
        chat_id="c",
        text="see attached",
        media=Media(url="https://x/i.pdf", mime="application/pdf", data=b"\x00\x01"),
        key="k/1",
        options={"parse_mode": "HTML", "n": [1, 2]},
    )
    raw = encode_request(request)
    assert decode_request(raw) == request
    assert decode_request(raw.decode()) == request
    assert json.loads(raw)["media"]["data"] == "AAE="


def test_encode_is_compact_versioned_and_leaves_defaults_out() -> None:
    raw = encode_request(SendRequest(id="r", chat_id="c", text="hi"))
    assert raw == b'{"v":1,"id":"r","chat_id":"c","text":"hi"}'


def test_media_alone_is_enough() -> None:
    request = decode_request(b'{"v":1,"id":"r","chat_id":"c","media":{"path":"/tmp/a.png"}}')
    assert request.text is None and request.media == Media(path="/tmp/a.png")


def test_an_empty_text_is_a_text() -> None:
    assert decode_request(b'{"v":1,"id":"r","chat_id":"c","text":""}').text == ""


@pytest.mark.parametrize(("raw", "chat"), [(b"42", "42"), (b"-1001234567890", "-1001234567890")])
def test_an_integer_chat_id_reads_as_its_decimal_string(raw: bytes, chat: str) -> None:
    request = decode_request(b'{"v":1,"id":"r","chat_id":' + raw + b',"text":"t"}')
    assert request == SendRequest(id="r", chat_id=chat, text="t")


def test_an_integer_chat_id_with_another_bad_field_names_that_field() -> None:
    with pytest.raises(BadRecord, match="'text' must be a string or null"):
        decode_request(b'{"v":1,"id":"r","chat_id":42,"text":5}')


def test_unknown_fields_are_ignored() -> None:
    raw = b'{"v":1,"id":"r","chat_id":"c","text":"t","future":{"x":1},"ts":5}'
    assert decode_request(raw) == SendRequest(id="r", chat_id="c", text="t")


def test_the_schema_file_is_shipped() -> None:
    doc = schema("request")
    assert doc["$id"].endswith("/request.v1.json")
    assert set(doc["required"]) == {"v", "id", "chat_id"}
