"""The inbound path: decode a batch of records (inbound messages and send
requests), settle each through the runtime, dead-letter what cannot be settled, publish
receipts.

``InboundRunner.run_batch`` takes plain :class:`RawRecord` tuples, so the worker's loop
(``botmesh.streams.worker.loop``) and tests drive the same code. It **returns only when
every record of the batch is settled**, and then the caller may ack the whole batch; it **raises**
(:class:`BatchAbandoned`, or whatever the runtime raised that is not an ``Exception``) when
one is not, and then nothing of the batch may be acked (the worker exits hard).

A record is settled when ``runtime.handle()`` returned an ``Outcome``, or when its dead
letter is on ``<prefix>.inbound.dlq``, acked by the broker:

==========================================  ==========================================
``handle()`` gives                          the runner
==========================================  ==========================================
``handled``, ``duplicate``, ``fenced``,     settled
``unjournaled``, ``replayed``
``dead`` (the journal dead-lettered it)     DLQ, reason ``attempts-exhausted``
``BadRecord`` (or decoding raised it)       DLQ at once, with its reason
(decoding raised another ``Exception``)     DLQ at once, reason ``handle-failed``
``JournalUnavailableError``                 retried with the bot's inbox backoff; after the
                                            budget, DLQ reason ``journal-unavailable``
an error raised from a record too large     DLQ at once, reason ``too-large`` (the journal's
for the producer                            record of the message is over the producer's
                                            limit: trying again cannot help)
any other ``Exception``                     the same; DLQ reason ``handle-failed``
``MembershipUnconfirmed`` (the worker may   retried every 0.5 s, not charged; after 5 s the
have been evicted:                          batch is abandoned (the worker exits and starts
``botmesh.streams.table_kv``)               afresh: its partitions are someone else's by
                                            then)
a journal fence (``JournalFence``, a      the batch is abandoned at once: nothing retried,
``FencedError``: ``ProducerFencedOut``,     dead-lettered or acked; the worker exits and
another producer fenced ours;               starts afresh (a zombie for the record, whose
``PartitionRevoked``, its partition was     new owner reads it again from the committed
taken from this worker)                     offset)
any outcome once the record's partition     the same: the worker was evicted while it ran
was taken from this worker                  (its writes since were refused as fences)
==========================================  ==========================================

The retry decision is the bot's (``runtime.inbox_retries``: ``inbox.max_attempts`` and
``inbox.backoff``). Dead letters carry the record untouched, with headers ``reason``,
``detail``, ``error.class``, ``error.message``, ``attempts``, ``source.topic``,
``source.partition``, ``source.offset``, ``dead.ts`` (credentials in URLs are masked).

**Dead letters too large to copy** are cut to fit, and no record, however large or odd,
stops the worker or holds up its partition (``botmesh.streams.dead_letter_copies``).

**Send requests** (records of ``requests_topic``, ``<prefix>.requests``: a send from outside
a handler, ``botmesh.topics.records.SendRequest``) go the same way: decoded with
``decode_request``, put in their chat's sequence, and settled by ``runtime.send(chat_id,
text, media=, options=, idempotency_key=<key, else req:<id>>)`` inside the record's journal
partition; a request delivered or produced again is answered from the outbox and sends
nothing twice. A request is settled when ``send`` returned a receipt (counted in
``requests`` by its state: ``sent``, ``pending`` (journaled, delivery left to the sweeper:
a scheduled request, one with an ``at``, always is), or ``dead``/``unknown``/``cancelled``
answered from the outbox), or raised ``SendDeferredError`` (``deferred``: journaled, the
sweeper retries it), ``SendExpiredError`` (``expired``: its deadline passed first; journaled
dead, with its dead letter and receipt), ``FencedError`` (``fenced``: another
holder delivers it) or any other error that is not the journal's (``refused``: the provider
refused it for good and the send is journaled dead with its receipt, or a before-send hook
raised, as a handler's error counts as handled). A ``DurabilityError`` (the journal) is
retried and dead-lettered as for an inbound (``journal-unavailable``, ``handle-failed``); an
undecodable request goes at once, with its ``BadRecord`` reason. A request with ``edit`` or
``delete`` (a send's key) edits or deletes that send instead (``runtime.edit``,
``runtime.delete``: ``botmesh.state.edits``), journaled under the request's key; one that
names a send that cannot be changed (never sent, not gone out, a channel that cannot) goes
to the DLQ at once, reason ``not-editable``. A request's dead letters go
to ``<prefix>.requests.dlq`` (produce role ``"requests-dlq"``), so each DLQ holds the
records of one topic and is redriven to it.

**Operator actions** (records of ``control_topic``, ``<prefix>.control``:
``botmesh.topics.control.ControlRequest``, keyed by chat id) are settled in their chat's sequence
too:
``retry_send``, ``replay_inbound``, ``discard``, ``cancel``, ``restart_flow``, ``drop_flow`` or
``erase_chat`` through ``runtime.durability`` in the chat's journal partition; a record in
a state the action does not apply to (a send already sent, an unknown key, a chat without
a flow) is refused, not retried. An erasure's result carries its receipt. Each answers
with a ``ControlResult`` on
``<prefix>.control.results`` (role ``"control-results"``, keyed by the request id), acked
before the batch is; an undecodable one goes to ``<prefix>.requests.dlq`` (its
``source.topic`` says where it came from).

**Dead records the journal copies itself.** When the runtime's receipts sink takes dead
letters (:meth:`KafkaReceipts.dead_letter`), the journal copies every record it marks dead
(a dead send to ``<prefix>.outbox.dlq``, a dead inbound to ``<prefix>.inbound.dlq``) and
marks the copy once acked (``botmesh.state.receipts``); the runner then adds no copy of its own for
the outcome ``dead``, however often the record comes again.

**A chat's order across the two topics.** Kafka orders a partition, not two topics: the
consumer hands over inbound and request records of one batch round-robin by topic. Within a
batch the runner settles a chat's records in the order of their timestamps (producer time,
``RawRecord.timestamp``), each topic-partition's records keeping their offset order (a merge,
never a sort of one partition: clock skew between producers changes only how the two
sequences interleave). Records of different batches are settled batch after batch.

**How far a failing chat blocks others.** The records of one chat run one after the other,
in offset order; the chats of a batch run concurrently. Batches may run side by side (the
worker starts each as it is taken: ``botmesh.streams.worker.loop``): a chat's records wait
for its records of the batches handed over before, nothing else does. So a record that waits
for a retry, or a provider that hangs, holds up only the later records of its own chat; the
caller acks a batch once ``run_batch`` returned, and the worker's commit stays before its
lowest record not settled (``botmesh.streams.worker.checkpoint``). ``unsettled`` counts the
records handed over and not settled, over every batch (the worker takes no more beyond its
in-flight limit). A batch that keeps retrying for longer than ``batch_deadline`` (default
600 s), or is still retrying when the worker stops, is abandoned: :class:`BatchAbandoned`,
nothing acked, the broker redelivers it and the journal answers what was already settled as
duplicates. Each batch waits for its own dead letters and action results to be acked (they
are tracked per batch).

Receipts: the runtime publishes every settled send through :class:`KafkaReceipts` (a
``botmesh.state.receipts.ReceiptSink``); at the end of each batch the runner waits for the broker's
acks and has them recorded in the journal (``runtime.flush_receipts()``). A receipt that was not
acked stays unpublished in the journal and is published again by the runtime's sweeper:
receipts are at least once, never lost. (Under ``exactly_once`` on the Kafka journal each
rides with the journal record that settles its send instead, in its transaction: once.)
"""

from __future__ import annotations

import asyncio
import heapq
import logging
import random
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import Any, Literal, Protocol, TypeVar, Unpack, runtime_checkable

import msgspec

from botmesh.state.backoff import GiveUp, Retries
from botmesh.state.engine import RuntimeOptions
from botmesh.state.erasure import ErasureReceipt
from botmesh.state.errors import (
    BadRecord,
    DurabilityError,
    FencedError,
    JournalUnavailableError,
    Reason,
    RecordStateError,
    SendDeferredError,
    SendExpiredError,
    UnsupportedContentError,
    caused_by,
)
from botmesh.state.inbox import Outcome
from botmesh.state.kv import DurableKv
from botmesh.state.messages import DeliveryStatus, Inbound, Media, Receipt
from botmesh.state.operations import Operations
from botmesh.state.ports import Provider
from botmesh.streams.dead_letter_copies import (
    MAX_REQUEST_SIZE,
    BatchAbandoned,
    DeadLetterCopies,
    too_large,
)
from botmesh.streams.raw_record import RawRecord
from botmesh.streams.sink import Produce
from botmesh.streams.table_kv import (
    JournalFence,
    MembershipUnconfirmed,
    ProducerFencedOut,
    in_partition,
)
from botmesh.topics.control import ControlRequest, ControlResult, decode_control, encode_result
from botmesh.topics.dead_letters import redact
from botmesh.topics.records import (
    SendRequest,
    decode_inbound,
    decode_request,
    decode_status,
)

__all__ = [
    "BatchAbandoned",
    "BotDefinition",
    "InboundRunner",
    "RawRecord",
    "RecordScope",
    "RuntimeLike",
    "in_time_order",
]

log = logging.getLogger("botmesh.streams")

#: What one record of a batch is, once decoded.
Record = Inbound | SendRequest | ControlRequest | DeliveryStatus
Item = tuple["RawRecord", Record]
#: What the runner settles each record inside, entered once a record: ``scope(raw, item)``
#: (the worker's command line gives ``botmesh.observability.logs.record_scope``: the
#: record's log context and, with tracing on, its span). The default does nothing.
RecordScope = Callable[["RawRecord", Record], AbstractContextManager[object]]
_NO_SCOPE = nullcontext()
#: A chat's records of one batch: the chat, its records, what they wait for (the end of its
#: records of the batches before, if any) and the future they set once settled.
_Chain = tuple[str, list[Item], asyncio.Future[None] | None, asyncio.Future[None]]
_T = TypeVar("_T")
#: Seconds between attempts at a record refused because the worker's group membership is
#: unconfirmed (``botmesh.streams.table_kv.MembershipUnconfirmed``; not charged as attempts).
UNCONFIRMED_WAIT_S = 0.5
#: How long a record waits for the group to confirm the worker before its batch is given up.
UNCONFIRMED_PATIENCE_S = 5.0


class RuntimeLike(Protocol):
    """What the worker needs from a bound bot (``botmesh.Runtime`` satisfies it)."""

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    async def handle(self, message: Inbound, *, source: str | None = None) -> Outcome: ...

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
    ) -> str: ...

    async def edit(
        self,
        key: str,
        text: str,
        *,
        options: Mapping[str, Any] | None = None,
        idempotency_key: str | None = None,
    ) -> Receipt: ...

    async def delete(self, key: str, *, idempotency_key: str | None = None) -> Receipt: ...

    async def flush_receipts(self) -> int: ...

    async def quiesce(self) -> int: ...

    async def send(
        self,
        chat_id: str,
        text: str | None = None,
        *,
        media: Media | None = ...,
        idempotency_key: str | None = ...,
        options: Mapping[str, Any] | None = ...,
        at: float | None = ...,
        expires_at: float | None = ...,
    ) -> Receipt: ...

    @property
    def inbox_retries(self) -> Retries: ...

    @property
    def durability(self) -> Operations | None: ...


@runtime_checkable
class BotDefinition(Protocol):
    """A bot definition the worker can run (``botmesh.Bot`` satisfies it): the worker
    chooses the provider, the journal and the instance id, and binds it."""

    bot_id: str

    def bind(
        self,
        provider: Provider,
        journal: str | DurableKv | None = ...,
        **options: Unpack[RuntimeOptions],
    ) -> RuntimeLike: ...


class InboundRunner:
    """Settles batches of inbound records through ``runtime.handle``, and of send requests
    through ``runtime.send`` (see the module doc).

    ``produce`` hands dead letters to the producer. ``stopping`` (an event the worker sets
    when it stops) ends retry waits: the batch is abandoned rather than acked unsettled.
    ``sleep(delay)`` waits between attempts (tests pass their own; the default ends early,
    raising ``BatchAbandoned``, when ``stopping`` is set). ``owns(partition)`` says whether
    this worker still owns a record's partition: a record that fails on a partition taken
    from it is neither retried nor dead-lettered here (``BatchAbandoned``). Records of
    ``requests_topic`` are send requests (see the module doc). ``max_request_size`` is the
    producer's limit on one record (librdkafka's ``message.max.bytes``): a dead letter
    that would not fit under it is cut (see the module doc). ``flush`` makes the journal's
    deferred writes durable (``TableKv.flush``): a batch is settled once it returned.
    ``fresh(record)`` says whether an inbound record is fresh (it reached its partition
    after the worker was given the partition: ``botmesh.streams.write_behind``'s
    ``DEFERRED_WHEN_FRESH``); without it, none is.
    """

    def __init__(
        self,
        runtime: RuntimeLike,
        produce: Produce,
        *,
        ack_timeout: float = 60.0,
        batch_deadline: float = 600.0,
        rng: random.Random | None = None,
        sleep: Callable[[float], Awaitable[None]] | None = None,
        owns: Callable[[int], bool] | None = None,
        requests_topic: str | None = None,
        control_topic: str | None = None,
        statuses_topic: str | None = None,
        instance: str = "",
        max_request_size: int = MAX_REQUEST_SIZE,
        flush: Callable[[], Awaitable[None]] | None = None,
        on_settled: Callable[[float], None] | None = None,
        letters: Counter[tuple[str, str]] | None = None,
        fresh: Callable[[RawRecord], bool] | None = None,
    ) -> None:
        self.runtime = runtime
        self._flush = flush
        #: Given the seconds from an inbound record's timestamp to its settling.
        self._on_settled = on_settled
        #: Dead letters produced, by (kind, reason): ``inbound``, ``request`` or
        #: ``control`` here, ``outbox`` and ``inbound`` from the journal (``KafkaReceipts``).
        #: The copies of records that cannot be settled (``botmesh.streams.dead_letter_copies``).
        self.copies = DeadLetterCopies(
            produce, ack_timeout=ack_timeout, max_request_size=max_request_size, letters=letters
        )
        self.letters = self.copies.letters
        self.requests_topic = requests_topic
        self.control_topic = control_topic
        self.statuses_topic = statuses_topic
        self.instance = instance
        self._owns = owns
        self._fresh = fresh
        self._produce = produce
        self._retries = runtime.inbox_retries
        self.ack_timeout = ack_timeout
        self.batch_deadline = batch_deadline
        self._rng = rng or random.Random()
        #: The chats whose records are being settled, each with what its next records wait
        #: for: the end of its records of the batches before (``run_batch``).
        self._chains: dict[str, asyncio.Future[None]] = {}
        #: Records handed to ``run_batch`` and not settled yet (over every batch running).
        self.unsettled = 0
        #: Set whenever a record is settled (``unsettled`` went down).
        self.settled = asyncio.Event()
        self.stopping = asyncio.Event()
        self._sleep = sleep or self._sleep_unless_stopping
        #: How many records ended with each outcome (``Outcome`` values).
        self.outcomes: Counter[str] = Counter()
        #: How many dead letters were produced, by reason.
        self.dead_letters = self.copies.dead_letters
        #: How many send requests were settled, by how (see the module doc): ``sent``,
        #: ``pending``, ``dead``, ``unknown``, ``cancelled``, ``deferred``, ``expired``,
        #: ``fenced``, ``refused``.
        self.requests: Counter[str] = Counter()
        #: Failed attempts that were retried.
        self.retried = 0
        #: Operator actions carried out, by outcome (``done``, ``refused``, ``failed``).
        self.actions: Counter[str] = Counter()
        #: Delivery statuses applied, by outcome (``delivered``, ``read``, ``failed``,
        #: ``unchanged``, ``unmatched``).
        self.statuses: Counter[str] = Counter()
        #: What each record is settled inside (``RecordScope``).
        self.scope: RecordScope = _unscoped

    # -- one batch ------------------------------------------------------------------------

    async def run_batch(self, records: Sequence[RawRecord]) -> None:
        """Settle every record of ``records``; return only when all are (then ack them).
        Batches may run side by side: a chat's records wait for its records of the batches
        handed over before (in the order ``run_batch`` was called), nothing else does."""
        self.unsettled += len(records)
        with self.copies.batch():
            await self._run_batch(records)

    def _settled(self, n: int = 1) -> None:
        self.unsettled -= n
        self.settled.set()

    async def _run_batch(self, records: Sequence[RawRecord]) -> None:
        deadline = time.monotonic() + self.batch_deadline
        chats, bad = self._decode(records)
        chains = self._take_places(chats)
        try:
            for raw, reason, detail, error in bad:
                await self.dead_letter(raw, reason, detail, error=error)
                self._settled()
        except BaseException:  # the batch is given up: its chats' later records wait no more
            for chat, _, _, done in chains:
                done.set_result(None)
                if self._chains.get(chat) is done:
                    del self._chains[chat]
            raise
        if len(chains) == 1:
            await self._run_chain(*chains[0], deadline)
        elif chains:
            try:
                async with asyncio.TaskGroup() as group:
                    for chain in chains:
                        group.create_task(self._run_chain(*chain, deadline))
            except BaseExceptionGroup as failed:
                raise failed.exceptions[0] from None
        await self.drain()
        try:
            await asyncio.wait_for(self.runtime.flush_receipts(), self.ack_timeout)
        except Exception as exc:  # they stay unpublished in the journal: published again
            log.warning("receipts not recorded as published yet (%s: %s)", type(exc).__name__, exc)
        await self._flush_journal(deadline)

    def _decode(
        self, records: Sequence[RawRecord]
    ) -> tuple[dict[str, list[Item]], list[tuple[RawRecord, Reason, str, Exception]]]:
        """The batch's records decoded, by chat (a chat with requests or operator actions in
        time order across the topics), and the records that could not be decoded, to be
        dead-lettered once the chats' places are taken."""
        chats: dict[str, list[Item]] = {}
        mixed: set[str] = set()  # chats with requests: their records are merged by time
        requests = self.requests_topic
        bad: list[tuple[RawRecord, Reason, str, Exception]] = []
        for raw in records:
            item: Record
            try:
                if raw.topic == requests:
                    item = decode_request(raw.value)
                    mixed.add(item.chat_id)
                elif raw.topic == self.control_topic:
                    item = decode_control(raw.value)
                    mixed.add(item.chat_id)
                elif raw.topic == self.statuses_topic:
                    item = decode_status(raw.value)
                    mixed.add(item.chat_id)
                else:
                    item = decode_inbound(raw.value)
                    if not item.id:
                        item = msgspec.structs.replace(item, id=raw.where)
            except BadRecord as exc:
                bad.append((raw, exc.reason, exc.detail, exc))
                continue
            except Exception as exc:  # the decoder failed on it: the same record fails again
                detail = f"decoding the record raised {type(exc).__name__}: {exc}"
                bad.append((raw, Reason.HANDLE_FAILED, detail, exc))
                continue
            chats.setdefault(item.chat_id, []).append((raw, item))
        for chat in mixed:
            chats[chat] = in_time_order(chats[chat])
        return chats, bad

    def _take_places(self, chats: dict[str, list[Item]]) -> list[_Chain]:
        """Each chat after its records of the batches before: the places are taken before
        anything of the batch waits, so in the order the batches were handed over."""
        loop = asyncio.get_running_loop()
        chains: list[_Chain] = []
        for chat, items in chats.items():
            done: asyncio.Future[None] = loop.create_future()
            chains.append((chat, items, self._chains.get(chat), done))
            self._chains[chat] = done
        return chains

    async def _flush_journal(self, deadline: float) -> None:
        """The journal's deferred writes (the batch's ``done`` and ``sent`` records among
        them) made durable before the batch is acked: retried with a backoff until the
        batch's deadline; a fenced producer gives the batch up, and so does a membership
        that stays unconfirmed (as for a record: an evicted worker is never confirmed while
        this batch holds its rebalance)."""
        if self._flush is None:
            return
        attempt = 0
        unconfirmed = 0
        while True:
            try:
                await self._flush()
                return
            except ProducerFencedOut as exc:
                raise BatchAbandoned(f"the journal's deferred writes were fenced: {exc}") from exc
            except MembershipUnconfirmed as exc:
                unconfirmed += 1
                if unconfirmed * UNCONFIRMED_WAIT_S > UNCONFIRMED_PATIENCE_S:
                    raise BatchAbandoned(
                        f"the journal's deferred writes: this worker's group membership stays "
                        f"unconfirmed ({exc}); it may have been evicted, so nothing of the "
                        "batch is acked"
                    ) from exc
                await self._wait(UNCONFIRMED_WAIT_S, deadline, "the journal's deferred writes")
            except JournalUnavailableError as exc:
                attempt += 1
                delay = min(0.1 * 2**attempt, 5.0)
                log.warning(
                    "the journal's deferred writes not durable yet (attempt %d, again in "
                    "%.1fs): %s",
                    attempt,
                    delay,
                    exc,
                )
                await self._wait(delay, deadline, "the journal's deferred writes")

    async def _run_chain(
        self,
        chat: str,
        items: list[Item],
        before: asyncio.Future[None] | None,
        done: asyncio.Future[None],
        deadline: float,
    ) -> None:
        """A chat's records of one batch, once its records of the batches before settled."""
        try:
            if before is not None:
                await asyncio.shield(before)
            await self._run_chat(items, deadline)
        finally:
            if not done.done():
                done.set_result(None)
            if self._chains.get(chat) is done:
                del self._chains[chat]

    async def _run_chat(self, items: list[Item], deadline: float) -> None:
        fresh = self._fresh
        for raw, item in items:
            new = fresh is not None and isinstance(item, Inbound) and fresh(raw)
            # the chat's journal partition; the record's log context and span
            with in_partition(raw.partition, item.chat_id, fresh=new), self.scope(raw, item):
                if isinstance(item, Inbound):
                    await self._settle(raw, item, deadline)
                elif isinstance(item, SendRequest):
                    await self._settle_request(raw, item, deadline)
                elif isinstance(item, DeliveryStatus):
                    await self._settle_status(raw, item, deadline)
                else:
                    await self._settle_control(raw, item, deadline)
            self._settled()

    async def _settle(self, raw: RawRecord, message: Inbound, deadline: float) -> None:
        handle, where = self.runtime.handle, raw.where
        done = await self._attempts(
            raw, message.id, lambda: handle(message, source=where), deadline
        )
        if done is None:
            return
        outcome, attempt = done
        self.outcomes[outcome] += 1
        if self._on_settled is not None and raw.timestamp is not None:
            self._on_settled(time.time() - raw.timestamp)
        # the journal copies its dead records itself when the runtime's sink takes them
        # (``KafkaReceipts.dead_letter``): one copy, however often the record comes again
        if outcome == Outcome.DEAD and not getattr(self.runtime, "dead_letters_journaled", False):
            await self.dead_letter(
                raw,
                Reason.ATTEMPTS_EXHAUSTED,
                f"the journal dead-lettered inbound {message.id!r}: inbox.max_attempts "
                "runs were charged without completing",
                attempts=attempt,
            )

    async def _settle_request(self, raw: RawRecord, request: SendRequest, deadline: float) -> None:
        done = await self._attempts(raw, request.id, lambda: self._send(request), deadline)
        if done is not None:
            self.requests[done[0]] += 1

    async def _settle_status(self, raw: RawRecord, status: DeliveryStatus, deadline: float) -> None:
        """A channel's status of a message: applied to the send it names, through the
        journal (``botmesh.state.statuses``); a status of no send is counted, not an
        error."""

        def apply() -> Awaitable[str]:
            return self.runtime.delivery_status(
                status.chat_id,
                status.message_id,
                status.status,
                channel=status.channel,
                code=status.code,
                error=status.error,
                ts=status.ts,
            )

        done = await self._attempts(raw, status.event_id, apply, deadline)
        if done is not None:
            self.statuses[done[0]] += 1

    async def _settle_control(
        self, raw: RawRecord, request: ControlRequest, deadline: float
    ) -> None:
        """An operator's action on a record of this chat, through the journal; its result
        goes to ``<prefix>.control.results`` (acked before the batch is)."""
        done = await self._attempts(raw, request.id, lambda: self._act(request), deadline)
        if done is None:
            return
        result = done[0]
        self.actions[result.outcome] += 1
        log.warning(
            "operator action %s of %r in chat %s (request %s%s): %s%s",
            request.action,
            request.target,
            request.chat_id,
            request.id,
            f" by {request.by}" if request.by else "",
            result.outcome,
            f" ({result.detail})" if result.detail else "",
        )
        try:
            ack = await self._produce(
                "control-results", request.id.encode(), encode_result(result), []
            )
        except Exception as exc:
            raise BatchAbandoned(f"cannot produce the result of {request.id!r}: {exc}") from exc
        self.copies.acks().results.add(ack)

    async def _act(self, request: ControlRequest) -> ControlResult:
        """Carry out one action; a refusal is a result, the journal's errors are raised."""
        ops = self.runtime.durability
        outcome: Literal["done", "refused"] = "done"
        detail = ""
        erasure: ErasureReceipt | None = None
        if ops is None:
            outcome, detail = "refused", "this worker runs without a journal"
            state = None
        else:
            try:
                if request.action == "retry_send":
                    await ops.retry_send(request.target)
                elif request.action == "replay_inbound":
                    await ops.replay_inbound(request.target)
                elif request.action == "restart_flow":
                    await ops.restart_flow(request.target)
                elif request.action == "drop_flow":
                    await ops.drop_flow(request.target)
                elif request.action == "cancel":
                    await ops.cancel(request.target, chat_id=request.chat_id)
                elif request.action == "erase_chat":
                    erasure = await ops.erase_chat(
                        request.target, note=request.by, dry_run=request.dry_run
                    )
                    detail = _erased(erasure)
                else:
                    await ops.outbox.discard(request.target)
            except RecordStateError as exc:
                outcome, detail = "refused", str(exc)
            state = await _state_of(ops, request)
        return ControlResult(
            id=request.id,
            chat_id=request.chat_id,
            action=request.action,
            target=request.target,
            outcome=outcome,
            state=state,
            detail=detail,
            instance=self.instance,
            ts=time.time(),
            erasure=erasure,
        )

    async def _change(self, request: SendRequest) -> Receipt:
        """An edit or a delete request (``botmesh.state.edits``); one that names a send
        that cannot be changed is a ``BadRecord`` (``not-editable``): dead-lettered with
        why, never retried."""
        key = request.idempotency_key
        try:
            if request.edit is not None:
                return await self.runtime.edit(
                    request.edit,
                    request.text or "",
                    options=request.options or None,
                    idempotency_key=key,
                )
            assert request.delete is not None
            return await self.runtime.delete(request.delete, idempotency_key=key)
        except (RecordStateError, UnsupportedContentError, ValueError) as exc:
            raise BadRecord(Reason.NOT_EDITABLE, f"{type(exc).__name__}: {exc}") from exc

    async def _send(self, request: SendRequest) -> str:
        """One attempt at a request: how it settled, or the journal's error (retried)."""
        key = request.idempotency_key
        try:
            if request.edit is not None or request.delete is not None:
                return str((await self._change(request)).state)
            receipt = await self.runtime.send(
                request.chat_id,
                request.text,
                media=request.media,
                idempotency_key=key,
                options=request.options or None,
                at=request.at,
                expires_at=request.expires_at,
            )
        except SendDeferredError:
            return "deferred"
        except SendExpiredError:  # journaled dead, its dead letter and receipt follow
            return "expired"
        except JournalFence:  # this worker's journal refused it: nothing of the batch is acked
            raise
        except FencedError:  # another holder of the send's lease delivers it
            return "fenced"
        except (DurabilityError, BadRecord):
            raise
        except Exception as exc:  # the provider's final refusal (journaled dead), or a hook
            log.warning(
                "request %s (key %s) refused: %s: %s", request.id, key, type(exc).__name__, exc
            )
            return "refused"
        return str(receipt.state)

    async def _attempts(
        self, raw: RawRecord, name: str, call: Callable[[], Awaitable[_T]], deadline: float
    ) -> tuple[_T, int] | None:
        """``call()`` until it returns (its result and the attempt); ``None`` when the record
        was dead-lettered instead (a ``BadRecord``, or the retry budget spent)."""
        attempt = unconfirmed = 0
        while True:
            attempt += 1
            try:
                result = await call()
            except BadRecord as bad:
                await self.dead_letter(raw, bad.reason, bad.detail, error=bad, attempts=attempt)
                return None
            except Exception as exc:
                self._abandon_if_lost(raw, name, exc)
                if caused_by(exc, MembershipUnconfirmed):
                    # not the record's fault: wait a little for the group to confirm this
                    # worker; an evicted worker is never confirmed while this batch holds its
                    # rebalance, so it gives the batch up (not acked) and starts afresh
                    attempt -= 1
                    unconfirmed += 1
                    if unconfirmed * UNCONFIRMED_WAIT_S > UNCONFIRMED_PATIENCE_S:
                        raise BatchAbandoned(
                            f"{self._noun(raw)} {name!r} at {raw.where}: this worker's group "
                            f"membership stays unconfirmed ({exc}); it may have been evicted "
                            "(frozen past the session timeout) and its partitions given to "
                            "another worker, so nothing of the batch is acked"
                        ) from exc
                    await self._wait(UNCONFIRMED_WAIT_S, deadline, f"{self._noun(raw)} {name!r}")
                    continue
                if await self._dead_letter_or_wait(raw, name, exc, attempt, deadline):
                    return None
                continue
            if self._owns is not None and not self._owns(raw.partition):
                # lost while it ran (this worker was evicted): what it wrote since was
                # refused as a fence, so it is not settled here (the engine may have
                # answered ``fenced``), and nothing more of the batch is written
                raise BatchAbandoned(
                    f"partition {raw.partition} was taken from this worker while "
                    f"{raw.where} was settled; its new owner handles it"
                )
            return result, attempt

    def _abandon_if_lost(self, raw: RawRecord, name: str, exc: Exception) -> None:
        """``BatchAbandoned`` when ``exc`` says the record is another worker's now: its
        partition was taken from this worker, or the journal fenced this worker's write."""
        if self._owns is not None and not self._owns(raw.partition):
            raise BatchAbandoned(
                f"partition {raw.partition} was taken from this worker while "
                f"{raw.where} failed ({type(exc).__name__}); its new owner handles it"
            ) from exc
        if caused_by(exc, JournalFence):
            # a zombie for this record (its producer fenced by a newer one, its
            # partition taken away): never retried, never dead-lettered, no record
            # of the batch acked; the worker exits before it writes anything more
            raise BatchAbandoned(
                f"{self._noun(raw)} {name!r} at {raw.where}: {exc}; another worker "
                "owns its partition now, so nothing of the batch is acked"
            ) from exc

    async def _dead_letter_or_wait(
        self, raw: RawRecord, name: str, exc: Exception, attempt: int, deadline: float
    ) -> bool:
        """After a failed attempt: dead-letters the record when trying again cannot help (it
        is too large to journal, or the bot's retry budget is spent), else waits out the
        bot's backoff before the next attempt; whether it dead-lettered the record."""
        cause = too_large(exc)
        if cause is not None:  # trying again cannot make it smaller
            detail = (
                f"the {self._noun(raw)} cannot be journaled: a record holding it is "
                f"too large for the producer ({type(cause).__name__}: {cause})"
            )
            await self.dead_letter(raw, Reason.TOO_LARGE, detail, error=exc, attempts=attempt)
            return True
        decision = self._retries.decide(exc, attempt, self._rng)
        if isinstance(decision, GiveUp):
            reason = (
                Reason.JOURNAL_UNAVAILABLE
                if isinstance(exc, JournalUnavailableError)
                else Reason.HANDLE_FAILED
            )
            detail = f"not settled in {attempt} attempts: {type(exc).__name__}: {exc}"
            await self.dead_letter(raw, reason, detail, error=exc, attempts=attempt)
            return True
        log.warning(
            "%s %s at %s failed (attempt %d): %s: %s; retrying in %.2fs",
            self._noun(raw),
            name,
            raw.where,
            attempt,
            type(exc).__name__,
            redact(str(exc)),
            decision.delay,
        )
        self.retried += 1
        await self._wait(decision.delay, deadline, f"{self._noun(raw)} {name!r}")
        return False

    def _noun(self, raw: RawRecord) -> str:
        if raw.topic == self.control_topic:
            return "operator action"
        if raw.topic == self.statuses_topic:
            return "status"
        return "request" if raw.topic == self.requests_topic else "inbound"

    async def _wait(self, delay: float, deadline: float, what: str) -> None:
        if time.monotonic() + delay > deadline:
            raise BatchAbandoned(
                f"{what} still fails after the batch retried for "
                f"{self.batch_deadline:g}s; nothing of the batch is acked"
            )
        await self._sleep(delay)

    async def _sleep_unless_stopping(self, delay: float) -> None:
        if not self.stopping.is_set():
            try:
                await asyncio.wait_for(self.stopping.wait(), delay)
            except TimeoutError:
                return
        raise BatchAbandoned(
            "the worker is stopping while a record waits for a retry; nothing of the batch "
            "is acked (the broker redelivers it)"
        )

    # -- dead letters ---------------------------------------------------------------------

    @property
    def cut(self) -> int:
        """Dead letters that went out cut (``truncated`` = ``true``), each counted once."""
        return self.copies.cut

    async def dead_letter(
        self,
        raw: RawRecord,
        reason: Reason,
        detail: str,
        *,
        error: BaseException | None = None,
        attempts: int | None = None,
    ) -> None:
        """Copy ``raw`` to its DLQ (the inbound's, or the requests' for a send request or an
        operator action) with the reason and the error in its headers."""
        await self.copies.copy(raw, self._noun(raw), reason, detail, error=error, attempts=attempts)

    async def drain(self) -> None:
        """Wait until every dead letter and action result the current batch produced so far
        is acked by the broker (``DeadLetterCopies.drain``)."""
        await self.copies.drain()


def _erased(receipt: ErasureReceipt) -> str:
    """An erasure's result in a line (the receipt has the rest)."""
    d = receipt.deleted
    what = "would delete" if receipt.dry_run else "deleted"
    return (
        f"{what} {d.total} records (inbox {d.inbox}, outbox {d.outbox}, flow {d.flow}, "
        f"turn {d.turn}, log {d.log}); {len(receipt.discarded)} sends discarded unsent, "
        f"{len(receipt.dead)} dead in the journal"
    )


async def _state_of(ops: Operations, request: ControlRequest) -> str | None:
    """The state of the record an action was about, after it (``None``: no record)."""
    if request.action == "erase_chat":
        return None if request.dry_run else "erased"
    if request.action == "replay_inbound":
        inbound = await ops.inbox.get(request.target)
        return str(inbound.state) if inbound is not None else None
    if request.action in ("restart_flow", "drop_flow"):
        flows = await ops.flows(request.target)
        return flows[0].status if flows else None
    send = await ops.outbox.get(request.target)
    return str(send.state) if send is not None else None


def _unscoped(raw: RawRecord, item: Record) -> AbstractContextManager[object]:
    return _NO_SCOPE


def in_time_order(items: list[Item]) -> list[Item]:
    """A chat's records merged by timestamp, each topic-partition's records keeping their
    (offset) order; as they are when a timestamp is missing or they come from one place."""
    sources: dict[tuple[str, int], list[Item]] = {}
    for item in items:
        raw = item[0]
        if raw.timestamp is None:
            return items
        sources.setdefault((raw.topic, raw.partition), []).append(item)
    if len(sources) < 2:
        return items
    return list(heapq.merge(*sources.values(), key=_timestamp))


def _timestamp(item: Item) -> float:
    return item[0].timestamp or 0.0
