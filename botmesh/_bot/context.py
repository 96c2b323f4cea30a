"""``Context``: what a handler gets, the inbound and the ways to answer it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Unpack

from botmesh._bot.media import load_media_of
from botmesh._bot.parts import Host, Turn
from botmesh._bot.sends import SendOptions, outbound, timing_of
from botmesh.state.keys import check_explicit, derived_key
from botmesh.state.messages import Inbound, Receipt
from botmesh.state.ports import Provider

if TYPE_CHECKING:
    from botmesh._bot.flow import Flow

__all__ = ["Context"]


class Context:
    """What a handler gets: the inbound, and ways to answer it.

    Sends made here are keyed ``<inbound id>:<n>`` (the n-th send of this message) unless
    you pass ``idempotency_key``; so a replay of the message is answered from the outbox.
    """

    __slots__ = ("_host", "_turn", "message")

    def __init__(self, host: Host, turn: Turn) -> None:
        self._host = host
        self._turn = turn
        self.message: Inbound = turn.message

    @property
    def chat_id(self) -> str:
        return self.message.chat_id

    @property
    def text(self) -> str | None:
        return self.message.text

    @property
    def inbound_id(self) -> str:
        return self.message.id

    @property
    def provider(self) -> Provider:
        """The channel this bot runs on."""
        return self._host.provider

    async def load_media(self, *, throw_on_error: bool = False) -> bytes | None:
        """This message's media bytes: ``botmesh.load_media_of(ctx, ...)``."""
        return await load_media_of(self, throw_on_error=throw_on_error)

    async def reply(self, text: str | None = None, **opts: Unpack[SendOptions]) -> Receipt:
        """Send to this message's chat; returns the receipt of the (first part of the) send."""
        return await self.send(self.chat_id, text, **opts)

    async def send(
        self, chat_id: str, text: str | None = None, **opts: Unpack[SendOptions]
    ) -> Receipt:
        """Send to any chat, now (retried inline up to ``outbox.inline_max``)."""
        return await self._submit(chat_id, text, opts, inline=True)

    async def enqueue(
        self, chat_id: str, text: str | None = None, **opts: Unpack[SendOptions]
    ) -> str:
        """Journal a send for the background sweeper and return its key at once; with
        ``at=``/``delay=`` it goes out at that time, not before (``bot.cancel(key)`` stops
        it until then)."""
        return (await self._submit(chat_id, text, opts, inline=False)).key

    async def edit(
        self,
        key: str,
        text: str,
        *,
        options: Mapping[str, Any] | None = None,
        idempotency_key: str | None = None,
    ) -> Receipt:
        """Change the text of the send ``key`` (a send of this bot, sent already) to
        ``text``, through the channel's message id its journal recorded. Journaled under a
        key of its own (the next of this message's sends, unless ``idempotency_key``), so a
        replay of this handler edits once. A send split in parts is edited part by part.
        ``RecordStateError`` for a key never sent or still in flight;
        ``UnsupportedContentError`` on a channel that cannot edit."""
        own, derived = self._key(idempotency_key)
        return await self._host.change(
            key,
            "edit",
            own,
            text=text,
            options=options,
            derived=derived,
            inbound_id=self.inbound_id,
        )

    async def delete(self, key: str, *, idempotency_key: str | None = None) -> Receipt:
        """Delete the send ``key`` (each of its parts) for the chat, once, as ``edit``
        does; ``UnsupportedContentError`` on a channel that cannot delete."""
        own, derived = self._key(idempotency_key)
        return await self._host.change(
            key, "delete", own, derived=derived, inbound_id=self.inbound_id
        )

    async def typing(self) -> bool:
        """Show the channel's typing indicator in this chat (never journaled: it is gone
        in seconds). ``False`` when the channel has none, or refused it."""
        return await self._host.typing(self.chat_id)

    async def start_flow(
        self, flow: Flow[Any] | str, *, args: Mapping[str, Any] | None = None
    ) -> None:
        """Start ``flow`` (the object ``@bot.flow`` returned, or its name) in this chat,
        with ``args`` (JSON) as ``conv.args``. Its first question goes out now, keyed from
        this message (after this handler's earlier sends); the chat's next messages go to
        it. A flow already active in the chat is replaced (it ends ``cancelled``)."""
        await self._host.flows().start(self._turn, flow, args or {})

    def _key(self, idempotency_key: str | None) -> tuple[str, bool]:
        self._turn.sends += 1
        if idempotency_key is not None:
            return check_explicit(idempotency_key), False
        return derived_key(self.message.id, self._turn.sends), True

    async def _submit(
        self, chat_id: str, text: str | None, opts: SendOptions, *, inline: bool
    ) -> Receipt:
        key, derived = self._key(opts.get("idempotency_key"))
        message = outbound(chat_id, text, opts)
        return await self._host.submit(
            message,
            key,
            derived,
            self.message.id,
            inline=inline,
            fallback=opts.get("fallback"),
            timing=timing_of(opts),
        )
