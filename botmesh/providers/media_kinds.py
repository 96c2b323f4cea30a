"""What kind of message a channel sends a media as (an image, a video, a document…), one
rule for every channel: the kind the bot asked for in the send's options, else the one
its MIME type says.

``kind_of_type(mime, name, other=…, sticker=…)``: ``image/webp`` is a sticker where the
channel has one (WhatsApp and its partners take stickers as WebP, and no WebP image);
``image/*``, ``video/*`` and ``audio/*`` are images, videos and audio; anything else is
the channel's ``other`` kind (a document, a file). A media without a MIME type is taken
for the type its file name, else its URL's path, says (``a.jpg`` is an image).

``chosen_kind(channel, media, options, option=…, kinds=…, other=…, sticker=…)`` adds the
bot's choice: ``options[option]`` when given, which must be one of the channel's
``kinds`` (``UnsupportedContentError`` names them otherwise)."""

from __future__ import annotations

import mimetypes
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit

from botmesh.state.errors import UnsupportedContentError
from botmesh.state.messages import Media

__all__ = ["chosen_kind", "kind_of_type"]

#: The kinds a MIME type's first half names as they are.
_AS_THEY_ARE = ("image", "video", "audio")


def kind_of_type(
    mime: str | None, name: str | None = None, *, other: str, sticker: str | None = None
) -> str:
    """The kind a channel sends a media of type ``mime`` as (without one: the type the file
    name or URL ``name`` says); see the module docstring."""
    if not mime and name:
        path = urlsplit(name).path if "://" in name else name
        mime = mimetypes.guess_type(path)[0]
    m = (mime or "").split(";", 1)[0].strip().lower()
    if m == "image/webp" and sticker is not None:
        return sticker
    major = m.split("/", 1)[0]
    return major if major in _AS_THEY_ARE and "/" in m else other


def chosen_kind(
    channel: str,
    media: Media,
    options: Mapping[str, Any],
    *,
    option: str,
    kinds: Sequence[str],
    other: str,
    sticker: str | None = None,
) -> str:
    """``options[option]`` when the bot gave it (one of ``kinds``), else the kind of
    ``media``'s type (``kind_of_type``)."""
    wanted = options.get(option)
    if wanted is not None:
        if wanted not in kinds:
            raise UnsupportedContentError(
                f"{channel}: {option} {wanted!r} is not one of {', '.join(kinds)}"
            )
        return str(wanted)
    return kind_of_type(media.mime, media.name or media.url, other=other, sticker=sticker)
