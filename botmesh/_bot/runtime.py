"""The runtime: a bot bound to a provider and a journal.

``botmesh.run(bot, provider, journal="file:///var/lib/bot/journal")`` gives a ``Runtime``
for one process (scripts, tests, a single host); the Kafka worker builds the same object
with ``bot.bind(...)`` and a receipts sink. ``Runtime`` opens the journal it was given as a
URL (and closes it), or uses a ``DurableKv`` the caller opened and owns.
"""

from __future__ import annotations

import logging
import socket
import uuid
from collections.abc import Iterable, Mapping
from types import TracebackType
from typing import TYPE_CHECKING, Any, Unpack

from botmesh._bot.broadcast import Campaign, broadcast, checked, recipients_of
from botmesh._bot.core import Core
from botmesh._bot.parts import Definition
from botmesh._bot.sends import SendOptions, outbound, timing_of
from botmesh.providers.http import HttpChannel
from botmesh.state.backends import check_url, is_shared, open_backend
from botmesh.state.backoff import Retries
from botmesh.state.engine import Engine, EngineHooks, RuntimeOptions, checked_options
from botmesh.state.errors import (
    ConfigError,
    DurabilityError,
)
from botmesh.state.inbox import Outcome
from botmesh.state.keys import check_explicit, random_key
from botmesh.state.kv import DurableKv
from botmesh.state.messages import (
    DELIVERY_STATES,
    DeliveryStatus,
    Inbound,
    Outbound,
    Receipt,
)
from botmesh.state.operations import Operations
from botmesh.state.ports import Provider

if TYPE_CHECKING:
    from botmesh._bot.flow import Flow
    from botmesh.state.message_log import LoggedMessage

__all__ = ["Runtime"]

log = logging.getLogger("botmesh")


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
        bot: Definition,
        provider: Provider,
        journal: str | DurableKv | None,
        **options: Unpack[RuntimeOptions],
    ) -> None:
        options = checked_options(options)
        _check_parts(provider, journal, options)
        self.bot = bot
        self.provider = provider
        self.journal = journal
        self._instance_id = options.get("instance_id")
        self._options = options
        #: The channels a send's ``Fallback`` may name, by name.
        self.fallbacks: dict[str, Provider] = dict(options.get("fallbacks") or {})
        self._kv: DurableKv | None = None
        self._pace_share = 1.0
        self._core = Core(bot, provider, journaled=journal is not None, clock=options.get("clock"))

    # -- lifecycle ------------------------------------------------------------------------

    async def start(self) -> None:
        """Open the journal and recover what an earlier run of this instance left."""
        core = self._core
        if core.running:
            return
        if self.journal is not None:
            kv = await open_backend(self.journal) if isinstance(self.journal, str) else self.journal
            if not isinstance(self.journal, str):
                await kv.open()
            self._kv = kv
            core.engine = engine = self._engine_on(kv)
            engine.set_pace_share(self._pace_share)
            core.running = True  # recovery replays inbounds: their handlers send
            try:
                await engine.open()
            except BaseException:
                core.running = False
                await self._close_kv()
                raise
        core.running = True

    def _engine_on(self, kv: DurableKv) -> Engine:
        bot, core, options = self.bot, self._core, self._options
        flows = bool(bot.registry.flows)
        return Engine(
            kv,
            scope=bot.scope,
            config=bot.config,
            provider=self.provider,
            hooks=EngineHooks(
                core.dispatch,
                core.emit,
                flow_due=core.flow_due if flows else None,
                sweep=core.flow_sweep if flows else None,
            ),
            instance_id=self.instance_id,
            receipts=options.get("receipts"),
            clock=options.get("clock"),
            rng=options.get("rng"),
            timings=options.get("timings"),
            fallbacks=self.fallbacks,
            rate_limits=options.get("rate_limits"),
        )

    async def stop(self) -> None:
        """Stop the sweeper (letting a pass finish), then close a journal opened here."""
        core = self._core
        if not core.running:
            return
        core.running = False
        if core.engine is not None:
            await core.engine.close()
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
        return self._core.started().operations

    @property
    def instance_id(self) -> str:
        """The lease owner: the one given, else the default (known before start)."""
        if self._core.engine is not None:
            return self._core.engine.instance_id
        if self._instance_id is None:
            self._instance_id = _default_instance_id(self.bot, self.journal)
        return self._instance_id

    async def quiesce(self) -> int:
        """Stop the background work (the sweeper and the heartbeats, letting a pass finish)
        and record the receipts published so far, while the journal still takes writes;
        ``stop()`` still follows. The Kafka worker calls it before it gives its partitions
        up, so that nothing settles a send or publishes a receipt on a partition it no
        longer owns. Returns how many receipts it recorded published."""
        engine = self._core.engine
        if not self._core.running or engine is None:
            return 0
        await engine.scheduler.stop()
        return await self.flush_receipts()

    async def flush_receipts(self) -> int:
        """Wait for every receipt handed to the receipts sink so far, and record the
        acknowledged ones published; returns how many. 0 without a sink."""
        engine = self._core.started() if self.journal is not None else None
        if engine is None or engine.publisher is None:
            return 0
        return await engine.publisher.flush()

    @property
    def dead_letters_journaled(self) -> bool:
        """Whether the journal copies its dead records to the receipts sink itself (a sink
        that takes dead letters: the Kafka worker's), so the transport need not."""
        engine = self._core.engine
        return engine is not None and engine.publisher is not None and engine.publisher.dead_letters

    def set_pace_share(self, fraction: float) -> None:
        """This runtime's part of each channel's rate limit, in (0, 1] (default 1): several
        runtimes sending through one bot account each take their part, so that together
        they stay under it. The Kafka worker sets it to the part of the inbound partitions
        it owns, at every assignment. Chat limits are not shared (a chat has one owner)."""
        if isinstance(fraction, bool) or not (
            isinstance(fraction, int | float) and 0.0 < fraction <= 1.0
        ):
            raise ConfigError("pace share", f"must be in (0, 1], got {fraction!r}")
        self._pace_share = float(fraction)
        if self._core.engine is not None:
            self._core.engine.set_pace_share(self._pace_share)

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
            self._core.check_running()
            await self._core.dispatch(message)
            return Outcome.HANDLED
        return await self._core.started().handle(message, source=source)

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
        self._core.check_running()
        await self._core.flows().start_outside(chat_id, flow, args or {})

    async def messages(
        self,
        chat_id: str,
        *,
        limit: int = 50,
        before: LoggedMessage | float | None = None,
    ) -> list[LoggedMessage]:
        """What this bot sent to ``chat_id``, newest first (``Bot.messages`` reads it)."""
        if self.journal is None:
            raise DurabilityError(
                "no message log: the bot is not running on a journal; use `async with "
                "botmesh.run(bot, provider, journal=...) as app` first"
            )
        return await self._core.started().messages.history(chat_id, limit=limit, before=before)

    async def cancel(self, key: str) -> Receipt:
        """Cancel the send ``key`` before it goes out (a scheduled send, or one waiting its
        turn or a retry): it is settled ``cancelled``, never sent, and a later send under
        ``key`` is answered from it. ``RecordStateError`` when it went out already or is
        in flight."""
        return await self._journal_ops("cancel a send").cancel(check_explicit(key))

    async def edit(
        self,
        key: str,
        text: str,
        *,
        options: Mapping[str, Any] | None = None,
        idempotency_key: str | None = None,
    ) -> Receipt:
        """Change the text of the send ``key`` outside a handler (``Context.edit``),
        journaled under ``idempotency_key`` (a random one unless given)."""
        own = check_explicit(idempotency_key) if idempotency_key is not None else random_key()
        return await self._core.change(check_explicit(key), "edit", own, text=text, options=options)

    async def delete(self, key: str, *, idempotency_key: str | None = None) -> Receipt:
        """Delete the send ``key`` outside a handler (``Context.delete``)."""
        own = check_explicit(idempotency_key) if idempotency_key is not None else random_key()
        return await self._core.change(check_explicit(key), "delete", own)

    async def typing(self, chat_id: str) -> bool:
        """Show the channel's typing indicator in ``chat_id`` (``Context.typing``)."""
        return await self._core.typing(chat_id)

    async def delivery_status(
        self,
        chat_id: str,
        message_id: str,
        status: str,
        *,
        channel: str | None = None,
        code: str | None = None,
        error: str | None = None,
        ts: float | None = None,
    ) -> str:
        """Apply what a channel's status webhook said of the message ``message_id`` it
        accepted in ``chat_id`` (``botmesh.state.statuses``): ``status`` is ``sent``,
        ``delivered``, ``read`` or ``failed`` (``code`` and ``error``: the channel's, on
        ``failed``). Returns the delivery state it set (``delivered``, ``read``,
        ``failed``), ``unchanged`` or ``unmatched``. The Kafka worker feeds it
        ``<prefix>.statuses``; in process, your webhook handler does (after checking the
        webhook's signature)."""
        if status not in DELIVERY_STATES:
            raise ValueError(
                f"delivery_status(status={status!r}): give sent, delivered, read or failed "
                "(map the channel's own names to these: Twilio's undelivered is failed)"
            )
        record = DeliveryStatus(
            chat_id=chat_id,
            message_id=message_id,
            status=DELIVERY_STATES[status],
            channel=channel,
            code=code,
            error=error,
            ts=ts,
        )
        return await self._core.started().statuses.apply(record)

    async def broadcast(
        self,
        chat_ids: Iterable[str],
        text: str | None = None,
        *,
        campaign: str,
        concurrency: int = 16,
        **opts: Unpack[SendOptions],
    ) -> Campaign:
        """Send ``text`` (and the send options: media, ``at``, ``deliver_within``…) to each
        of ``chat_ids`` as the campaign ``campaign``: one send per recipient, journaled
        ``concurrency`` at a time under ``campaign:<campaign>:<chat id>`` and delivered by
        the background sweeper at the channel's pace. Run again after a crash, it sends no
        recipient twice and skips none. The ``Campaign`` gives its progress (``status``,
        ``wait``) and cancels what has not gone out (``cancel``)."""
        ops = checked(campaign, concurrency, self.durability)
        if opts.get("idempotency_key") is not None:
            raise ValueError("a broadcast keys each send by its campaign: drop idempotency_key")
        handle = Campaign(campaign, ops, recipients_of(chat_ids))
        return await broadcast(handle, self._enqueue, text, opts, concurrency=concurrency)

    async def campaign(self, campaign: str) -> Campaign:
        """The handle of a campaign broadcast earlier (its progress; ``cancel`` cancels its
        sends that wait in the journal)."""
        ops = checked(campaign, 1, self.durability)
        return Campaign(campaign, ops, [])

    def _journal_ops(self, what: str) -> Operations:
        ops = self.durability
        if ops is None:
            raise DurabilityError(f"cannot {what}: the bot is not running on a journal")
        return ops

    async def _enqueue(self, message: Outbound, key: str, opts: SendOptions) -> Receipt:
        return await self._core.submit(
            message,
            key,
            False,
            None,
            inline=False,
            fallback=opts.get("fallback"),
            timing=timing_of(opts),
        )

    async def _submit_outside(
        self, chat_id: str, text: str | None, opts: SendOptions, *, inline: bool
    ) -> Receipt:
        given = opts.get("idempotency_key")
        key = check_explicit(given) if given is not None else random_key()
        message = outbound(chat_id, text, opts)
        return await self._core.submit(
            message,
            key,
            False,
            None,
            inline=inline,
            fallback=opts.get("fallback"),
            timing=timing_of(opts),
        )


def _check_parts(
    provider: Provider, journal: str | DurableKv | None, options: RuntimeOptions
) -> None:
    """Refuse a provider, a journal or an option of the wrong kind, naming it."""
    _check_provider(provider)
    for name, channel in (options.get("fallbacks") or {}).items():
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
    instance_id = options.get("instance_id")
    if instance_id is not None and not isinstance(instance_id, str):
        raise ConfigError(
            "instance_id",
            f"must be a string (the lease owner, e.g. 'host-1'), got "
            f"{type(instance_id).__name__} {instance_id!r}; leave it out for the default",
        )
    if instance_id is not None and not instance_id.strip():
        raise ConfigError("instance_id", "must not be empty; leave it out for the default")


def _check_provider(provider: object) -> None:
    missing = [n for n in ("name", "text_limit", "send") if not hasattr(provider, n)]
    if missing:
        raise ConfigError(
            "provider",
            f"{type(provider).__name__} is not a provider: it lacks {', '.join(missing)} "
            "(see botmesh.Provider)",
        )


def _default_instance_id(bot: Definition, journal: str | DurableKv | None) -> str:
    base = f"{socket.gethostname()}/{bot.bot_id}/{bot.connection_id}"
    if is_shared(journal) if isinstance(journal, str) else getattr(journal, "shared", False):
        return f"{base}/{uuid.uuid4().hex[:12]}"  # replicas on other hosts: never share an id
    return base
