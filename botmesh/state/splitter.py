"""Deterministic text splitting for channel limits: the same text and limit always give
the same parts, so part keys (``key``, ``key#2``…) line up on every replay.

A text is cut between extended grapheme clusters (Unicode UAX #29, ``regex``'s ``\\X``), so
a flag, an emoji joined with ZWJ (👨‍👩‍👧), a skin tone or a combining accent (e + ◌́) is
never split across two messages. Within the limit, a part ends after the last newline, else
after the last space, when that falls in the second half of the window; else it takes all
the clusters that fit. Only a single cluster longer than the whole limit is cut inside (by
code points: there is no better place).

A part that would hold only whitespace (or invisible format characters) is dropped: a
channel refuses an empty message, and every later part of the text would die with it. The
whitespace it held is lost, where the message break stands in for it anyway. A text that is
nothing but whitespace is not split: it goes out as one part, cut to the limit (the
channel's answer to it is the same as for a short one).

``unit`` is what the channel's ``text_limit`` counts: ``"code-points"`` (Python's ``len``,
the default) or ``"utf-16"`` (UTF-16 code units, as Telegram and JavaScript count: an emoji
outside the BMP counts 2). A channel declares it with a ``text_limit_unit`` attribute
(``unit_of``). No part is longer than the limit in that unit.

Plain texts (no character that joins with its neighbour; ``\\r\\n`` aside, which is one
cluster) split exactly as they did before clusters were used, except that a part that would
have been only whitespace is now dropped.
"""

from __future__ import annotations

import unicodedata
from typing import Literal

import regex  # type: ignore[import-untyped]  # regex ships no type hints; \X is all we use

__all__ = ["Unit", "split_text", "text_length", "unit_of"]

#: What a channel's ``text_limit`` counts.
Unit = Literal["code-points", "utf-16"]
_UNITS: tuple[Unit, ...] = ("code-points", "utf-16")

#: One extended grapheme cluster.
_CLUSTER = regex.compile(r"\X", regex.DOTALL)

#: Characters a part may not consist of only: whitespace, controls, format characters
#: (zero-width space, joiners, direction marks), separators.
_INVISIBLE = frozenset({"Cc", "Cf", "Zs", "Zl", "Zp"})


def unit_of(provider: object) -> Unit:
    """The unit of ``provider.text_limit``: its ``text_limit_unit`` attribute when it has
    one (``"code-points"`` or ``"utf-16"``), else ``"code-points"``."""
    unit = getattr(provider, "text_limit_unit", "code-points")
    if unit not in _UNITS:
        raise ValueError(
            f"{type(provider).__name__}.text_limit_unit is {unit!r}: use 'code-points' or "
            "'utf-16' (what the channel's text_limit counts)"
        )
    return unit


def text_length(text: str, unit: Unit = "code-points") -> int:
    """The length of ``text`` in ``unit``."""
    if unit == "utf-16":
        return len(text) + sum(1 for ch in text if ord(ch) > 0xFFFF)
    return len(text)


def split_text(text: str, limit: int | None, unit: Unit = "code-points") -> list[str]:
    """Split ``text`` into parts of at most ``limit`` (in ``unit``), between grapheme
    clusters, preferring a break after the last newline, then the last space, in the second
    half of a window; never a part of only whitespace (see the module docstring)."""
    if limit is None or limit <= 0 or text_length(text, unit) <= limit:
        return [text]
    clusters: list[str] = _CLUSTER.findall(text)
    sizes = [text_length(c, unit) for c in clusters]
    parts: list[str] = []
    i, n = 0, len(clusters)
    while i < n:
        size, j = 0, i
        while j < n and size + sizes[j] <= limit:
            size += sizes[j]
            j += 1
        if j == i:  # one cluster longer than the limit: cut inside it, by code points
            parts.extend(p for p in _cut_code_points(clusters[i], limit, unit) if not _blank(p))
            i += 1
            continue
        cut = j if j == n else _break(clusters, sizes, i, j, limit)
        part = "".join(clusters[i:cut])
        if not _blank(part):
            parts.append(part)
        i = cut
    if not parts:  # nothing but whitespace: one part, cut to the limit
        return [_head(clusters, sizes, limit)]
    return parts


def _break(clusters: list[str], sizes: list[int], i: int, j: int, limit: int) -> int:
    """Where the part of clusters ``i`` to ``j`` (all of which fit) ends: after its last
    newline, else its last space, when that starts in the second half of the limit; else
    at ``j``."""
    for separator in ("\n", " "):
        offset = sum(sizes[i:j])
        for k in range(j - 1, i - 1, -1):
            offset -= sizes[k]  # where cluster k starts, from the part's start
            if offset < limit // 2:
                break
            cluster = clusters[k]
            if cluster == separator or (separator == "\n" and cluster == "\r\n"):
                return k + 1  # keep the separator at the end of the part
    return j


def _cut_code_points(cluster: str, limit: int, unit: Unit) -> list[str]:
    """A cluster longer than ``limit`` in pieces that fit (at least one code point each)."""
    pieces: list[str] = []
    piece, size = "", 0
    for ch in cluster:
        width = text_length(ch, unit)
        if piece and size + width > limit:
            pieces.append(piece)
            piece, size = "", 0
        piece += ch
        size += width
    if piece:
        pieces.append(piece)
    return pieces


def _head(clusters: list[str], sizes: list[int], limit: int) -> str:
    """The first clusters of a text that fit in ``limit`` (at least one)."""
    size, j = 0, 0
    while j < len(clusters) and size + sizes[j] <= limit:
        size += sizes[j]
        j += 1
    return "".join(clusters[: max(j, 1)])


def _blank(part: str) -> bool:
    """Only whitespace or invisible characters (nothing a channel would show)."""
    return all(ch.isspace() or unicodedata.category(ch) in _INVISIBLE for ch in part)
