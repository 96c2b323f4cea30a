"""``botmesh.providers.media_kinds``: one rule for the kind a channel sends a media as,
where four copies had drifted apart (only Messenger guessed from the file name, only
Gupshup sent a WebP as a sticker, WhatsApp sent a WebP as an image, which its API refuses).
Each channel's own test sends through it (``test_whatsapp``, ``test_gupshup``,
``test_messenger``, ``test_wa_bridges``)."""

from __future__ import annotations

import pytest

from botmesh.providers.media_kinds import chosen_kind, kind_of_type
from botmesh.state.errors import UnsupportedContentError
from botmesh.state.messages import Media


@pytest.mark.parametrize(
    ("mime", "name", "sticker", "kind"),
    [
        ("image/jpeg", None, None, "image"),
        ("IMAGE/PNG", None, None, "image"),
        ("video/mp4", "a.pdf", None, "video"),  # the type said wins over the name
        ("audio/ogg; codecs=opus", None, None, "audio"),
        ("application/pdf", None, None, "other"),
        ("image", None, None, "other"),  # not a MIME type
        (None, "photo.jpg", None, "image"),
        (None, "https://cdn.example/v/clip.mp4?sig=a%2Fb&exp=1", None, "video"),
        (None, "https://cdn.example/report", None, "other"),
        (None, None, None, "other"),
        ("image/webp", None, "sticker", "sticker"),
        ("image/webp", None, None, "image"),  # a channel without stickers
        (None, "smile.webp", "sticker", "sticker"),
    ],
)
def test_the_kind_follows_the_type_else_the_name(
    mime: str | None, name: str | None, sticker: str | None, kind: str
) -> None:
    assert kind_of_type(mime, name, other="other", sticker=sticker) == kind


def test_the_bots_choice_wins_and_must_be_one_of_the_channels() -> None:
    pdf = Media(url="https://cdn.example/a.pdf")
    kinds = ("image", "document")
    chosen = chosen_kind("x", pdf, {"as": "image"}, option="as", kinds=kinds, other="document")
    assert chosen == "image"
    found = chosen_kind("x", pdf, {}, option="as", kinds=kinds, other="document")
    assert found == "document"
    with pytest.raises(UnsupportedContentError, match=r"x: as 'gif' is not one of image, doc"):
        chosen_kind("x", pdf, {"as": "gif"}, option="as", kinds=kinds, other="document")
