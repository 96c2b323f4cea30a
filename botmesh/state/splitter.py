"""Deterministic text splitting for channel limits: the same text and limit always give
the same parts, so part keys (``key``, ``key#2``…) line up on every replay."""

from __future__ import annotations

__all__ = ["split_text"]


def split_text(text: str, limit: int | None) -> list[str]:
    """Split ``text`` into parts of at most ``limit`` characters, preferring a break after
    the last newline, then the last space, in the second half of a window."""
    if limit is None or limit <= 0 or len(text) <= limit:
        return [text]
    parts: list[str] = []
    rest = text
    while len(rest) > limit:
        window = rest[:limit]
        cut = window.rfind("\n")
        if cut < limit // 2:
            cut = window.rfind(" ")
        if cut < limit // 2:
            cut = limit
        else:
            cut += 1  # keep the separator at the end of the part
        parts.append(rest[:cut])
        rest = rest[cut:]
    if rest:
        parts.append(rest)
    return parts
