"""``Bot`` and ``Context``: handler registration, ``ctx.reply``, ``bot.send``, ``bot.enqueue``.

Without ``durability`` the bot runs the plain, in-memory path: handlers run, sends go
straight to the provider. With ``durability`` (``{}`` for the in-memory journal, a mapping
of options, or a ``DurabilityConfig``) every inbound is journaled before its handlers run
and every send is journaled under an idempotency key before the provider is called; see
``state.durability``.
"""

from __future__ import annotations

import contextvars
import inspect
import logging
import random
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from state.clock import Clock
from state.config import DurabilityConfig
from state.durability import EngineHooks, ScopedDurability, resolve_backend
from state.errors import ConfigError
from state.keys import derived_key, fingerprint, random_key, scope_id
from state.messages import Inbound, Outbound, Receipt
from state.ports import Provider
from state.sweeper import Sweeper

__all__ = ["Bot", "Context", "Handler"]

log = logging.getLogger("botmesh")

Handler = Callable[["Context"], Awaitable[None]]
Listener = Callable[[Any], Any]
BeforeSend = Callable[[Outbound], "Outbound | Awaitable[Outbound | None] | None"]
AfterSend = Callable[[Receipt], Any]

_current: contextvars.ContextVar[Context | None] = contextvars.ContextVar(
    "botmesh_context", default=None
)


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

    def _next(self) -> int:
        self._sends += 1
        return self._sends

    async def reply(self, text: str, *, idempotency_key: str | None = None) -> Receipt:
        """Send ``text`` to this message's chat (key: explicit, else ``<inbound id>:<n>``)."""
        return await self.bot._send(
            Outbound(self.chat_id, text),
            idempotency_key=idempotency_key,
            inbound=self.message,
            n=self._next(),
        )


class Bot:
    """A chat bot: register handlers, then feed it inbound messages with ``handle``.

    ``durability=None`` (default): the plain in-memory path. ``durability={}``: journals in
    memory (``MemoryDurability``); a mapping or ``DurabilityConfig`` for other options
    (``{"backend": "file:///var/lib/bot/journal", "instance_id": "bot-1"}``). The ids
    ``tenant_id``, ``environment_id``, ``bot_id`` and ``connection_id`` give the bot's
    journal scope. ``clock`` (tests) replaces wall-clock time in the durable engine.
    """

    def __init__(
        self,
        provider: Provider,
        *,
        bot_id: str = "bot",
        durability: Mapping[str, Any] | DurabilityConfig | None = None,
        tenant_id: str = "default",
        environment_id: str = "default",
        connection_id: str = "default",
        clock: Clock | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.provider = provider
        self.bot_id = bot_id
        self.tenant_id = tenant_id
        self.environment_id = environment_id
        self.connection_id = connection_id
        self._handlers: list[tuple[Callable[[Inbound], bool] | None, Handler]] = []
        self._listeners: dict[str, list[Listener]] = {}
        self._before_send: list[BeforeSend] = []
        self._after_send: list[AfterSend] = []
        self.durability: ScopedDurability | None = None
        self._sweeper: Sweeper | None = None
        if durability is not None:
            if isinstance(durability, DurabilityConfig):
                config = durability
            elif isinstance(durability, Mapping):
                config = DurabilityConfig.from_mapping(durability)
            else:
                raise ConfigError(
                    "durability",
                    "expected None, a mapping or a DurabilityConfig, got "
                    f"{type(durability).__name__}",
                )
            self.durability = resolve_backend(config.backend).bind(
                scope=scope_id(tenant_id, environment_id, bot_id, connection_id),
                config=config,
                provider=provider,
                hooks=EngineHooks(self._dispatch, self._delivered, self.emit),
                bot_id=bot_id,
                connection_id=connection_id,
                clock=clock,
                rng=rng,
            )
            self._sweeper = Sweeper(self.durability)

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
        """Listen to an event: ``sent`` (a ``Receipt``), ``error``, ``durability:dead``
        (a ``DeadEvent``), ``durability:ambiguous`` (an ``AmbiguousEvent``)."""
        self._listeners.setdefault(event, []).append(listener)

    def before(self, event: str, hook: BeforeSend) -> None:
        """``before("send", hook)``: ``hook(outbound)`` may return a changed ``Outbound``.
        Runs once per send, before the journal (and before a text is split)."""
        if event != "send":
            raise ConfigError("before", f"unknown hook point {event!r}; use 'send'")
        self._before_send.append(hook)

    def after(self, event: str, hook: AfterSend) -> None:
        """``after("send", hook)``: ``hook(receipt)`` after each part went out (inline or
        delivered by the sweeper)."""
        if event != "send":
            raise ConfigError("after", f"unknown hook point {event!r}; use 'send'")
        self._after_send.append(hook)

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
        """Start the bot: the durable path opens its journal, recovers what an earlier run
        left unfinished, and starts the background sweeper."""
        if self.durability is not None:
            await self.durability.open()
            assert self._sweeper is not None
            self._sweeper.start()

    async def stop(self) -> None:
        """Stop the bot (the sweeper, then the journal)."""
        if self.durability is not None:
            assert self._sweeper is not None
            await self._sweeper.stop()
            await self.durability.close()

    # -- processing ---------------------------------------------------------------------

    async def handle(self, message: Inbound) -> None:
        """Process one inbound. A handler that raises is reported on ``error`` and the
        message counts as handled (its side effects already ran). With durability the
        message is journaled first (fail closed) and marked done after its handlers."""
        if self.durability is None:
            await self._dispatch(message)
        else:
            await self.durability.handle_inbound(message)

    async def _dispatch(self, message: Inbound) -> None:
        ctx = Context(self, message)
        token = _current.set(ctx)
        try:
            for predicate, handler in self._handlers:
                if predicate is not None and not predicate(message):
                    continue
                try:
                    await handler(ctx)
                except Exception as exc:
                    log.warning("handler %s failed on %s: %s", handler.__name__, message.id, exc)
                    await self.emit("error", exc)
        finally:
            _current.reset(token)

    async def send(self, chat_id: str, text: str, *, idempotency_key: str | None = None) -> Receipt:
        """Send ``text`` to ``chat_id``. Inside a handler the key defaults to the handled
        message's ``<inbound id>:<n>``; outside, to a random key."""
        ctx = _current.get()
        if ctx is not None and idempotency_key is None:
            return await self._send(Outbound(chat_id, text), inbound=ctx.message, n=ctx._next())
        return await self._send(Outbound(chat_id, text), idempotency_key=idempotency_key)

    async def enqueue(self, chat_id: str, text: str, *, idempotency_key: str | None = None) -> str:
        """Journal a send for the background sweeper and return its key at once; a second
        enqueue of a recorded key is a no-op. Without durability it sends now."""
        ctx = _current.get()
        inbound = ctx.message if ctx is not None and idempotency_key is None else None
        n = ctx._next() if inbound is not None and ctx is not None else 0
        message = Outbound(chat_id, text)
        key, derived = self._key(idempotency_key, inbound, n)
        if self.durability is None:
            await self._send(message, idempotency_key=key)
            return key
        fp = fingerprint(message) if derived else None
        message = await self._run_before(message)
        return await self.durability.enqueue(
            message, key=key, derived=derived, fp=fp, inbound_id=inbound.id if inbound else None
        )

    @staticmethod
    def _key(idempotency_key: str | None, inbound: Inbound | None, n: int) -> tuple[str, bool]:
        if idempotency_key is not None:
            return idempotency_key, False
        if inbound is not None:
            return derived_key(inbound.id, n), True
        return random_key(), False

    async def _run_before(self, message: Outbound) -> Outbound:
        for hook in self._before_send:
            result = hook(message)
            if inspect.isawaitable(result):
                result = await result
            if isinstance(result, Outbound):
                message = result
        return message

    async def _delivered(self, receipt: Receipt, background: bool) -> None:
        for hook in self._after_send:
            try:
                result = hook(receipt)
                if inspect.isawaitable(result):
                    await result
            except Exception:
                log.exception("after('send') hook failed for %s", receipt.key)
        await self.emit("sent", receipt)

    async def _send(
        self,
        message: Outbound,
        *,
        idempotency_key: str | None = None,
        inbound: Inbound | None = None,
        n: int = 0,
    ) -> Receipt:
        key, derived = self._key(idempotency_key, inbound, n)
        if self.durability is not None:
            fp = fingerprint(message) if derived else None
            if self._before_send:
                message = await self._run_before(message)
            return await self.durability.send(
                message,
                key=key,
                derived=derived,
                fp=fp,
                inbound_id=inbound.id if inbound is not None else None,
            )
        if self._before_send:
            message = await self._run_before(message)
        result = await self.provider.send(message)
        receipt = Receipt(
            key=key,
            chat_id=message.chat_id,
            message_id=result.message_id,
            state="sent",
            inbound_id=inbound.id if inbound is not None else None,
        )
        await self._delivered(receipt, False)
        return receipt
