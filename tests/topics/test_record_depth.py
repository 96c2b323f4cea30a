"""How deep a record may nest is botmesh's rule, not the Python version's: 3.11's decoders
stop near the recursion limit (about 1000 levels), 3.13's C ones only past several
thousand, so a record refused as ``bad-json`` on one was taken on the other (the unit suite
on 3.13 found it: tests/topics/test_records.py's 5000-level records decoded there). Now
every version takes 256 levels and refuses 257, brackets inside strings not counted.
"""

from __future__ import annotations

import pytest

from botmesh.state.errors import BadRecord, Reason
from botmesh.topics.records import decode_inbound, decode_request

LIMIT = 256


def inbound(depth: int) -> bytes:
    """An inbound record nesting ``depth`` levels: its own object, ``data`` (an object),
    then arrays."""
    return (
        b'{"v": 1, "chat_id": "c", "text": "x", "data": {"a": '
        + b"[" * (depth - 2)
        + b"]" * (depth - 2)
        + b"}}"
    )


def request(depth: int) -> bytes:
    return (
        b'{"v": 1, "id": "r", "chat_id": "c", "text": "x", "options": '
        + b'{"a": ' * (depth - 1)
        + b"1"
        + b"}" * depth
    )


@pytest.mark.parametrize("as_text", [False, True], ids=["bytes", "str"])
def test_the_limit_is_the_same_on_every_python(as_text: bool) -> None:
    for make, decode in ((inbound, decode_inbound), (request, decode_request)):
        ok, deep = make(LIMIT), make(LIMIT + 1)
        assert decode(ok.decode() if as_text else ok).chat_id == "c"
        with pytest.raises(BadRecord) as info:
            decode(deep.decode() if as_text else deep)
        assert info.value.reason is Reason.BAD_JSON
        assert f"more than {LIMIT} levels" in info.value.detail


def test_brackets_inside_strings_do_not_nest() -> None:
    text = '[{\\"' * 400  # 1200 brackets and escaped quotes, all inside one string
    raw = f'{{"v": 1, "chat_id": "c", "text": "{text}", "data": {{"a": [[1]]}}}}'.encode()
    assert decode_inbound(raw).text == '[{"' * 400


def test_many_brackets_side_by_side_are_not_deep() -> None:
    flat = b"[" + b",".join([b"[1]"] * 2000) + b"]"
    raw = b'{"v": 1, "chat_id": "c", "text": "x", "data": {"rows": ' + flat + b"}}"
    assert decode_inbound(raw).chat_id == "c"
