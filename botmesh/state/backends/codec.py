"""What the database backends (sqlite, postgres, redis) share: the value codec and the
key bounds of a prefix."""

from __future__ import annotations

from typing import Any

import msgspec

__all__ = ["decode_value", "encode_value", "prefix_bounds"]

_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder()


def encode_value(value: dict[str, Any]) -> str:
    """A journal value as JSON text (control characters escaped, so ``\\u0000`` is safe)."""
    return _encoder.encode(value).decode()


def decode_value(text: str | bytes) -> dict[str, Any]:
    value: dict[str, Any] = _decoder.decode(text)
    return value


def prefix_bounds(prefix: str) -> tuple[str, str | None]:
    """``(low, high)`` such that ``low <= key < high`` holds exactly for the keys that start
    with ``prefix`` in code-point (UTF-8 byte) order; ``high`` is ``None`` when unbounded."""
    stem = prefix.rstrip("\U0010ffff")
    if not stem:
        return prefix, None
    last = ord(stem[-1]) + 1
    if 0xD800 <= last <= 0xDFFF:  # surrogates have no UTF-8 form: skip past them
        last = 0xE000
    return prefix, stem[:-1] + chr(last)
