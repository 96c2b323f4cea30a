"""``Bot`` and ``Context``: handler registration, ``ctx.reply`` and ``bot.send``.

This is the plain, in-memory path (no durability): it runs exactly this code when no
``durability`` is configured. The durable path wraps the same calls in the inbox and the
outbox of ``state``.
"""

from __future__ import annotations

import inspect
import logging
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from state.messages import Inbound, Outbound, Receipt
from state.ports import Provider

__all__ = ["Bot", "Context", "Handler"]

log = logging.getLogger("botmesh")

Handler = Callable[["Context"], Awaitable[None]]
Listener = Callable[[Any], Any]


@dataclass
class Context:
    """What a handler gets: the message, and ``reply`` to answer in its chat."""

    bot: Bot
    message: Inbound
    _sends: int = field(default=0, repr=False)

    @property
    def chat_id(self) -> str:
        return self.message.chat_id

    @property
    def text(self) -> str | None:
        return self.message.text

    async def reply(self, text: str, *, idempotency_key: str | None = None) -> Receipt:
        """Send ``text`` to this message's chat."""
        self._sends += 1
        return await self.bot._send(
            Outbound(self.chat_id, text),
            idempotency_key=idempotency_key,
            inbound=self.message,
            n=self._sends,
        )


class Bot:
    """A chat bot: register handlers, then feed it inbound messages with ``handle``."""

    def __init__(self, provider: Provider, *, bot_id: str = "bot") -> None:
        self.provider = provider
        self.bot_id = bot_id
        self._handlers: list[tuple[Callable[[Inbound], bool] | None, Handler]] = []
        self._listeners: dict[str, list[Listener]] = {}

    # -- registration -------------------------------------------------------------------

    def on_message(self, handler: Handler) -> Handler:
        """Register ``handler`` for every inbound message (decorator)."""
        self._handlers.append((None, handler))
        return handler

    def when(self, predicate: Callable[[Inbound], bool]) -> Callable[[Handler], Handler]:
        """Register a handler for the messages ``predicate`` accepts (decorator)."""

        def register(handler: Handler) -> Handler:
            self._handlers.append((predicate, handler))
            return handler

        return register

    def on(self, event: str, listener: Listener) -> None:
        """Listen to an event: ``sent`` (a ``Receipt``), ``error``, ``durability:dead``,
        ``durability:ambiguous``."""
        self._listeners.setdefault(event, []).append(listener)

    async def emit(self, event: str, payload: Any) -> None:
        for listener in list(self._listeners.get(event, ())):
            try:
                result = listener(payload)
                if inspect.isawaitable(result):
                    await result
            except Exception:
                log.exception("listener for %r failed", event)

    # -- lifecycle ----------------------------------------------------------------------

    async def start(self) -> None:
        """Start the bot (the durable path opens its journal and starts the sweeper)."""

    async def stop(self) -> None:
        """Stop the bot."""

    # -- processing ---------------------------------------------------------------------

    async def handle(self, message: Inbound) -> None:
        """Run the handlers that match ``message``. A handler that raises is reported on
        ``error`` and the message counts as handled (its side effects already ran)."""
        ctx = Context(self, message)
        for predicate, handler in self._handlers:
            if predicate is not None and not predicate(message):
                continue
            try:
                await handler(ctx)
            except Exception as exc:
                log.warning("handler %s failed on %s: %s", handler.__name__, message.id, exc)
                await self.emit("error", exc)

    async def send(self, chat_id: str, text: str, *, idempotency_key: str | None = None) -> Receipt:
        """Send ``text`` to ``chat_id`` outside a handler."""
        return await self._send(Outbound(chat_id, text), idempotency_key=idempotency_key)

    async def _send(
        self,
        message: Outbound,
        *,
        idempotency_key: str | None = None,
        inbound: Inbound | None = None,
        n: int = 0,
    ) -> Receipt:
        if idempotency_key is not None:
            key = idempotency_key
        elif inbound is not None:
            key = f"{inbound.id}:{n}"
        else:
            key = uuid.uuid4().hex
        result = await self.provider.send(message)
        receipt = Receipt(
            key=key,
            chat_id=message.chat_id,
            message_id=result.message_id,
            state="sent",
            inbound_id=inbound.id if inbound is not None else None,
        )
        await self.emit("sent", receipt)
        return receipt
