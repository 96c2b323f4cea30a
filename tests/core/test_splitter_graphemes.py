"""The splitter cuts between grapheme clusters and never makes a blank part (defect 5).

It used to cut a text every ``limit`` code points wherever that fell: a flag, a ZWJ emoji or
an accent was torn in two across messages, and a run of spaces could make a part of only
whitespace, which a channel refuses (and every later part of the text died with it). The
parts of a text are its keys' content (``key``, ``key#2``…): the same text and limit must
give the same parts forever, and plain texts must split as they did.
"""

from __future__ import annotations

import random

import pytest
import regex  # type: ignore[import-untyped]  # no type hints; \X is all we use

from botmesh.state.splitter import split_text, text_length
from botmesh.testing import MockProvider
from tests.kit import make_app, texts

FLAG = "🇫🇷"  # two regional indicators
FAMILY = "👨\u200d👩\u200d👧"  # three emoji joined by ZWJ: 5 code points, 8 UTF-16 units
WAVE = "👋🏽"  # an emoji and its skin tone
ACCENT = "e\u0301"  # e + combining acute


def _legacy(text: str, limit: int | None) -> list[str]:
    """The splitter before clusters (code points), to check plain texts split as before."""
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
            cut += 1
        parts.append(rest[:cut])
        rest = rest[cut:]
    if rest:
        parts.append(rest)
    return parts


def _cut_inside_a_cluster(text: str, parts: list[str]) -> bool:
    bounds, at = {0}, 0
    for cluster in regex.findall(r"\X", text, flags=regex.DOTALL):
        at += len(cluster)
        bounds.add(at)
    at = 0
    for part in parts[:-1]:
        at += len(part)
        if at not in bounds:
            return True
    return False


@pytest.mark.parametrize(
    ("text", "limit"),
    [
        (FLAG * 9, 3),
        (FAMILY * 4, 7),
        (("ok " + FAMILY + " ") * 6, 9),
        (WAVE * 7 + " bye", 5),
        (ACCENT * 20, 5),
        ("caf" + ACCENT + " " + "na\u0308ive " * 8, 7),
        ("한국어" * 9, 4),  # precomposed Hangul syllables
        ("\u1100\u1161\u11a8" * 6, 4),  # conjoining jamo: one syllable of 3 code points
    ],
)
def test_a_cluster_is_never_split_across_parts(text: str, limit: int) -> None:
    parts = split_text(text, limit)
    assert "".join(parts) == text
    assert not _cut_inside_a_cluster(text, parts), parts
    assert all(0 < len(p) <= limit for p in parts), parts


@pytest.mark.parametrize(
    ("text", "limit"),
    [
        ("a" * 10 + " " * 20 + "b" * 5, 10),
        ("word " * 3 + "\n" * 30 + "end", 8),
        ("x" * 12 + " \u200b " * 12 + "y", 6),  # zero-width spaces are blank too
        ("tail" + " " * 25, 10),
    ],
)
def test_no_part_is_empty_or_only_whitespace(text: str, limit: int) -> None:
    parts = split_text(text, limit)
    assert all(p.strip(" \n\u200b") for p in parts), parts
    assert all(len(p) <= limit for p in parts)
    # nothing but the blank runs is lost
    assert "".join(p for p in parts).replace(" ", "").replace("\n", "").replace(
        "\u200b", ""
    ) == text.replace(" ", "").replace("\n", "").replace("\u200b", "")


def test_a_text_of_only_whitespace_goes_as_one_part_within_the_limit() -> None:
    assert split_text(" " * 30, 10) == [" " * 10]
    assert split_text("   ", 10) == ["   "]  # short: untouched, as before


def test_a_cluster_longer_than_the_limit_is_cut_by_code_points() -> None:
    text = "a" + "\u0301" * 12  # one cluster of 13 code points
    parts = split_text(text, 5)
    assert "".join(parts) == text
    assert [len(p) for p in parts] == [5, 5, 3]


@pytest.mark.parametrize(
    ("text", "limit"),
    [("😀" * 9, 4), (FAMILY * 3, 8), (FAMILY * 3, 9), ("ab😀cd😀" * 5, 5), (WAVE * 4, 4)],
)
def test_utf16_limits_count_utf16_units(text: str, limit: int) -> None:
    parts = split_text(text, limit, "utf-16")
    assert "".join(parts) == text
    assert not _cut_inside_a_cluster(text, parts), parts
    assert all(text_length(p, "utf-16") <= limit for p in parts), parts
    assert text_length("😀", "utf-16") == 2 and text_length("😀") == 1


def test_plain_texts_split_exactly_as_before() -> None:
    rng = random.Random(20261205)
    words = ["a", "to", "the", "durable", "journal", "x" * 17, "replay", "ok."]
    checked = 0
    for _ in range(400):
        pieces = []
        for _ in range(rng.randint(1, 80)):
            pieces.append(rng.choice(words))
            pieces.append(rng.choice([" ", " ", " ", "\n", ", ", "  "]))
        text = "".join(pieces).strip()
        limit = rng.randint(4, 60)
        before = _legacy(text, limit)
        if any(not p.strip() for p in before):
            continue  # the defect: a blank part, now dropped
        assert split_text(text, limit) == before, (text, limit)
        checked += 1
    assert checked > 300


def test_the_same_text_gives_the_same_parts_forever() -> None:
    """Pinned parts: a change of the rules (or of the Unicode data of ``regex``) that moves
    a cut shows here, not in a replay whose part keys no longer line up."""
    text = f"Bonjour {FLAG}! Voici la famille {FAMILY} et un caf{ACCENT}.\nSalut {WAVE} " * 2
    once = [
        f"Bonjour {FLAG}! Voici ",
        f"la famille {FAMILY} et ",
        f"un caf{ACCENT}.\nSalut {WAVE} ",
    ]
    assert split_text(text, 20) == once * 2
    assert split_text(text, 20) == split_text(text, 20)


async def test_a_long_send_reaches_the_channel_in_whole_clusters_and_no_blank_part() -> None:
    app = await make_app(MockProvider(text_limit=6))
    text = FLAG * 4 + " " * 14 + FAMILY + ACCENT * 3
    await app.runtime.send("c", text, idempotency_key="k")
    sent = texts(app.provider)
    assert all(t and t.strip() for t in sent), sent
    assert "".join(t or "" for t in sent).replace(" ", "") == FLAG * 4 + FAMILY + ACCENT * 3
    assert not _cut_inside_a_cluster("".join(t or "" for t in sent), [t or "" for t in sent])
    assert all(len(t or "") <= 6 for t in sent)
    await app.stop()


class Utf16Provider(MockProvider):
    """A channel whose ``text_limit`` counts UTF-16 code units (as Telegram's does)."""

    text_limit_unit = "utf-16"


async def test_a_channel_counting_utf16_units_gets_parts_within_its_limit() -> None:
    app = await make_app(Utf16Provider(text_limit=4))
    await app.runtime.send("c", "😀" * 5 + "ab", idempotency_key="k")
    sent = [t or "" for t in texts(app.provider)]
    assert sent == ["😀😀", "😀😀", "😀ab"]
    assert all(text_length(t, "utf-16") <= 4 for t in sent)
    await app.stop()
