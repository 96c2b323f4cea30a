"""Media references: what the inbox journals in place of an inbound's media, per channel,
and how it is validated and rebuilt when a replay reads it back (the reference's "Media on
replay").

``media_rules(channel, hosts=None)`` gives a channel's ``MediaRefRules``: ``serialize(media)``
returns ``{"v": n, "data": {...}}`` (JSON; never credentials, never inline bytes) or
``None`` (not durable); ``rehydrate(stored, media)`` validates ``stored`` and returns the
rebuilt ``Media``, or raises ``MediaRefInvalid`` (a ``ProviderError``). ``hosts`` replaces
the channel's allowed media hosts (``media_ref_hosts``) where it has a list.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Protocol

import msgspec

from state.errors import ProviderError
from state.messages import Media

__all__ = ["MediaRefInvalid", "MediaRefRules", "media_rules"]


class MediaRefInvalid(ProviderError):
    """A stored media reference is invalid, from an unknown version, or tampered with."""


class MediaRefRules(Protocol):
    channel: str

    def serialize(self, media: Media) -> dict[str, Any] | None: ...

    def rehydrate(self, stored: Mapping[str, Any], media: Media) -> Media: ...


class TokenAsIs:
    """A channel without rules of its own: the media's token as it is (url, path, id),
    never its inline bytes."""

    def __init__(self, channel: str) -> None:
        self.channel = channel

    def serialize(self, media: Media) -> dict[str, Any] | None:
        data = {k: v for k in ("url", "path", "id") if (v := getattr(media, k)) is not None}
        return {"v": 1, "data": data} if data else None

    def rehydrate(self, stored: Mapping[str, Any], media: Media) -> Media:
        data = stored.get("data") if stored.get("v") == 1 else None
        if not isinstance(data, dict) or not all(
            k in ("url", "path", "id") and isinstance(v, str) for k, v in data.items()
        ):
            raise MediaRefInvalid(f"{self.channel}: stored media reference is not valid")
        return msgspec.structs.replace(media, **data, ref=None)


def media_rules(channel: str, *, hosts: Iterable[str] | None = None) -> MediaRefRules:
    """The rules of ``channel``; a channel with none gets the token as it is."""
    del hosts
    return TokenAsIs(channel)
