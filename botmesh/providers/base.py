"""``ChannelProvider``: what every real channel adapter shares: the HTTP client
(``botmesh.providers.http``), the media-reference rules of its channel
(``botmesh.providers.media_refs``)
and media downloads through the URL check.

An adapter subclasses it, sets ``name``, ``text_limit`` and ``media_channel`` (the key of
its rules in ``botmesh.providers.media_refs``; usually its ``name``), and implements ``send``
(and ``send_keyed`` / ``resolve_ambiguous`` / ``media_url`` where the channel allows).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import urlsplit

from botmesh.providers.http import HttpChannel
from botmesh.providers.media_refs import MediaRefRules, media_rules
from botmesh.state.errors import ConfigError, ProviderError
from botmesh.state.messages import Media, Outbound, SendResult

__all__ = ["LOOPBACK", "ChannelProvider", "check_api_url"]

#: The hosts of a local API (a fake, in tests).
LOOPBACK = ("127.0.0.1", "localhost", "::1")


def check_api_url(url: str, field: str, default: str, *, plain_http: bool = False) -> str:
    """``url`` without its trailing ``/`` when it may carry a credential: https, or http on
    the loopback (a local fake), or http anywhere when the operator said so (``plain_http``:
    a self-hosted API on a private network); else a ``ConfigError`` on ``field``."""
    parts = urlsplit(url)
    if parts.scheme not in ("https", "http") or not parts.hostname:
        raise ConfigError(field, f"{url!r} is not an http(s) URL; unset it to use {default}")
    if parts.scheme == "http" and parts.hostname not in LOOPBACK and not plain_http:
        raise ConfigError(
            field,
            f"{url!r} is plain http to a remote host: the credentials would travel in clear; "
            "use https (http is only accepted on 127.0.0.1)",
        )
    return url.rstrip("/")


class ChannelProvider(HttpChannel):
    """A channel adapter on HTTP. ``media_ref_hosts`` replaces the channel's list of hosts
    whose media URLs are journaled and accepted back (the reference's ``mediaRefHosts``);
    it also rules downloads when given. ``media_view_once`` journals view-once media too
    (the reference's ``durableMedia: { viewOnce: true }``; Baileys)."""

    #: The key of this channel's rules in ``botmesh.providers.media_refs``.
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

    # -- media references (botmesh.state.ports.MediaRefs) ------------------------------------------

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
        and ``<PREFIX>_ALLOW_PRIVATE_MEDIA`` (``1`` or ``0``; local fakes and tests only:
        ``api_env`` honours it only with a local API URL)."""
        out: dict[str, Any] = {}
        hosts = env.get(f"{prefix}_MEDIA_REF_HOSTS", "").strip()
        if hosts:
            out["media_ref_hosts"] = tuple(h.strip() for h in hosts.split(",") if h.strip())
        flag = env.get(f"{prefix}_ALLOW_PRIVATE_MEDIA", "").strip()
        if flag not in ("", "0", "1"):
            raise ConfigError(f"{prefix}_ALLOW_PRIVATE_MEDIA", f"{flag!r} is not 1 or 0")
        if flag == "1":
            out["allow_private_media"] = True
        return out

    @classmethod
    def api_env(
        cls, env: Mapping[str, str], prefix: str, default: str
    ) -> tuple[str, dict[str, Any]]:
        """A channel's API URL (``<PREFIX>_API_URL``, else ``default``) and its media
        settings (``media_env``). The URL must be https, or http on the loopback (a local
        fake: a credential never travels in clear); ``<PREFIX>_ALLOW_PRIVATE_MEDIA=1`` is
        honoured only with such a local URL."""
        field = f"{prefix}_API_URL"
        url = check_api_url(env.get(field, "").strip() or default, field, default)
        media = cls.media_env(env, prefix)
        if media.get("allow_private_media") and urlsplit(url).hostname not in LOOPBACK:
            raise ConfigError(
                f"{prefix}_ALLOW_PRIVATE_MEDIA",
                f"is only honoured with a local {field} (http://127.0.0.1…), for tests; unset it",
            )
        return url, media

    def serialize_media_ref(self, media: Media) -> dict[str, Any] | None:
        return self._rules().serialize(media)

    def rehydrate_media_ref(self, stored: Mapping[str, Any], media: Media) -> Media:
        return self._rules().rehydrate(stored, media)

    # -- media downloads (botmesh.state.ports.MediaDownloads) --------------------------------------

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
