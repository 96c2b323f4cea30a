"""``ChannelProvider``: what every real channel adapter shares: the HTTP client
(``providers.http``), the media-reference rules of its channel (``providers.media_refs``)
and media downloads through the URL check.

An adapter subclasses it, sets ``name``, ``text_limit`` and ``media_channel`` (the key of
its rules in ``providers.media_refs``; usually its ``name``), and implements ``send``
(and ``send_keyed`` / ``resolve_ambiguous`` / ``media_url`` where the channel allows).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from providers.http import HttpChannel
from providers.media_refs import MediaRefRules, media_rules
from state.errors import ProviderError
from state.messages import Media, Outbound, SendResult

__all__ = ["ChannelProvider"]


class ChannelProvider(HttpChannel):
    """A channel adapter on HTTP. ``media_ref_hosts`` replaces the channel's list of hosts
    whose media URLs are journaled and accepted back (the reference's ``mediaRefHosts``);
    it also rules downloads when given. ``media_view_once`` journals view-once media too
    (the reference's ``durableMedia: { viewOnce: true }``; Baileys)."""

    #: The key of this channel's rules in ``providers.media_refs``.
    media_channel: str = ""

    def __init__(
        self,
        *,
        timeout: float = 15.0,
        secrets: Iterable[str] = (),
        media_ref_hosts: Iterable[str] | None = None,
        allow_private_media: bool = False,
        media_max_bytes: int | None = None,
        media_view_once: bool = False,
    ) -> None:
        self.media_ref_hosts = None if media_ref_hosts is None else tuple(media_ref_hosts)
        self.media_view_once = media_view_once
        kwargs: dict[str, Any] = {}
        if media_max_bytes is not None:
            kwargs["media_max_bytes"] = media_max_bytes
        super().__init__(
            timeout=timeout,
            secrets=secrets,
            media_hosts=self.media_ref_hosts,
            allow_private_media=allow_private_media,
            **kwargs,
        )

    async def send(self, message: Outbound) -> SendResult:  # pragma: no cover - abstract
        raise NotImplementedError

    # -- media references (state.ports.MediaRefs) ------------------------------------------

    def _rules(self) -> MediaRefRules:
        return media_rules(
            self.media_channel or self.name,
            hosts=self.media_ref_hosts,
            view_once=self.media_view_once,
            allow_private=self.allow_private_media,
        )

    @staticmethod
    def media_env(env: Mapping[str, str], prefix: str) -> dict[str, Any]:
        """The media settings of a channel's environment, as constructor keywords:
        ``<PREFIX>_MEDIA_REF_HOSTS`` (comma-separated; replaces the channel's media hosts)
        and ``<PREFIX>_ALLOW_PRIVATE_MEDIA=1`` (local fakes and tests only)."""
        out: dict[str, Any] = {}
        hosts = env.get(f"{prefix}_MEDIA_REF_HOSTS", "").strip()
        if hosts:
            out["media_ref_hosts"] = tuple(h.strip() for h in hosts.split(",") if h.strip())
        if env.get(f"{prefix}_ALLOW_PRIVATE_MEDIA", "").strip() not in ("", "0"):
            out["allow_private_media"] = True
        return out

    def serialize_media_ref(self, media: Media) -> dict[str, Any] | None:
        return self._rules().serialize(media)

    def rehydrate_media_ref(self, stored: Mapping[str, Any], media: Media) -> Media:
        return self._rules().rehydrate(stored, media)

    # -- media downloads (state.ports.MediaDownloads) --------------------------------------

    async def media_url(self, media: Media) -> tuple[str, dict[str, str]]:
        """The URL to download ``media`` from and the headers (credentials) it needs. The
        default: the media's own URL, no headers. Channels whose media is an id (Telegram,
        WhatsApp) look the URL up here."""
        if media.url is None:
            raise ProviderError(f"{self.name}: this media has no URL to download")
        return media.url, {}

    async def download_media(self, media: Media) -> bytes:
        if media.data is not None:
            return media.data
        url, headers = await self.media_url(media)
        return await self.fetch_media(url, headers=headers)
