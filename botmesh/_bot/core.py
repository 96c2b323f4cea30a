"""The runtime's core: a bot's registrations bound to a provider and, while it runs on a
journal, to the journal's engine.

It runs a turn (an inbound through the chat's flow, else the handlers), hands the bot's
listeners their events, and is the one send path (``before_send``, then the engine, or the
provider itself without a journal). ``Runtime`` is its public face; the context and the
flow runner take it as a ``Host`` (``parts.py``).
"""

from __future__ import annotations

import inspect
import logging
import time
from collections.abc import Mapping
from typing import Any

from botmesh._bot.context import Context
from botmesh._bot.flow_runner import FlowRunner
from botmesh._bot.parts import Definition, Turn
from botmesh.state.clock import Clock
from botmesh.state.delivery import send_direct
from botmesh.state.edits import Change
from botmesh.state.engine import Engine
from botmesh.state.errors import DurabilityError, FencedError, JournalUnavailableError, find_cause
from botmesh.state.events import ErrorEvent, Event, SentEvent
from botmesh.state.fallback import Fallback
from botmesh.state.keys import fingerprint
from botmesh.state.kv import Entry, Op
from botmesh.state.messages import Inbound, Outbound, Receipt
from botmesh.state.ports import Provider, Typing
from botmesh.state.timing import Timing

__all__ = ["Core"]

log = logging.getLogger("botmesh")


class Core:
    """One bot on one provider: its turns, its events, its sends (a ``Host``)."""

    def __init__(
        self, bot: Definition, provider: Provider, *, journaled: bool, clock: Clock | None
    ) -> None:
        self.bot = bot
        self.provider = provider
        #: False when the runtime runs without a journal: every send goes out at once.
        self.journaled = journaled
        #: The journal's engine while the runtime runs on one (``Runtime.start``).
        self.engine: Engine | None = None
        self.running = False
        self._clock = clock
        self._flows: FlowRunner | None = None

    # -- state ----------------------------------------------------------------------------

    def check_running(self) -> None:
        if not self.running:
            raise DurabilityError(
                "the bot is not running: use `async with botmesh.run(bot, provider) as app` "
                "or `await app.start()` first"
            )

    def started(self) -> Engine:
        """The engine of a running runtime (``DurabilityError`` when it is not running)."""
        self.check_running()
        assert self.engine is not None
        return self.engine

    def now(self) -> float:
        if self.engine is not None:
            return self.engine.clock.now()
        return self._clock.now() if self._clock is not None else time.time()

    def flows(self) -> FlowRunner:
        if self._flows is None:
            if not self.bot.registry.flows:
                raise ValueError("this bot has no flows: register one with @bot.flow(...)")
            self._flows = FlowRunner(self, self.bot.registry.flows)
        return self._flows

    # -- the engine's hooks ---------------------------------------------------------------

    async def flow_due(self, entry: Entry, now: float) -> int:
        return await self.flows().due(entry, now)

    async def flow_sweep(self, now: float) -> int:
        return await self.flows().sweep(now)

    async def dispatch(self, message: Inbound) -> list[Op] | None:
        """Run one inbound: its chat's flow takes it, else every handler that picks it.
        Returns the journal writes that must land with its done (a flow checkpoint)."""
        turn = Turn(message)
        ctx = Context(self, turn)
        registry = self.bot.registry
        if registry.flows and await self.flows().route(turn):
            return list(turn.riders.values())  # the chat's flow took it
        for predicate, handler in registry.handlers:
            if predicate is not None and not predicate(message):
                continue
            try:
                await handler(ctx)
            except Exception as exc:
                log.warning("handler %s failed on %s: %s", handler.__name__, message.id, exc)
                await self.emit(ErrorEvent(exc, "handler", message.id))
                if (
                    find_cause(exc, JournalUnavailableError) is not None
                    and find_cause(exc, FencedError) is None
                ):
                    # the journal could not record what the handler did (a send not
                    # journaled, so not made): the inbound stays pending and is handled
                    # again, its sends that did land answered from the outbox (a write
                    # refused because another holder owns the record now is a fence,
                    # ``FencedError``: the inbound settles as fenced)
                    raise
        return list(turn.riders.values()) if turn.riders else None

    async def emit(self, event: Event) -> None:
        registry = self.bot.registry
        if isinstance(event, SentEvent):
            for hook in registry.after_send:
                await _call(hook, event.receipt, "after_send")
        for listener in registry.listeners.get(type(event), ()):
            await _call(listener, event, event.name)

    # -- the send path --------------------------------------------------------------------

    async def submit(
        self,
        message: Outbound,
        key: str,
        derived: bool,
        inbound_id: str | None,
        *,
        inline: bool,
        fallback: Fallback | None = None,
        timing: Timing | None = None,
    ) -> Receipt:
        if fallback is not None and not isinstance(fallback, Fallback):
            raise TypeError(f"fallback must be a botmesh.Fallback, got {type(fallback).__name__}")
        fp = fingerprint(message) if derived else None
        if self.bot.registry.before_send:
            message = await self._before(message)
        if not self.journaled:  # no journal: every send goes out now, enqueued or not
            if timing is not None and timing.scheduled:
                raise DurabilityError(
                    f"send {key!r} is scheduled ('at' or 'delay'), and a scheduled send "
                    "waits in the journal: run the bot on one (botmesh.run(bot, provider, "
                    "journal='file:///var/lib/bot') or the Kafka worker)"
                )
            return await self._send_plain(message, key, inbound_id)
        return await self.started().submit(
            message,
            key,
            inline=inline,
            derived=derived,
            fp=fp,
            inbound_id=inbound_id,
            fallback=fallback.to_json() if fallback is not None else None,
            timing=timing,
        )

    async def _before(self, message: Outbound) -> Outbound:
        for hook in self.bot.registry.before_send:
            result = hook(message)
            if inspect.isawaitable(result):
                result = await result
            if isinstance(result, Outbound):
                message = result
        return message

    async def change(
        self,
        key: str,
        op: Change,
        own_key: str,
        *,
        text: str | None = None,
        options: Mapping[str, Any] | None = None,
        derived: bool = False,
        inbound_id: str | None = None,
    ) -> Receipt:
        if not self.journaled:
            raise DurabilityError(
                f"cannot {op} {key!r}: the channel's message id of a send is the one its "
                "journal recorded, and the bot runs without one (botmesh.run(bot, provider, "
                "journal='file:///var/lib/bot') or the Kafka worker)"
            )
        return await self.started().change(
            key,
            op,
            own_key,
            text=text,
            options=options,
            derived=derived,
            inbound_id=inbound_id,
        )

    async def typing(self, chat_id: str) -> bool:
        self.check_running()
        if not isinstance(self.provider, Typing):
            return False
        try:
            await self.provider.typing(chat_id)
        except Exception as exc:  # an indicator is never worth a handler's failure
            log.warning(
                "typing indicator in chat %s refused by %s: %s", chat_id, self.provider.name, exc
            )
            return False
        return True

    async def _send_plain(self, message: Outbound, key: str, inbound_id: str | None) -> Receipt:
        self.check_running()
        receipt = await send_direct(self.provider, message, key, inbound_id, part=1, now=self.now())
        await self.emit(SentEvent(receipt, False))
        return receipt


async def _call(fn: Any, arg: object, what: str) -> None:
    try:
        result = fn(arg)
        if inspect.isawaitable(result):
            await result
    except Exception:
        log.exception("%s listener %r failed", what, fn)
