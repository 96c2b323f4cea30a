"""Media on replay: what the inbox journals in place of an inbound's media, and the media a
replayed inbound gets back.

The journal never keeps media bytes a channel can give again. With ``inbox.media_refs`` (the
default) and a provider that has ``serialize_media_ref`` (``botmesh.state.ports.MediaRefs``), the
inbox journals ``Media(provider, mime, name, ref={"v", "data"})``: the channel's durable
reference, no credentials, no inline bytes. When the provider cannot make one (view-once
media, a host off the channel's list), the journal says ``unavailable="not-durable"``. A
provider without the two methods (``mock``, ``console``, a module of yours) has its media
journaled as it is, as before this feature.

A replay (after a crash, a background retry, an operator's ``replay_inbound``) rebuilds the
media with the provider's ``rehydrate_media_ref`` before the handlers run. When it cannot,
the media carries ``unavailable`` with the reason (``provider-mismatch``: another channel
wrote the record; ``rehydrate-failed``: the stored reference is invalid, from an unknown
version or tampered with) and the handler still runs; only ``load_media_of`` fails.
"""

from __future__ import annotations

import logging

import msgspec

from botmesh.state.errors import MediaUnavailableReason
from botmesh.state.messages import Inbound, Media
from botmesh.state.ports import MediaRefs, Provider

__all__ = ["journaled", "rehydrated"]

log = logging.getLogger("botmesh.inbox")


def journaled(message: Inbound, provider: Provider, *, media_refs: bool) -> Inbound:
    """``message`` as the inbox journals it (its media a durable reference)."""
    media = message.media
    if media is None or not media_refs or not isinstance(provider, MediaRefs):
        return message
    channel = media.provider or provider.name
    keep = Media(mime=media.mime, name=media.name, provider=channel)
    if media.ref is not None or media.unavailable is not None:  # journaled before: as it is
        return message
    if channel != provider.name:
        stored = None
        why = f"it came from {channel!r}, not from this bot's provider {provider.name!r}"
    else:
        try:
            stored = provider.serialize_media_ref(media)
            why = "the provider does not keep this media (view-once, a host off its list)"
        except Exception as exc:
            stored = None
            why = f"{provider.name}.serialize_media_ref failed: {type(exc).__name__}: {exc}"
    if stored is None:
        log.info("inbound %s: media journaled as not durable: %s", message.id, why)
        return msgspec.structs.replace(
            message, media=msgspec.structs.replace(keep, unavailable="not-durable")
        )
    return msgspec.structs.replace(message, media=msgspec.structs.replace(keep, ref=stored))


def rehydrated(message: Inbound, provider: Provider) -> Inbound:
    """A journaled ``message`` with its media rebuilt by ``provider`` (or marked
    ``unavailable`` with the reason)."""
    media = message.media
    if media is None or media.ref is None or media.unavailable is not None:
        return message
    reason: MediaUnavailableReason | None = None
    if media.provider is not None and media.provider != provider.name:
        reason = "provider-mismatch"
        log.warning(
            "inbound %s: media journaled by %r cannot be rebuilt by %r",
            message.id,
            media.provider,
            provider.name,
        )
    elif not isinstance(provider, MediaRefs):
        reason = "provider-mismatch"
    else:
        try:
            rebuilt = provider.rehydrate_media_ref(media.ref, media)
        except Exception as exc:
            log.warning(
                "inbound %s: stored media reference refused: %s: %s",
                message.id,
                type(exc).__name__,
                exc,
            )
            reason = "rehydrate-failed"
        else:  # ``ref`` stays: the media was rebuilt from the journal (load_media_of reads it)
            return msgspec.structs.replace(
                message, media=msgspec.structs.replace(rebuilt, ref=media.ref)
            )
    unavailable = msgspec.structs.replace(media, ref=None, unavailable=reason)
    return msgspec.structs.replace(message, media=unavailable)
