"""The runtime: a bot bound to a provider and a journal, and the ``Context`` handlers get.

``botmesh.run(bot, provider, journal="file:///var/lib/bot/journal")`` gives a ``Runtime``
for one process (scripts, tests, a single host); the Kafka worker builds the same object
with ``bot.bind(...)`` and a receipts sink. ``Runtime`` opens the journal it was given as a
URL (and closes it), or uses a ``DurableKv`` the caller opened and owns.
"""

from __future__ import annotations

import inspect
import logging
import socket
import time
import uuid
from collections.abc import Mapping
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypedDict, Unpack

from botmesh._flows import FlowRunner
from botmesh._media import load_media_of
from botmesh.providers.http import HttpChannel
from botmesh.state.backends import check_url, is_shared, open_backend
from botmesh.state.backoff import Retries
from botmesh.state.delivery import send_direct
from botmesh.state.engine import Engine, EngineHooks, RuntimeOptions, checked_options
from botmesh.state.errors import (
    BadRecord,
    ConfigError,
    DurabilityError,
    FencedError,
    JournalUnavailableError,
    Reason,
    find_cause,
)
from botmesh.state.events import ErrorEvent, Event, SentEvent
from botmesh.state.fallback import Fallback
from botmesh.state.inbox import Outcome
from botmesh.state.keys import check_explicit, derived_key, fingerprint, random_key
from botmesh.state.kv import DurableKv, Entry, Op
from botmesh.state.messages import Inbound, Media, Outbound, Receipt
from botmesh.state.operations import Operations
from botmesh.state.ports import Provider

if TYPE_CHECKING:
    from botmesh._bot import Bot
    from botmesh._flows import Flow, Slot

__all__ = ["Context", "Runtime", "SendOptions", "run"]

log = logging.getLogger("botmesh")


class Context:
    """What a handler gets: the inbound, and ways to answer it.

    Sends made here are keyed ``<inbound id>:<n>`` (the n-th send of this message) unless
    you pass ``idempotency_key``; so a replay of the message is answered from the outbox.
    """

    __slots__ = ("_flow", "_riders", "_runtime", "_sends", "message")

    def __init__(self, runtime: Runtime, message: Inbound) -> None:
        self._runtime = runtime
        self.message = message
        self._sends = 0
        #: The chat's flow as this turn read it (``botmesh._flows.Slot``), once read.
        self._flow: Slot | None = None
        #: Journal writes that land with this inbound's done (a flow checkpoint), by key.
        self._riders: dict[str, Op] = {}

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
        return self._runtime.provider

    async def load_media(self, *, throw_on_error: bool = False) -> bytes | None:
        """This message's media bytes: ``botmesh.load_media_of(ctx, ...)``."""
        return await load_media_of(self, throw_on_error=throw_on_error)

    def _key(self, idempotency_key: str | None) -> tuple[str, bool]:
        self._sends += 1
        if idempotency_key is not None:
            return check_explicit(idempotency_key), False
        return derived_key(self.message.id, self._sends), True

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
        """Journal a send for the background sweeper and return its key at once."""
        return (await self._submit(chat_id, text, opts, inline=False)).key

    async def start_flow(
        self, flow: Flow[Any] | str, *, args: Mapping[str, Any] | None = None
    ) -> None:
        """Start ``flow`` (the object ``@bot.flow`` returned, or its name) in this chat,
        with ``args`` (JSON) as ``conv.args``. Its first question goes out now, keyed from
        this message (after this handler's earlier sends); the chat's next messages go to
        it. A flow already active in the chat is replaced (it ends ``cancelled``)."""
        runner = self._runtime._flow_runner()
        await runner.start(self, flow, args or {})

    async def _submit(
        self, chat_id: str, text: str | None, opts: SendOptions, *, inline: bool
    ) -> Receipt:
        key, derived = self._key(opts.get("idempotency_key"))
        message = _outbound(chat_id, text, opts)
        return await self._runtime._submit(
            message, key, derived, self.message.id, inline=inline, fallback=opts.get("fallback")
        )


class SendOptions(TypedDict, total=False):
    """The keyword options of every send (``ctx.reply``, ``ctx.send``, ``ctx.enqueue``,
    ``app.send``, ``app.enqueue``)."""

    #: A media reference (URL, path or inline bytes) sent with the text, or instead of it.
    media: Media | None
    #: The send's name (no ``#``); default ``<inbound id>:<n>`` in a handler, else random.
    idempotency_key: str | None
    #: Channel options passed to the provider as they are (``parse_mode``, ``reply_to``…).
    options: Mapping[str, Any] | None
    #: What goes out instead, once, when the channel refuses the send with an error it
    #: names (by default outside WhatsApp's 24-hour window): ``botmesh.Fallback``.
    fallback: Fallback | None


def _outbound(chat_id: str, text: str | None, opts: SendOptions) -> Outbound:
    media = opts.get("media")
    if text is None and media is None:
        raise ValueError("a send needs text or media")
    options = opts.get("options")
    if options is not None and not isinstance(options, Mapping):
        raise BadRecord(
            Reason.WRONG_TYPE,
            "a send's field 'options' must be a dict of channel options (for example "
            f"{{'parse_mode': 'HTML'}}) or None, got {type(options).__name__} "
            f"{repr(options)[:60]}",
            "options",
        )
    channel = {k: v for k, v in options.items() if k != "idempotency_key"} if options else {}
    return Outbound(chat_id, text, media, channel)


class Runtime:
    """A bot running on a provider and a journal. Use it as ``async with`` (or call
    ``start()`` and ``stop()``); ``handle`` feeds it inbounds.

    ``journal`` is a URL (``"memory://"``, ``"file:///path?append_log=true"``), a
    ``DurableKv`` you opened and own, or ``None`` to run without a journal (no dedupe, no
    retries, nothing survives): an explicit opt-out. ``instance_id`` is the lease owner:
    stable across restarts of one deployment, unique per running replica; it defaults to
    ``<hostname>/<bot_id>/<connection_id>`` (plus a per-boot suffix on a shared journal).
    """

    def __init__(
        self,
        bot: Bot,
        provider: Provider,
        journal: str | DurableKv | None,
        **options: Unpack[RuntimeOptions],
    ) -> None:
        options = checked_options(options)
        instance_id = options.get("instance_id")
        fallbacks = options.get("fallbacks")
        _check_provider(provider)
        for name, channel in (fallbacks or {}).items():
            if not isinstance(name, str) or not name:
                raise ConfigError(
                    "fallbacks", f"a fallback channel's name must be a string, got {name!r}"
                )
            _check_provider(channel)
        if isinstance(journal, str):
            check_url(journal)
        elif journal is not None and not isinstance(journal, DurableKv):
            raise ConfigError(
                "journal",
                "expected a URL such as 'memory://' or 'file:///path', a DurableKv, or None "
                f"(no journal), got {type(journal).__name__}",
            )
        if instance_id is not None and not isinstance(instance_id, str):
            raise ConfigError(
                "instance_id",
                f"must be a string (the lease owner, e.g. 'host-1'), got "
                f"{type(instance_id).__name__} {instance_id!r}; leave it out for the default",
            )
        if instance_id is not None and not instance_id.strip():
            raise ConfigError("instance_id", "must not be empty; leave it out for the default")
        self.bot = bot
        self.provider = provider
        self.journal = journal
        self._instance_id = instance_id
        self._receipts = options.get("receipts")
        self._clock = options.get("clock")
        self._rng = options.get("rng")
        self._timings = options.get("timings")
        #: The channels a send's ``Fallback`` may name, by name.
        self.fallbacks: dict[str, Provider] = dict(fallbacks or {})
        self._kv: DurableKv | None = None
        self._engine: Engine | None = None
        self._running = False
        self._flows: FlowRunner | None = None

    # -- lifecycle ------------------------------------------------------------------------

    async def start(self) -> None:
        """Open the journal and recover what an earlier run of this instance left."""
        if self._running:
            return
        if self.journal is not None:
            kv = await open_backend(self.journal) if isinstance(self.journal, str) else self.journal
            if not isinstance(self.journal, str):
                await kv.open()
            self._kv = kv
            bot = self.bot
            engine = Engine(
                kv,
                scope=bot.scope,
                config=bot.config,
                provider=self.provider,
                hooks=EngineHooks(
                    self._dispatch,
                    self._emit,
                    flow_due=self._flow_due if bot._flows else None,
                    sweep=self._flow_sweep if bot._flows else None,
                ),
                instance_id=self.instance_id,
                receipts=self._receipts,
                clock=self._clock,
                rng=self._rng,
                timings=self._timings,
                fallbacks=self.fallbacks,
            )
            self._engine = engine
            self._running = True  # recovery replays inbounds: their handlers send
            try:
                await engine.open()
            except BaseException:
                self._running = False
                await self._close_kv()
                raise
        self._running = True

    async def stop(self) -> None:
        """Stop the sweeper (letting a pass finish), then close a journal opened here."""
        if not self._running:
            return
        self._running = False
        if self._engine is not None:
            await self._engine.close()
        await self._close_kv()
        if isinstance(self.provider, HttpChannel):  # its connections; reopened when used again
            await self.provider.close()

    async def _close_kv(self) -> None:
        kv, self._kv = self._kv, None
        if kv is not None and isinstance(self.journal, str):
            await kv.close()

    async def __aenter__(self) -> Runtime:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    # -- what it offers ---------------------------------------------------------------------

    @property
    def durability(self) -> Operations | None:
        """The operator's handle on the journal (list, replay, retry, discard, metrics);
        ``None`` without a journal."""
        if self.journal is None:
            return None
        return self._started().operations

    @property
    def instance_id(self) -> str:
        """The lease owner: the one given, else the default (known before start)."""
        if self._engine is not None:
            return self._engine.instance_id
        if self._instance_id is None:
            self._instance_id = _default_instance_id(self.bot, self.journal)
        return self._instance_id

    async def quiesce(self) -> int:
        """Stop the background work (the sweeper and the heartbeats, letting a pass finish)
        and record the receipts published so far, while the journal still takes writes;
        ``stop()`` still follows. The Kafka worker calls it before it gives its partitions
        up, so that nothing settles a send or publishes a receipt on a partition it no
        longer owns. Returns how many receipts it recorded published."""
        engine = self._engine
        if not self._running or engine is None:
            return 0
        await engine.scheduler.stop()
        return await self.flush_receipts()

    async def flush_receipts(self) -> int:
        """Wait for every receipt handed to the receipts sink so far, and record the
        acknowledged ones published; returns how many. 0 without a sink."""
        engine = self._started() if self.journal is not None else None
        if engine is None or engine.publisher is None:
            return 0
        return await engine.publisher.flush()

    @property
    def dead_letters_journaled(self) -> bool:
        """Whether the journal copies its dead records to the receipts sink itself (a sink
        that takes dead letters: the Kafka worker's), so the transport need not."""
        engine = self._engine
        return engine is not None and engine.publisher is not None and engine.publisher.dead_letters

    @property
    def inbox_retries(self) -> Retries:
        """The bot's retry decision for inbounds that fail before their handlers."""
        return self.bot.config.inbox.retry_policy()

    def metrics(self) -> dict[str, int]:
        ops = self.durability
        return ops.metrics() if ops is not None else {}

    async def handle(self, message: Inbound, *, source: str | None = None) -> Outcome:
        """Process one inbound: journal it (fail closed), run the handlers, mark it done.

        Returns the ``Outcome``; raises ``JournalUnavailableError`` when it could not be
        journaled or marked done (do not acknowledge it to the channel: handle it again
        later), ``BadRecord`` for an inbound that can never be journaled. A handler that
        raises is reported on ``ErrorEvent`` and the message counts as handled.

        ``source`` (optional) is where the transport read the message (the Kafka worker
        passes ``topic:partition:offset``): a done message that comes again from the same
        place is a replay, and runs its handlers again with every send answered from the
        outbox (``Outcome.REPLAYED``); from anywhere else it is a duplicate.
        """
        if self.journal is None:
            self._check_running()
            await self._dispatch(message)
            return Outcome.HANDLED
        return await self._started().handle(message, source=source)

    async def send(
        self, chat_id: str, text: str | None = None, **opts: Unpack[SendOptions]
    ) -> Receipt:
        """Send outside a handler (a random key unless you give one)."""
        return await self._submit_outside(chat_id, text, opts, inline=True)

    async def enqueue(
        self, chat_id: str, text: str | None = None, **opts: Unpack[SendOptions]
    ) -> str:
        """Journal a send for the background sweeper; a second enqueue of a recorded key is
        a no-op. Returns the key."""
        return (await self._submit_outside(chat_id, text, opts, inline=False)).key

    async def start_flow(
        self, chat_id: str, flow: Flow[Any] | str, *, args: Mapping[str, Any] | None = None
    ) -> None:
        """Start ``flow`` in ``chat_id`` outside a handler (a reminder, a campaign): its
        first question goes out now, keyed ``flow:<run id>:0:<n>``. A flow active in the
        chat is replaced (it ends ``cancelled``). See ``Context.start_flow``."""
        self._check_running()
        await self._flow_runner().start_outside(chat_id, flow, args or {})

    async def _submit_outside(
        self, chat_id: str, text: str | None, opts: SendOptions, *, inline: bool
    ) -> Receipt:
        given = opts.get("idempotency_key")
        key = check_explicit(given) if given is not None else random_key()
        message = _outbound(chat_id, text, opts)
        return await self._submit(
            message, key, False, None, inline=inline, fallback=opts.get("fallback")
        )

    # -- the engine's hooks and the send path ----------------------------------------------

    def _check_running(self) -> None:
        if not self._running:
            raise DurabilityError(
                "the bot is not running: use `async with botmesh.run(bot, provider) as app` "
                "or `await app.start()` first"
            )

    def _started(self) -> Engine:
        self._check_running()
        assert self._engine is not None
        return self._engine

    def _flow_runner(self) -> FlowRunner:
        if self._flows is None:
            if not self.bot._flows:
                raise ValueError("this bot has no flows: register one with @bot.flow(...)")
            self._flows = FlowRunner(self)
        return self._flows

    @staticmethod
    def _outbound(chat_id: str, text: str | None, opts: SendOptions) -> Outbound:
        return _outbound(chat_id, text, opts)

    def _now(self) -> float:
        if self._engine is not None:
            return self._engine.clock.now()
        return self._clock.now() if self._clock is not None else time.time()

    async def _flow_due(self, entry: Entry, now: float) -> int:
        return await self._flow_runner().due(entry, now)

    async def _flow_sweep(self, now: float) -> int:
        return await self._flow_runner().sweep(now)

    async def _dispatch(self, message: Inbound) -> list[Op] | None:
        ctx = Context(self, message)
        if self.bot._flows and await self._flow_runner().route(ctx):
            return list(ctx._riders.values())  # the chat's flow took it
        for predicate, handler in self.bot._handlers:
            if predicate is not None and not predicate(message):
                continue
            try:
                await handler(ctx)
            except Exception as exc:
                log.warning("handler %s failed on %s: %s", handler.__name__, message.id, exc)
                await self._emit(ErrorEvent(exc, "handler", message.id))
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
        return list(ctx._riders.values()) if ctx._riders else None

    async def _emit(self, event: Event) -> None:
        if isinstance(event, SentEvent):
            for hook in self.bot._after_send:
                await _call(hook, event.receipt, "after_send")
        for listener in self.bot._listeners.get(type(event), ()):
            await _call(listener, event, event.name)

    async def _before(self, message: Outbound) -> Outbound:
        for hook in self.bot._before_send:
            result = hook(message)
            if inspect.isawaitable(result):
                result = await result
            if isinstance(result, Outbound):
                message = result
        return message

    async def _submit(
        self,
        message: Outbound,
        key: str,
        derived: bool,
        inbound_id: str | None,
        *,
        inline: bool,
        fallback: Fallback | None = None,
    ) -> Receipt:
        if fallback is not None and not isinstance(fallback, Fallback):
            raise TypeError(f"fallback must be a botmesh.Fallback, got {type(fallback).__name__}")
        fp = fingerprint(message) if derived else None
        if self.bot._before_send:
            message = await self._before(message)
        if self.journal is None:  # no journal: every send goes out now, enqueued or not
            return await self._send_plain(message, key, inbound_id)
        return await self._started().submit(
            message,
            key,
            inline=inline,
            derived=derived,
            fp=fp,
            inbound_id=inbound_id,
            fallback=fallback.to_json() if fallback is not None else None,
        )

    async def _send_plain(self, message: Outbound, key: str, inbound_id: str | None) -> Receipt:
        self._check_running()
        now = self._clock.now() if self._clock is not None else time.time()
        receipt = await send_direct(self.provider, message, key, inbound_id, part=1, now=now)
        await self._emit(SentEvent(receipt, False))
        return receipt


async def _call(fn: Any, arg: object, what: str) -> None:
    try:
        result = fn(arg)
        if inspect.isawaitable(result):
            await result
    except Exception:
        log.exception("%s listener %r failed", what, fn)


def _check_provider(provider: object) -> None:
    missing = [n for n in ("name", "text_limit", "send") if not hasattr(provider, n)]
    if missing:
        raise ConfigError(
            "provider",
            f"{type(provider).__name__} is not a provider: it lacks {', '.join(missing)} "
            "(see botmesh.Provider)",
        )


def _default_instance_id(bot: Bot, journal: str | DurableKv | None) -> str:
    base = f"{socket.gethostname()}/{bot.bot_id}/{bot.connection_id}"
    if is_shared(journal) if isinstance(journal, str) else getattr(journal, "shared", False):
        return f"{base}/{uuid.uuid4().hex[:12]}"  # replicas on other hosts: never share an id
    return base


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
    TwilioProvider(...)}``), ``instance_id`` this runtime's name among the bot's, ``clock``
    and ``rng`` are for tests.
    """
    return bot.bind(provider, journal, **options)
