"""``load_media_of(ctx)``: the bytes of an inbound's media, live or replayed."""

from __future__ import annotations

import logging

from botmesh._bot.parts import Received
from botmesh.state.errors import MediaUnavailableError, ProviderError
from botmesh.state.ports import MediaDownloads

__all__ = ["load_media_of"]

log = logging.getLogger("botmesh")


async def load_media_of(ctx: Received, *, throw_on_error: bool = False) -> bytes | None:
    """Download the media of ``ctx``'s message through the bot's provider.

    ``None`` when the message has no media, and, unless ``throw_on_error``, when the
    download fails. With ``throw_on_error``: ``MediaUnavailableError`` when a replayed
    message's media could not be rebuilt from the journal (``reason``: ``not-durable``,
    ``provider-mismatch``, ``rehydrate-failed``) or its rebuilt reference no longer
    downloads (an expired hosted URL: ``rehydrate-failed``); the provider's own error for a
    live message's failed download.
    """
    media = ctx.message.media
    if media is None:
        return None
    provider = ctx.provider
    try:
        if media.unavailable is not None:
            raise MediaUnavailableError(
                media.unavailable,
                f"the media of inbound {ctx.message.id!r} cannot be downloaded after a replay "
                f"({media.unavailable}); ask the user to send it again",
            )
        if isinstance(provider, MediaDownloads):
            return await provider.download_media(media)
        if media.data is not None:
            return media.data
        raise ProviderError(
            f"provider {provider.name!r} cannot download media (it has no download_media)"
        )
    except MediaUnavailableError as exc:
        log.info("media of inbound %s unavailable: %s", ctx.message.id, exc.reason)
        if throw_on_error:
            raise
        return None
    except Exception as exc:
        log.warning(
            "media of inbound %s: download failed: %s: %s",
            ctx.message.id,
            type(exc).__name__,
            exc,
        )
        if not throw_on_error:
            return None
        if media.ref is not None:  # rebuilt from the journal: the stored reference is stale
            raise MediaUnavailableError(
                "rehydrate-failed",
                f"the media of replayed inbound {ctx.message.id!r} no longer downloads: {exc}",
            ) from exc
        raise
