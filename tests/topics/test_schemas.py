"""The JSON Schema files are generated from ``botmesh.state.messages`` and kept in step; the
examples
and tables of ``botmesh/topics/SCHEMAS.md`` match them; the files and the decoder agree.

No jsonschema package is installed, so ``_validate`` below checks the subset of JSON Schema
2020-12 the generated files use, and refuses any keyword it does not know (a new keyword in
a file fails these tests until it is checked here too).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import msgspec
import pytest

import botmesh.topics.schemas
from botmesh.state.errors import Reason
from botmesh.state.messages import DeliveryStatus, Inbound, Media, OutboxState, Receipt
from botmesh.topics import (
    SendRequest,
    decode_inbound,
    decode_receipt,
    decode_request,
    decode_status,
    encode_inbound,
    encode_receipt,
    encode_request,
    schema,
)
from botmesh.topics.schemas import NAMES, VERSIONS, Name, build, path, render, stale, write
from botmesh.topics.schemas.__main__ import main as check
from tests.topics.test_records import BAD_INBOUND
from tests.topics.test_requests import BAD_REQUESTS

DOC = Path(botmesh.topics.schemas.__file__).parent.parent / "SCHEMAS.md"
STRUCTS: dict[Name, type[msgspec.Struct]] = {
    "inbound": Inbound,
    "receipt": Receipt,
    "request": SendRequest,
    "status": DeliveryStatus,
}
DECODERS = {
    "inbound": decode_inbound,
    "receipt": decode_receipt,
    "request": decode_request,
    "status": decode_status,
}
#: The SCHEMAS.md sections that hold examples and field tables, and their record.
SECTIONS: dict[str, Name] = {
    "Inbound message or interaction (`<prefix>.inbound`)": "inbound",
    "Send request (`<prefix>.requests`)": "request",
    "Receipt (`<prefix>.sent`)": "receipt",
    "Delivery status (`<prefix>.statuses`)": "status",
}
DEAD_LETTERS = "Dead letters (`<prefix>.inbound.dlq`, `<prefix>.requests.dlq`)"


@pytest.mark.parametrize("name", NAMES)
def test_schema_file_is_in_step_with_the_struct(name: Name) -> None:
    assert path(name).read_text() == render(name), (
        f"{path(name)} is out of step with {STRUCTS[name].__name__}: "
        "run `make schemas` and commit the file"
    )


@pytest.mark.parametrize("name", NAMES)
def test_schema_loads_the_shipped_file(name: Name) -> None:
    assert schema(name) == build(name)
    assert schema(name)["$id"].endswith(f"/{name}.v{VERSIONS[name]}.json")
    assert VERSIONS[name] == (2 if name == "receipt" else 1)


def test_required_fields_are_the_structs_required_fields() -> None:
    for name, struct in STRUCTS.items():
        required = {f.encode_name for f in msgspec.structs.fields(struct) if f.required}
        assert set(build(name)["required"]) == {"v"} | required
        fields = {f.encode_name for f in msgspec.structs.fields(struct)}
        assert set(build(name)["properties"]) == {"v"} | fields


def test_write_and_check(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(botmesh.topics.schemas, "path", lambda name: tmp_path / f"{name}.json")
    assert set(stale()) == {tmp_path / f"{name}.json" for name in NAMES}
    assert check(["--check"]) == 1
    assert len(write()) == len(NAMES)
    assert stale() == [] and write() == []
    assert check(["--check"]) == 0
    (tmp_path / "receipt.json").write_text("{}\n")
    assert stale() == [tmp_path / "receipt.json"]


def test_every_field_needs_a_description(monkeypatch: pytest.MonkeyPatch) -> None:
    fields = {k: dict(v) for k, v in botmesh.topics.schemas._FIELDS.items()}
    del fields["Media"]["mime"]
    monkeypatch.setattr(botmesh.topics.schemas, "_FIELDS", fields)
    with pytest.raises(ValueError, match=r"describe each field in _FIELDS\['Media'\]"):
        build("inbound")


# -- SCHEMAS.md --------------------------------------------------------------------------------


def _sections() -> dict[str, str]:
    parts = re.split(r"^## (.+)$", DOC.read_text(), flags=re.M)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


def _examples(text: str) -> list[dict[str, Any]]:
    """Every JSON document of the section's ```json blocks (several may follow each other)."""
    out = []
    decoder = json.JSONDecoder()
    for block in re.findall(r"```json\n(.*?)```", text, flags=re.S):
        at = 0
        while block[at:].strip():
            at += len(block[at:]) - len(block[at:].lstrip())
            doc, at = decoder.raw_decode(block, at)
            out.append(doc)
    return out


def test_examples_only_where_a_record_is_documented() -> None:
    for heading, text in _sections().items():
        if heading not in SECTIONS:
            assert "```json" not in text, f"SCHEMAS.md '{heading}': example of which record?"


@pytest.mark.parametrize(("heading", "name"), SECTIONS.items())
def test_examples_decode_and_validate(heading: str, name: Name) -> None:
    examples = _examples(_sections()[heading])
    assert examples, f"no example under '{heading}'"
    decode = DECODERS[name]
    for doc in examples:
        decode(json.dumps(doc))
        _validate(doc, build(name))
    if name == "receipt":  # one receipt per settled state
        states = {OutboxState.SENT, OutboxState.DEAD, OutboxState.UNKNOWN}
        assert {doc["state"] for doc in examples} == states


@pytest.mark.parametrize(("heading", "name"), SECTIONS.items())
def test_field_tables_list_every_field(heading: str, name: Name) -> None:
    rows = re.findall(r"^\| (`[^|]*`) \|", _sections()[heading], flags=re.M)
    listed = {field for cell in rows for field in re.findall(r"`([a-z_]+)`", cell)}
    assert listed == set(build(name)["properties"])


def test_dead_letter_reasons_are_reasons() -> None:
    text = _sections()[DEAD_LETTERS].split("| `reason` | when |")[1]
    listed = set(re.findall(r"^\| `([a-z-]+)` \|", text, flags=re.M))
    decoded = {reason for _, reason, _ in BAD_INBOUND + BAD_REQUESTS}
    assert listed <= {r.value for r in Reason}, listed - {r.value for r in Reason}
    assert listed >= {r.value for r in decoded} | {Reason.JOURNAL_UNAVAILABLE.value}


# -- the schema files and the decoder agree ---------------------------------------------------

#: Refused by the decoder, allowed by any JSON Schema: ``contentEncoding`` is an annotation,
#: and JSON Schema compares numbers by value (``1.0`` is ``1``) where msgspec wants an int.
SCHEMA_BLIND = {
    b'{"v":1,"chat_id":"c","media":{"data":"@@"}}',
    b'{"v": 1.0, "chat_id": "c"}',
    # one field against another: a schema of fields does not compare them
    b'{"v":1,"id":"r","chat_id":"c","text":"t","at":100,"expires_at":50}',
}
#: Refused before there is a JSON document (no value, or bytes that do not parse): a schema
#: validates a parsed document, so it has nothing to say about these; the decoder's refusal
#: of them is checked in ``test_records`` and ``test_requests``. Every other case parses.
NOT_JSON = {Reason.EMPTY, Reason.BAD_JSON}


def _schema_cases(cases: list[tuple[bytes | str | None, Reason, str]]) -> list[bytes]:
    return [
        raw
        for raw, reason, _ in cases
        if isinstance(raw, bytes) and reason not in NOT_JSON and raw not in SCHEMA_BLIND
    ]


@pytest.mark.parametrize("raw", _schema_cases(BAD_INBOUND))
def test_the_schema_refuses_what_the_decoder_refuses(raw: bytes) -> None:
    with pytest.raises(_Invalid):
        _validate(json.loads(raw), build("inbound"))


@pytest.mark.parametrize("raw", _schema_cases(BAD_REQUESTS))
def test_the_request_schema_refuses_what_the_decoder_refuses(raw: bytes) -> None:
    with pytest.raises(_Invalid):
        _validate(json.loads(raw), build("request"))


def test_the_request_schema_accepts_what_the_encoder_writes() -> None:
    full = SendRequest(
        id="r",
        chat_id="c",
        text="t",
        media=Media(url="u", data=b"\x00"),
        key="k:1",
        options={"parse_mode": "HTML"},
    )
    for request in (full, SendRequest(id="r", chat_id="c", media=Media(path="/p"))):
        _validate(json.loads(encode_request(request)), build("request"))
    _validate({"v": 1, "id": "r", "chat_id": 42, "text": ""}, build("request"))


def test_the_schema_accepts_what_the_encoders_write() -> None:
    full = Inbound(id="m", chat_id="c", text="t", kind="interaction", sender="s", ts=1.0)
    _validate(json.loads(encode_inbound(full)), build("inbound"))
    _validate({"v": 1, "chat_id": 42}, build("inbound"))
    for state in OutboxState:
        receipt = Receipt(key="k#2", chat_id="c", message_id=None, state=state, part=2)
        _validate(json.loads(encode_receipt(receipt)), build("receipt"))


class _Invalid(AssertionError):
    pass


_ANNOTATIONS = {"$schema", "$id", "title", "description", "default", "contentEncoding"}
_TYPES: dict[str, Any] = {
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: type(v) is int or (type(v) is float and v.is_integer()),
    "number": lambda v: type(v) in (int, float),
    "null": lambda v: v is None,
    "boolean": lambda v: type(v) is bool,
}


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    return bool(a == b)


def _validate(value: Any, node: dict[str, Any], root: dict[str, Any] | None = None) -> None:
    """Raise ``_Invalid`` unless ``value`` satisfies the schema ``node`` (2020-12 subset)."""
    root = node if root is None else root
    for key, arg in node.items():
        if key in _ANNOTATIONS or key == "$defs":
            continue
        if key == "$ref":
            assert arg.startswith("#/$defs/"), arg
            _validate(value, root["$defs"][arg.removeprefix("#/$defs/")], root)
        elif key == "type":
            kinds = arg if isinstance(arg, list) else [arg]
            if not any(_TYPES[k](value) for k in kinds):
                raise _Invalid(f"{value!r} is not of type {arg}")
        elif key == "enum":
            if not any(_same(value, a) for a in arg):
                raise _Invalid(f"{value!r} not in {arg}")
        elif key == "const":
            if not _same(value, arg):
                raise _Invalid(f"{value!r} is not {arg!r}")
        elif key == "minLength":
            if isinstance(value, str) and len(value) < arg:
                raise _Invalid(f"{value!r} shorter than {arg}")
        elif key == "pattern":
            if isinstance(value, str) and not re.search(arg, value):
                raise _Invalid(f"{value!r} does not match {arg}")
        elif key == "minimum":
            if _TYPES["number"](value) and value < arg:
                raise _Invalid(f"{value!r} below {arg}")
        elif key == "anyOf":
            errors = []
            for option in arg:
                try:
                    _validate(value, option, root)
                except _Invalid as exc:
                    errors.append(str(exc))
                else:
                    break
            else:
                raise _Invalid(" and ".join(errors))
        elif key == "required":
            if isinstance(value, dict) and not set(arg) <= set(value):
                raise _Invalid(f"missing {sorted(set(arg) - set(value))}")
        elif key == "properties":
            if isinstance(value, dict):
                for name, sub in arg.items():
                    if name in value:
                        _validate(value[name], sub, root)
        else:
            raise AssertionError(f"the schema uses {key!r}: teach tests/topics/test_schemas.py")


def test_the_validator_can_refuse() -> None:
    inbound = build("inbound")
    refused: list[Any] = [{"v": 1}, {"v": 2, "chat_id": "c"}, {"v": True, "chat_id": "c"}, []]
    for bad in refused:
        with pytest.raises(_Invalid):
            _validate(bad, inbound)
    with pytest.raises(_Invalid):
        _validate(json.loads(encode_receipt(_receipt(part=1))) | {"part": 0}, build("receipt"))
    with pytest.raises(AssertionError, match="teach"):
        _validate({}, {"multipleOf": 2})


def _receipt(part: int) -> Receipt:
    return Receipt(key="k", chat_id="c", message_id="p", state=OutboxState.SENT, part=part)
