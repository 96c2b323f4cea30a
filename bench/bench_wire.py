"""Inbound decode on the worker's hot path: ``topics.decode_inbound`` (one msgspec pass over
``botmesh.state.messages.Inbound``) against the decoder it replaced (``json.loads`` plus
hand-written
checks into a dataclass, copied below as the BASELINE), side by side on the same records.

The records are what a gateway produces: 10 000 values (by default) of 80 % text messages,
10 % with a media reference, 10 % button interactions with a ``data`` payload, string chat
ids. Two more lines show the slow paths: integer chat ids (accepted, read as a string) and
refused records (the reason is worked out after the fast pass fails). Times are CPU µs per
record, best of 7 alternating runs; the ratio is baseline / new (above 1: the new one is
faster). ``.venv/bin/python bench/bench_wire.py [N]``.
"""

from __future__ import annotations

import base64
import binascii
import gc
import json
import random
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from botmesh.topics import decode_inbound

# ---------------------------------------------------------------------------------------------
# BASELINE: the decoder of botmesh/topics/records.py before the msgspec model (commit eec8c89),
# copied as it was but for the names (prefixed ``Old``/``_old``) and docstrings. Do not
# "improve" it.
# ---------------------------------------------------------------------------------------------

SCHEMA_VERSION = 1


class OldBadRecord(ValueError):
    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(reason, detail)
        self.reason = reason
        self.detail = detail


@dataclass(frozen=True, slots=True)
class OldMediaRef:
    url: str | None = None
    path: str | None = None
    mime: str | None = None
    data: bytes | None = None


@dataclass(frozen=True, slots=True)
class OldInboundRecord:
    chat_id: str
    id: str | None = None
    text: str | None = None
    kind: Literal["message", "interaction"] = "message"
    sender: str | None = None
    channel: str | None = None
    ts: float | None = None
    media: OldMediaRef | None = None
    data: Mapping[str, Any] = field(default_factory=dict)


def _old_load(raw: bytes | str | None, what: str) -> dict[str, Any]:
    if raw is None or len(raw) == 0:
        raise OldBadRecord("empty", f"the {what} record has no value; produce a JSON object")
    try:
        value = json.loads(raw)
    except (UnicodeDecodeError, ValueError) as exc:
        raise OldBadRecord(
            "bad-json", f"the {what} value is not UTF-8 JSON ({exc}); produce a JSON object"
        ) from None
    if not isinstance(value, dict):
        raise OldBadRecord(
            "not-object",
            f"the {what} value is JSON {type(value).__name__}, not an object; "
            'produce {"v": 1, "chat_id": ...}',
        )
    version = value.get("v")
    if version != SCHEMA_VERSION or isinstance(version, bool):
        got = "missing" if "v" not in value else repr(version)
        raise OldBadRecord(
            "unknown-version",
            f"field 'v' is {got}; this worker reads version {SCHEMA_VERSION} "
            f'(set "v": {SCHEMA_VERSION}, or upgrade the worker for newer versions)',
        )
    return value


def _old_opt_str(obj: Mapping[str, Any], name: str, where: str = "") -> str | None:
    value = obj.get(name)
    if value is None or isinstance(value, str):
        return value
    raise OldBadRecord(
        "wrong-type",
        f"field '{where}{name}' must be a string or null, got {type(value).__name__}",
    )


def _old_chat_id(value: dict[str, Any]) -> str:
    chat = value.get("chat_id")
    if chat is None or chat == "":
        raise OldBadRecord(
            "missing-chat-id",
            "field 'chat_id' is required: the chat the message belongs to (a non-empty string)",
        )
    if isinstance(chat, bool) or not isinstance(chat, str | int):
        raise OldBadRecord(
            "wrong-type",
            f"field 'chat_id' must be a string or an integer, got {type(chat).__name__}",
        )
    return str(chat)


def old_decode_inbound(raw: bytes | str | None) -> OldInboundRecord:
    value = _old_load(raw, "inbound")
    chat_id = _old_chat_id(value)
    rid = _old_opt_str(value, "id")
    if rid == "":
        raise OldBadRecord("wrong-type", "field 'id' must not be empty (omit it or give the id)")
    kind = value.get("kind", "message")
    if kind not in ("message", "interaction"):
        raise OldBadRecord(
            "wrong-type", f"field 'kind' must be 'message' or 'interaction', got {kind!r}"
        )
    ts = value.get("ts")
    if ts is not None and (isinstance(ts, bool) or not isinstance(ts, int | float)):
        raise OldBadRecord(
            "wrong-type", f"field 'ts' must be a number (seconds), got {type(ts).__name__}"
        )
    data = value.get("data", {})
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise OldBadRecord(
            "wrong-type", f"field 'data' must be an object, got {type(data).__name__}"
        )
    return OldInboundRecord(
        chat_id=chat_id,
        id=rid,
        text=_old_opt_str(value, "text"),
        kind=kind,
        sender=_old_opt_str(value, "sender"),
        channel=_old_opt_str(value, "channel"),
        ts=float(ts) if ts is not None else None,
        media=_old_media(value.get("media")),
        data=data,
    )


def _old_media(value: Any) -> OldMediaRef | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise OldBadRecord(
            "wrong-type", f"field 'media' must be an object or null, got {type(value).__name__}"
        )
    raw = _old_opt_str(value, "data", "media.")
    data: bytes | None = None
    if raw is not None:
        try:
            data = base64.b64decode(raw, validate=True)
        except (binascii.Error, ValueError):
            raise OldBadRecord("wrong-type", "field 'media.data' must be base64") from None
    return OldMediaRef(
        url=_old_opt_str(value, "url", "media."),
        path=_old_opt_str(value, "path", "media."),
        mime=_old_opt_str(value, "mime", "media."),
        data=data,
    )


# ------------------------------------------------------------------------- end of BASELINE --


def records(n: int, *, int_chats: bool = False, seed: int = 7) -> list[bytes]:
    """``n`` inbound values as a gateway would produce them (see the module docstring)."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        chat: str | int = 10_000_000 + i % 500 if int_chats else f"tg-{10_000_000 + i % 500}"
        doc: dict[str, Any] = {
            "v": 1,
            "id": f"tg-{i:08d}",
            "chat_id": chat,
            "sender": f"user-{rng.randrange(5000)}",
            "channel": "telegram",
            "ts": 1_764_676_800.0 + i * 0.137,
        }
        roll = rng.random()
        if roll < 0.8:
            doc["text"] = " ".join(rng.choice(WORDS) for _ in range(rng.randrange(2, 24)))
        elif roll < 0.9:
            doc["text"] = "look"
            doc["media"] = {"url": f"https://cdn.example.org/p/{i}.jpg", "mime": "image/jpeg"}
        else:
            doc["kind"] = "interaction"
            doc["data"] = {"button": rng.choice(["yes", "no", "later"]), "message_id": i - 1}
        out.append(json.dumps(doc).encode())
    return out


WORDS = ("hello", "please", "order", "status", "where", "is", "my", "parcel", "thanks", "refund")

BAD = [
    b"",
    b"{oops",
    b"[1]",
    b'{"chat_id": "c", "text": "no version"}',
    b'{"v": 1, "text": "no chat"}',
    b'{"v": 1, "chat_id": "c", "kind": "poke"}',
    b'{"v": 1, "chat_id": "c", "ts": "yesterday"}',
    b'{"v": 1, "chat_id": "c", "media": {"data": "@@@"}}',
]


def _run(decode: Callable[[bytes], object], values: list[bytes]) -> float:
    """CPU seconds to decode every value (refusals caught, as the worker does)."""
    gc.collect()
    t0 = time.process_time()
    for raw in values:
        try:  # noqa: SIM105  (contextlib.suppress would time a context manager per record)
            decode(raw)
        except ValueError:  # both BadRecord classes are ValueErrors
            pass
    return time.process_time() - t0


def _compare(label: str, values: list[bytes]) -> None:
    best = {"old": float("inf"), "new": float("inf")}
    for _ in range(7):  # alternate, best of 7: the machine is shared
        best["old"] = min(best["old"], _run(old_decode_inbound, values))
        best["new"] = min(best["new"], _run(decode_inbound, values))
    per = {k: v / len(values) * 1e6 for k, v in best.items()}
    print(f"\n  {label} ({len(values)} records)")
    print(f"    baseline json.loads + checks : {per['old']:6.2f} µs/record")
    print(f"    decode_inbound (msgspec)     : {per['new']:6.2f} µs/record")
    print(f"    ratio baseline / new         : {per['old'] / per['new']:6.2f}x")


def main(n: int) -> None:
    good = records(n)
    size = sum(map(len, good)) / len(good)
    print(f"botmesh wire benchmark: inbound decode, {n} records, {size:.0f} bytes on average")
    for raw in good[:100]:  # same answers before timing anything
        new, old = decode_inbound(raw), old_decode_inbound(raw)
        assert (new.id, new.chat_id, new.text, new.kind, new.data) == (
            old.id,
            old.chat_id,
            old.text,
            old.kind,
            old.data,
        )
    _compare("valid records, string chat ids (the hot path)", good)
    _compare("valid records, integer chat ids (compat path)", records(n, int_chats=True))
    _compare("refused records (slow path: the reason)", BAD * max(1, n // (10 * len(BAD))))


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 10_000)
