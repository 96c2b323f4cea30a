"""``Bot``: a bot's definition — its handlers, hooks, listeners and durability policy.

A bot does not choose where it runs. ``botmesh.run(bot, provider, journal=...)`` runs it in
this process; ``botmesh worker --app module:bot`` runs the same object on Kafka, with the
journal and the provider the worker chooses. Both bind it with ``bot.bind(...)``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar, Unpack, overload

from botmesh._bot.broadcast import Campaign
from botmesh._bot.flow import Flow, FlowFn, Incompatible, check_flow_options
from botmesh._bot.parts import AfterSend, BeforeSend, Registry
from botmesh._bot.runtime import Runtime
from botmesh._bot.sends import SendOptions
from botmesh.state.config import DurabilityConfig
from botmesh.state.engine import RuntimeOptions
from botmesh.state.errors import DurabilityError
from botmesh.state.events import (
    AmbiguousEvent,
    DeadEvent,
    ErasedEvent,
    ErrorEvent,
    FallbackEvent,
    FlowEndedEvent,
    SentEvent,
)
from botmesh.state.keys import scope_id
from botmesh.state.kv import DurableKv
from botmesh.state.message_log import LoggedMessage
from botmesh.state.messages import Inbound, Receipt
from botmesh.state.ports import Provider

if TYPE_CHECKING:
    from botmesh._bot.context import Context

__all__ = ["Bot", "Handler", "Listener", "run"]

E = TypeVar(
    "E",
    SentEvent,
    DeadEvent,
    AmbiguousEvent,
    FallbackEvent,
    ErrorEvent,
    FlowEndedEvent,
    ErasedEvent,
)
R = TypeVar("R")
_EVENTS = (
    SentEvent,
    DeadEvent,
    AmbiguousEvent,
    FallbackEvent,
    ErrorEvent,
    FlowEndedEvent,
    ErasedEvent,
)

#: A message handler: ``async def handler(ctx: Context) -> None``.
Handler = Callable[["Context"], Awaitable[None]]
#: An event listener: called with the event; may be a coroutine function.
Listener = Callable[[E], object]

DEFAULT_JOURNAL = "memory://"


class Bot:
    """A chat bot's definition.

    ``bot_id`` (with ``tenant_id``, ``environment_id`` and ``connection_id``) names the bot's
    scope in a shared journal. ``durability`` is its policy: ``None`` for the defaults, a
    mapping of options (``{"outbox": {"retries": 3}}``) or a ``DurabilityConfig``; a bad
    option is refused here, naming it. Durability is always on: the runtime picks the
    journal.
    """

    def __init__(
        self,
        bot_id: str = "bot",
        *,
        durability: Mapping[str, Any] | DurabilityConfig | None = None,
        tenant_id: str = "default",
        environment_id: str = "default",
        connection_id: str = "default",
    ) -> None:
        self.bot_id = bot_id
        self.tenant_id = tenant_id
        self.environment_id = environment_id
        self.connection_id = connection_id
        self.config = DurabilityConfig.of(durability)
        #: What this bot registered (its handlers, listeners, hooks and flows): what a
        #: runtime runs.
        self.registry = Registry()
        #: The runtime this bot was last bound to (``bind``): what ``messages`` reads.
        self._bound: Runtime | None = None

    @property
    def scope(self) -> str:
        """The bot's namespace in a shared journal."""
        return scope_id(self.tenant_id, self.environment_id, self.bot_id, self.connection_id)

    # -- registration -------------------------------------------------------------------

    def on_message(self, handler: Handler) -> Handler:
        """Register ``handler`` for every inbound (decorator)."""
        self.registry.handlers.append((None, handler))
        return handler

    def when(self, predicate: Callable[[Inbound], bool]) -> Callable[[Handler], Handler]:
        """Register a handler for the inbounds ``predicate`` accepts (decorator)."""

        def register(handler: Handler) -> Handler:
            self.registry.handlers.append((predicate, handler))
            return handler

        return register

    @overload
    def on(self, event: type[E]) -> Callable[[Listener[E]], Listener[E]]: ...

    @overload
    def on(self, event: type[E], listener: Listener[E]) -> Listener[E]: ...

    def on(
        self, event: type[E], listener: Listener[E] | None = None
    ) -> Listener[E] | Callable[[Listener[E]], Listener[E]]:
        """Listen to ``event`` (``SentEvent``, ``DeadEvent``, ``AmbiguousEvent``,
        ``FallbackEvent``, ``ErrorEvent``, ``FlowEndedEvent``, ``ErasedEvent``):
        ``bot.on(DeadEvent, alert)`` or ``@bot.on(DeadEvent)``."""
        if event not in _EVENTS:
            names = [e.__name__ for e in _EVENTS]
            raise TypeError(f"bot.on({event!r}): listen to {', '.join(names[:-1])} or {names[-1]}")

        def register(fn: Listener[E]) -> Listener[E]:
            self.registry.listeners.setdefault(event, []).append(fn)
            return fn

        return register if listener is None else register(listener)

    def flow(
        self,
        name: str,
        *,
        persistent: bool = False,
        version: int = 1,
        cancel: tuple[str, ...] = ("/cancel",),
        on_incompatible: Incompatible = "refuse",
    ) -> Callable[[FlowFn[R]], Flow[R]]:
        """Register a conversation flow (decorator): ``async def f(conv: Conversation)``,
        plain sequential code that ``await conv.ask(...)``. Start it with
        ``ctx.start_flow(f)`` (or by ``name``).

        ``persistent=True`` checkpoints it in the journal (it survives a crash, a restart,
        the chat moving to another worker); otherwise it lives in this process. ``version``
        is stored with the checkpoint: bump it when the questions or their order change; a
        checkpoint of another version is refused (``FlowVersionError``) and
        ``on_incompatible`` decides: ``"refuse"`` (the flow stays parked, the message goes
        to the handlers, an ``ErrorEvent`` fires), ``"restart"`` (it starts again from its
        beginning) or ``"drop"`` (it ends ``dropped``). A message whose text is one of the
        ``cancel`` commands raises ``FlowCancelled`` at the pending ask. See docs/flows.md.
        """
        commands = check_flow_options(name, version, cancel, on_incompatible)
        if name in self.registry.flows:
            raise ValueError(f"a flow named {name!r} is registered already on bot {self.bot_id!r}")

        def register(fn: FlowFn[R]) -> Flow[R]:
            flow = Flow(
                name,
                fn,
                persistent=persistent,
                version=version,
                cancel=commands,
                on_incompatible=on_incompatible,
            )
            self.registry.flows[name] = flow
            return flow

        return register

    def before_send(self, hook: BeforeSend) -> BeforeSend:
        """Run ``hook(outbound)`` once per send, before the journal and before a text is
        split; it may return a changed ``Outbound`` (decorator)."""
        self.registry.before_send.append(hook)
        return hook

    def after_send(self, hook: AfterSend) -> AfterSend:
        """Run ``hook(receipt)`` after each part went out, inline or in the background
        (decorator)."""
        self.registry.after_send.append(hook)
        return hook

    # -- binding ----------------------------------------------------------------------------

    def bind(
        self,
        provider: Provider,
        journal: str | DurableKv | None = DEFAULT_JOURNAL,
        **options: Unpack[RuntimeOptions],
    ) -> Runtime:
        """This bot on ``provider`` and ``journal``: what ``botmesh.run`` returns, and what
        the Kafka worker runs (it also gives a ``receipts`` sink, and ``timings``: its
        Prometheus histograms). See ``botmesh.run`` and ``RuntimeOptions``."""
        runtime = self._bound = Runtime(self, provider, journal, **options)
        return runtime

    # -- what it sent -----------------------------------------------------------------------

    async def messages(
        self,
        chat_id: str,
        *,
        limit: int = 50,
        before: LoggedMessage | float | None = None,
    ) -> list[LoggedMessage]:
        """What this bot sent to ``chat_id`` (the message log: one entry per part the channel
        accepted), newest first: up to ``limit``, older than ``before`` (the last message
        of the page before, or a time in seconds since the epoch). Read from the journal of
        the runtime this bot was last bound to (``botmesh.run``; on the Kafka worker, the
        partitions it owns: a handler reads its own chat's log). See docs/message-log.md."""
        runtime = self._bound
        if runtime is None:
            raise DurabilityError(
                "no message log: the bot is not running on a journal; use `async with "
                "botmesh.run(bot, provider, journal=...) as app` first"
            )
        return await runtime.messages(chat_id, limit=limit, before=before)

    # -- sends over time ----------------------------------------------------------------

    async def cancel(self, key: str) -> Receipt:
        """Cancel the send ``key`` before it goes out (a scheduled send, a reminder): on the
        runtime this bot was last bound to, as ``Runtime.cancel``."""
        return await self._runtime("cancel a send").cancel(key)

    async def broadcast(
        self,
        chat_ids: Iterable[str],
        text: str | None = None,
        *,
        campaign: str,
        concurrency: int = 16,
        **opts: Unpack[SendOptions],
    ) -> Campaign:
        """One send to many chats, as a campaign: ``Runtime.broadcast`` on the runtime this
        bot was last bound to (docs/sends-over-time.md)."""
        runtime = self._runtime("broadcast")
        return await runtime.broadcast(
            chat_ids, text, campaign=campaign, concurrency=concurrency, **opts
        )

    def _runtime(self, what: str) -> Runtime:
        runtime = self._bound
        if runtime is None:
            raise DurabilityError(
                f"cannot {what}: the bot is not running; use `async with botmesh.run(bot, "
                "provider, journal=...) as app` first"
            )
        return runtime


def run(
    bot: Bot,
    provider: Provider,
    *,
    journal: str | DurableKv | None = "memory://",
    **options: Unpack[RuntimeOptions],
) -> Runtime:
    """Run ``bot`` in this process::

        async with botmesh.run(bot, provider, journal="file:///var/lib/bot/journal") as app:
            outcome = await app.handle(Inbound(id="wamid.1", chat_id="42", text="hi"))

    ``journal`` defaults to ``"memory://"`` (retries, dedupe and dead letters within this
    process; nothing survives it). Use ``file:///path`` to survive a crash on one host.
    ``journal=None`` runs without any journal: an explicit opt-out. A bad URL or option is
    refused here, naming it. The other options (``RuntimeOptions``): ``fallbacks`` names the
    other channels a send's ``Fallback`` may go out through (``{"sms":
    TwilioProvider(...)}``), ``instance_id`` this runtime's name among the bot's,
    ``rate_limits`` (a ``botmesh.journal.RateLimits``) the channel's rate limits over the
    bot's ``outbox.rate_limits`` (docs/rate-limits.md), ``clock`` and ``rng`` are for tests.
    """
    return bot.bind(provider, journal, **options)
