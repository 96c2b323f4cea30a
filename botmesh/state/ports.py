"""The ports that adapters implement: ``Provider`` (a channel) lives here; ``DurableKv`` (a
journal backend) lives in ``botmesh.state.kv``.

A channel adapter must have ``name``, ``text_limit`` and ``send``. It may add capabilities,
each a small protocol the core looks for with ``isinstance``:

- ``KeyedSends``: ``send_keyed(message, key)`` gets the send's idempotency key, so the
  channel itself can deduplicate a resend (Discord's ``nonce``, an email's ``Message-ID``).
  The core calls it instead of ``send`` when it is there.
- ``AmbiguityResolver``: ``resolve_ambiguous(message, key, since)`` asks the channel
  whether a send whose outcome was lost in a crash went out, instead of guessing by the
  ``outbox.on_ambiguous`` policy.
- ``MediaRefs``: ``serialize_media_ref`` / ``rehydrate_media_ref``, the durable reference
  the inbox journals in place of an inbound's media, and its validation when read back.
- ``MediaDownloads``: ``download_media(media)``, the bytes of an inbound's media
  (``botmesh.load_media_of``).
- ``SessionHooks``: ``open_session()`` / ``close_session()``, called when this replica
  gains or loses the provider session (``provider_session="leader"``).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

from botmesh.state.counters import Timings
from botmesh.state.messages import Media, Outbound, SendResult

__all__ = [
    "AmbiguityResolver",
    "Deletes",
    "Edits",
    "KeyedSends",
    "MediaDownloads",
    "MediaRefs",
    "Provider",
    "SessionHooks",
    "Typing",
    "call_send",
    "posts_statuses",
    "timed_send",
]


@runtime_checkable
class Provider(Protocol):
    """A channel adapter. ``send`` raises a ``SendError`` subclass on failure; its
    ``retryable`` field decides between a retry and the dead-letter queue."""

    name: str
    #: Longest text one message may carry on this channel; ``None`` means no limit.
    text_limit: int | None

    async def send(self, message: Outbound) -> SendResult: ...


@runtime_checkable
class KeyedSends(Protocol):
    """A channel that can deduplicate a send by a key of ours."""

    async def send_keyed(self, message: Outbound, key: str) -> SendResult:
        """As ``send``; ``key`` is the send's idempotency key (per part: ``<key>#<n>``),
        stable across every attempt of this send. Never put it where a user reads it."""
        ...


@runtime_checkable
class AmbiguityResolver(Protocol):
    """A channel that can tell whether a send went out."""

    async def resolve_ambiguous(
        self, message: Outbound, key: str, since: float
    ) -> SendResult | None:
        """Whether the send ``key`` (first attempted at ``since``, epoch seconds) reached
        the channel: its ``SendResult`` when it did (found, or made once by the channel's
        own deduplication), ``None`` when it certainly did not. Raise (any exception) when
        the channel cannot tell; the ``outbox.on_ambiguous`` policy then applies."""
        ...


@runtime_checkable
class Edits(Protocol):
    """A channel whose API can change the text of a message it accepted."""

    async def edit(self, message: Outbound, message_id: str) -> SendResult:
        """Make the message ``message_id`` of ``message.chat_id`` read ``message.text``
        (``message.options``: the channel's options, as on a send). Returns the message's
        id (the same one on every channel so far). Raises a ``SendError`` subclass as
        ``send`` does (a message too old to edit, or gone: a final one)."""
        ...


@runtime_checkable
class Deletes(Protocol):
    """A channel whose API can delete a message it accepted (for the user too)."""

    async def delete(self, chat_id: str, message_id: str) -> None:
        """Delete the message ``message_id`` of ``chat_id``. Raises a ``SendError`` subclass
        as ``send`` does; a message already gone is not an error."""
        ...


@runtime_checkable
class Typing(Protocol):
    """A channel that can show the user that the bot is typing."""

    async def typing(self, chat_id: str) -> None:
        """Show a typing indicator in ``chat_id`` (the channel clears it by itself after a
        few seconds, or when the next message arrives). Never journaled."""
        ...


@runtime_checkable
class MediaRefs(Protocol):
    """A channel whose inbound media can be journaled as a durable reference."""

    def serialize_media_ref(self, media: Media) -> dict[str, Any] | None:
        """``{"v": n, "data": ...}`` (JSON, no credentials, never inline bytes), or ``None``
        when this media cannot be journaled durably (view-once, inline-only)."""
        ...

    def rehydrate_media_ref(self, stored: Mapping[str, Any], media: Media) -> Media:
        """The media rebuilt from ``stored`` (``media`` is the journaled record's media,
        for its ``mime`` and ``name``). Validates ``stored`` and raises a ``ProviderError``
        when it is invalid, from an unknown version, or tampered with. Offline: never
        needs the transport."""
        ...


@runtime_checkable
class MediaDownloads(Protocol):
    """A channel that can fetch an inbound's media bytes."""

    async def download_media(self, media: Media) -> bytes:
        """The bytes of ``media``. Checks the URL it fetches (scheme, allowed hosts, no
        private address unless configured); raises a ``ProviderError`` on failure."""
        ...


@runtime_checkable
class SessionHooks(Protocol):
    """A channel with one live session at a time (``provider_session="leader"``)."""

    async def open_session(self) -> None:
        """This replica became the leader: open the transport's session (log in, connect)."""
        ...

    async def close_session(self) -> None:
        """This replica lost the lead or stops: close the session, so another can open it."""
        ...


def posts_statuses(provider: object) -> bool:
    """Whether ``provider``'s channel posts status webhooks about the messages it accepted
    (its ``delivery_statuses`` attribute; absent: it does not). Only such a channel's sends
    are named under their message ids when recorded sent (``botmesh.state.statuses``): the
    name costs a journal record a send."""
    return bool(getattr(provider, "delivery_statuses", False))


async def call_send(provider: Provider, message: Outbound, key: str) -> SendResult:
    """Send through ``provider``, with ``key`` when it takes one (``KeyedSends``: looked up
    as an attribute, as ``isinstance`` on the protocol would, at a tenth of its cost)."""
    send_keyed = getattr(provider, "send_keyed", None)
    if send_keyed is not None:
        result: SendResult = await send_keyed(message, key)
        return result
    return await provider.send(message)


async def timed_send(
    provider: Provider, message: Outbound, key: str, timings: Timings | None
) -> SendResult:
    """``call_send``, timed by ``timings`` when given (its latency by channel and result,
    and the calls in flight)."""
    if timings is None:
        return await call_send(provider, message, key)
    timings.calling(1)
    started = time.perf_counter()
    result = "error"
    try:
        sent = await call_send(provider, message, key)
        result = "ok"
        return sent
    finally:
        timings.calling(-1)
        timings.provider_call(provider.name, result, time.perf_counter() - started)
