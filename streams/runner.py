"""The inbound path without Faust: decode a batch of records (inbound messages and send
requests), settle each through the runtime, dead-letter what cannot be settled, publish
receipts.

``InboundRunner.run_batch`` takes plain :class:`RawRecord` tuples, so the Faust agent
(``streams.worker``) and tests drive the same code. It **returns only when every record of
the batch is settled**, and then the caller may ack the whole batch; it **raises**
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
``JournalUnavailableError``                 retried with the bot's inbox backoff; after the
                                            budget, DLQ reason ``journal-unavailable``
any other ``Exception``                     the same; DLQ reason ``handle-failed``
``MembershipUnconfirmed`` (the worker may   retried every 0.5 s, not charged; after 5 s the
have been evicted: ``streams.table_kv``)    batch is abandoned (the worker exits and starts
                                            afresh: an evicted worker cannot rejoin while
                                            the batch holds Faust's rebalance)
``ProducerFencedOut`` (``exactly_once``:    the batch is abandoned at once (the worker
another worker's producer fenced ours)      exits and starts afresh)
==========================================  ==========================================

The retry decision is the bot's (``runtime.inbox_retries``: ``inbox.max_attempts`` and
``inbox.backoff``). Dead letters carry the record untouched, with headers ``reason``,
``detail``, ``error.class``, ``error.message``, ``attempts``, ``source.topic``,
``source.partition``, ``source.offset``, ``dead.ts`` (credentials in URLs are masked).

**Send requests** (records of ``requests_topic``, ``<prefix>.requests``: a send from outside
a handler, ``topics.records.SendRequest``) go the same way: decoded with
``decode_request``, put in their chat's sequence, and settled by ``runtime.send(chat_id,
text, media=, options=, idempotency_key=<key, else req:<id>>)`` inside the record's journal
partition; a request delivered or produced again is answered from the outbox and sends
nothing twice. A request is settled when ``send`` returned a receipt (counted in
``requests`` by its state: ``sent``, ``pending`` (journaled, delivery left to the sweeper),
or ``dead``/``unknown`` answered from the outbox), or raised ``SendDeferredError``
(``deferred``: journaled, the sweeper retries it), ``FencedError`` (``fenced``: another
holder delivers it) or any other error that is not the journal's (``refused``: the provider
refused it for good and the send is journaled dead with its receipt, or a before-send hook
raised, as a handler's error counts as handled). A ``DurabilityError`` (the journal) is
retried and dead-lettered as for an inbound (``journal-unavailable``, ``handle-failed``); an
undecodable request goes at once, with its ``BadRecord`` reason. A request's dead letters go
to ``<prefix>.requests.dlq`` (produce role ``"requests-dlq"``), so each DLQ holds the
records of one topic and is redriven to it.

**Operator actions** (records of ``control_topic``, ``<prefix>.control``:
``topics.control.ControlRequest``, keyed by chat id) are settled in their chat's sequence too:
``retry_send``, ``replay_inbound`` or ``discard`` through ``runtime.durability`` in the
chat's journal partition; a record in a state the action does not apply to (a send already
sent, an unknown key) is refused, not retried. Each answers with a ``ControlResult`` on
``<prefix>.control.results`` (role ``"control-results"``, keyed by the request id), acked
before the batch is; an undecodable one goes to ``<prefix>.requests.dlq`` (its
``source.topic`` says where it came from).

**Dead records the journal copies itself.** When the runtime's receipts sink takes dead
letters (:meth:`KafkaReceipts.dead_letter`), the journal copies every record it marks dead
(a dead send to ``<prefix>.outbox.dlq``, a dead inbound to ``<prefix>.inbound.dlq``) and
marks the copy once acked (``state.receipts``); the runner then adds no copy of its own for
the outcome ``dead``, however often the record comes again.

**A chat's order across the two topics.** Kafka orders a partition, not two topics: the
consumer hands over inbound and request records of one batch round-robin by topic. Within a
batch the runner settles a chat's records in the order of their timestamps (producer time,
``RawRecord.timestamp``), each topic-partition's records keeping their offset order (a merge,
never a sort of one partition: clock skew between producers changes only how the two
sequences interleave). Records of different batches are settled batch after batch.

**How far a failing chat blocks others.** The records of one chat run one after the other,
in offset order; the chats of a batch run concurrently. A record that waits for a retry
holds up only the later records of its own chat *within the batch*: every other chat of the
batch is handled meanwhile. The *next* batch waits until this one is settled (at most the
inbox budget of the failing chat's records). Holding acks across batches, so later batches
could go on past a failing record, is not done on purpose: Faust acks a ``take_events``
batch as a whole, and its commit skips a hole of exactly one offset at the head of the
acked offsets (``Consumer._new_offset``), so a record left unacked behind acked ones could
be committed past, and lost at the next crash. A batch that keeps retrying for longer than
``batch_deadline`` (default 600 s, under Faust's 1000 s max poll interval), or is still
retrying when the worker stops, is abandoned: :class:`BatchAbandoned`, nothing acked, the
broker redelivers it and the journal answers what was already settled as duplicates.

Receipts: the runtime publishes every settled send through :class:`KafkaReceipts` (a
``state.receipts.ReceiptSink``); at the end of each batch the runner waits for the broker's
acks and has them recorded in the journal (``runtime.flush_receipts()``). A receipt that was not
acked stays unpublished in the journal and is published again by the runtime's sweeper:
receipts are at least once, never lost.
"""

from __future__ import annotations

import asyncio
import heapq
import logging
import random
import re
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol, TypeVar, runtime_checkable

import msgspec

from state.backoff import GiveUp, Retries
from state.errors import (
    BadRecord,
    DurabilityError,
    FencedError,
    JournalUnavailableError,
    Reason,
    RecordStateError,
    SendDeferredError,
    caused_by,
)
from state.inbox import Outcome
from state.kv import DurableKv
from state.messages import Inbound, Media, Receipt
from state.operations import Operations
from state.ports import Provider
from state.receipts import ReceiptSink
from state.records import Json
from streams.retry_tiers import parked_record
from streams.table_kv import MembershipUnconfirmed, ProducerFencedOut, in_partition
from topics.control import ControlRequest, ControlResult, decode_control, encode_result
from topics.dead_letters import inbound_dead_letter, outbox_dead_letter
from topics.records import SendRequest, chat_key, decode_inbound, decode_request, encode_receipt

__all__ = [
    "BatchAbandoned",
    "BotDefinition",
    "InboundRunner",
    "KafkaReceipts",
    "RawRecord",
    "RuntimeLike",
    "in_time_order",
]

log = logging.getLogger("botmesh.streams")

Headers = list[tuple[str, bytes]]
#: ``produce(role, key, value, headers)`` hands a record to the producer (role ``"sent"``,
#: ``"dlq"``, ``"requests-dlq"``, ``"outbox-dlq"``, ``"control-results"`` or
#: ``"retry:<tier>"``) and returns an awaitable that resolves on the broker's ack.
Produce = Callable[[str, bytes | None, bytes, Headers], Awaitable[Awaitable[Any]]]
#: What one record of a batch is, once decoded.
Item = tuple["RawRecord", Inbound | SendRequest | ControlRequest]
_T = TypeVar("_T")
DETAIL_MAX = 400
#: Seconds between attempts at a record refused because the worker's group membership is
#: unconfirmed (``streams.table_kv.MembershipUnconfirmed``; not charged as attempts).
UNCONFIRMED_WAIT_S = 0.5
#: How long a record waits for the group to confirm the worker before its batch is given up.
UNCONFIRMED_PATIENCE_S = 5.0
_CREDENTIALS = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*://)[^/@\s]+@")


class RuntimeLike(Protocol):
    """What the worker needs from a bound bot (``botmesh.Runtime`` satisfies it)."""

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    async def handle(self, message: Inbound, *, source: str | None = None) -> Outcome: ...

    async def flush_receipts(self) -> int: ...

    async def send(
        self,
        chat_id: str,
        text: str | None = None,
        *,
        media: Media | None = ...,
        idempotency_key: str | None = ...,
        options: Mapping[str, Any] | None = ...,
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
        *,
        instance_id: str | None = None,
        receipts: ReceiptSink | None = None,
    ) -> RuntimeLike: ...


@dataclass(frozen=True, slots=True)
class RawRecord:
    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: Sequence[tuple[str, bytes]] = ()
    #: The record's timestamp in seconds (Kafka's, producer time), when known: it orders a
    #: chat's inbound and request records of one batch.
    timestamp: float | None = None

    @property
    def where(self) -> str:
        return f"{self.topic}:{self.partition}:{self.offset}"


class BatchAbandoned(Exception):
    """A batch cannot be settled now (the worker stops, a retry would pass the batch
    deadline, a dead letter was refused): ack nothing of it."""


class KafkaReceipts:
    """The runtime's ``ReceiptSink``: each receipt goes to ``<prefix>.sent``, keyed by
    chat id; ``publish`` returns the broker-ack future (the producer uses acks=all)."""

    def __init__(self, produce: Produce) -> None:
        self._produce = produce
        self.published = 0
        self.dead_letters = 0
        self.parked = 0

    async def publish(self, receipt: Receipt) -> Awaitable[Any]:
        ack = await self._produce("sent", chat_key(receipt.chat_id), encode_receipt(receipt), [])
        self.published += 1
        return ack

    async def park(self, value: Json, retry_at: float) -> Awaitable[Any]:
        """A failed send parked on its retry tier (``streams.retry_tiers``) until
        ``retry_at``; the broker-ack future."""
        tier, key, body, headers = parked_record(value, retry_at)
        ack = await self._produce(f"retry:{tier}", key, body, headers)
        self.parked += 1
        return ack

    async def dead_letter(self, kind: str, value: Json, source: str | None) -> Awaitable[Any]:
        """The journal's dead record ``value`` (``kind``: ``"outbox"``, a dead send, or
        ``"inbound"``) copied to ``<prefix>.outbox.dlq`` / ``<prefix>.inbound.dlq`` with the
        headers of ``topics.dead_letters``; the broker-ack future."""
        if kind == "outbox":
            key, body, headers = outbox_dead_letter(value, source)
            role = "outbox-dlq"
        else:
            key, body, headers = inbound_dead_letter(value, source)
            role = "dlq"
        ack = await self._produce(role, key, body, headers)
        self.dead_letters += 1
        return ack


def redact(text: str) -> str:
    """``scheme://user:secret@host`` -> ``scheme://***@host``."""
    return _CREDENTIALS.sub(r"\1***@", text)


class InboundRunner:
    """Settles batches of inbound records through ``runtime.handle``, and of send requests
    through ``runtime.send`` (see the module doc).

    ``produce`` hands dead letters to the producer. ``stopping`` (an event the worker sets
    when it stops) ends retry waits: the batch is abandoned rather than acked unsettled.
    ``sleep(delay)`` waits between attempts (tests pass their own; the default ends early,
    raising ``BatchAbandoned``, when ``stopping`` is set). ``owns(partition)`` says whether
    this worker still owns a record's partition: a record that fails on a partition taken
    from it is neither retried nor dead-lettered here (``BatchAbandoned``). Records of
    ``requests_topic`` are send requests (see the module doc).
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
        instance: str = "",
    ) -> None:
        self.runtime = runtime
        self.requests_topic = requests_topic
        self.control_topic = control_topic
        self.instance = instance
        self._owns = owns
        self._produce = produce
        self._retries = runtime.inbox_retries
        self.ack_timeout = ack_timeout
        self.batch_deadline = batch_deadline
        self._rng = rng or random.Random()
        self._pending: set[Awaitable[Any]] = set()
        self.stopping = asyncio.Event()
        self._sleep = sleep or self._sleep_unless_stopping
        #: How many records ended with each outcome (``Outcome`` values).
        self.outcomes: Counter[str] = Counter()
        #: How many dead letters were produced, by reason.
        self.dead_letters: Counter[str] = Counter()
        #: How many send requests were settled, by how (see the module doc): ``sent``,
        #: ``pending``, ``dead``, ``unknown``, ``deferred``, ``fenced``, ``refused``.
        self.requests: Counter[str] = Counter()
        #: Failed attempts that were retried.
        self.retried = 0
        #: Operator actions carried out, by outcome (``done``, ``refused``, ``failed``).
        self.actions: Counter[str] = Counter()

    # -- one batch ------------------------------------------------------------------------

    async def run_batch(self, records: Sequence[RawRecord]) -> None:
        """Settle every record of ``records``; return only when all are (then ack them)."""
        deadline = time.monotonic() + self.batch_deadline
        chats: dict[str, list[Item]] = {}
        mixed: set[str] = set()  # chats with requests: their records are merged by time
        requests = self.requests_topic
        for raw in records:
            item: Inbound | SendRequest | ControlRequest
            try:
                if raw.topic == requests:
                    item = decode_request(raw.value)
                    mixed.add(item.chat_id)
                elif raw.topic == self.control_topic:
                    item = decode_control(raw.value)
                    mixed.add(item.chat_id)
                else:
                    item = decode_inbound(raw.value)
                    if not item.id:
                        item = msgspec.structs.replace(item, id=raw.where)
            except BadRecord as bad:
                await self.dead_letter(raw, bad.reason, bad.detail, error=bad)
                continue
            chats.setdefault(item.chat_id, []).append((raw, item))
        for chat in mixed:
            chats[chat] = in_time_order(chats[chat])
        if len(chats) == 1:
            await self._run_chat(next(iter(chats.values())), deadline)
        elif chats:
            try:
                async with asyncio.TaskGroup() as group:
                    for items in chats.values():
                        group.create_task(self._run_chat(items, deadline))
            except BaseExceptionGroup as failed:
                raise failed.exceptions[0] from None
        await self.drain()
        try:
            await asyncio.wait_for(self.runtime.flush_receipts(), self.ack_timeout)
        except Exception as exc:  # they stay unpublished in the journal: published again
            log.warning("receipts not recorded as published yet (%s: %s)", type(exc).__name__, exc)

    async def _run_chat(self, items: list[Item], deadline: float) -> None:
        for raw, item in items:
            with in_partition(raw.partition):  # the chat's journal partition
                if isinstance(item, Inbound):
                    await self._settle(raw, item, deadline)
                elif isinstance(item, SendRequest):
                    await self._settle_request(raw, item, deadline)
                else:
                    await self._settle_control(raw, item, deadline)

    async def _settle(self, raw: RawRecord, message: Inbound, deadline: float) -> None:
        handle, where = self.runtime.handle, raw.where
        done = await self._attempts(
            raw, message.id, lambda: handle(message, source=where), deadline
        )
        if done is None:
            return
        outcome, attempt = done
        self.outcomes[outcome] += 1
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
        self._pending.add(ack)

    async def _act(self, request: ControlRequest) -> ControlResult:
        """Carry out one action; a refusal is a result, the journal's errors are raised."""
        ops = self.runtime.durability
        outcome: Literal["done", "refused"] = "done"
        detail = ""
        if ops is None:
            outcome, detail = "refused", "this worker runs without a journal"
            state = None
        else:
            try:
                if request.action == "retry_send":
                    await ops.retry_send(request.target)
                elif request.action == "replay_inbound":
                    await ops.replay_inbound(request.target)
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
        )

    async def _send(self, request: SendRequest) -> str:
        """One attempt at a request: how it settled, or the journal's error (retried)."""
        key = request.idempotency_key
        try:
            receipt = await self.runtime.send(
                request.chat_id,
                request.text,
                media=request.media,
                idempotency_key=key,
                options=request.options or None,
            )
        except SendDeferredError:
            return "deferred"
        except FencedError:
            return "fenced"
        except DurabilityError:
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
                return await call(), attempt
            except BadRecord as bad:
                await self.dead_letter(raw, bad.reason, bad.detail, error=bad, attempts=attempt)
                return None
            except Exception as exc:
                if self._owns is not None and not self._owns(raw.partition):
                    raise BatchAbandoned(
                        f"partition {raw.partition} was taken from this worker while "
                        f"{raw.where} failed ({type(exc).__name__}); its new owner handles it"
                    ) from exc
                if caused_by(exc, ProducerFencedOut):
                    raise BatchAbandoned(
                        f"{self._noun(raw)} {name!r} at {raw.where}: {exc}; another worker "
                        "owns its partition now, so nothing of the batch is acked"
                    ) from exc
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
                decision = self._retries.decide(exc, attempt, self._rng)
                if isinstance(decision, GiveUp):
                    reason = (
                        Reason.JOURNAL_UNAVAILABLE
                        if isinstance(exc, JournalUnavailableError)
                        else Reason.HANDLE_FAILED
                    )
                    detail = f"not settled in {attempt} attempts: {type(exc).__name__}: {exc}"
                    await self.dead_letter(raw, reason, detail, error=exc, attempts=attempt)
                    return None
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

    def _noun(self, raw: RawRecord) -> str:
        if raw.topic == self.control_topic:
            return "operator action"
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

    async def dead_letter(
        self,
        raw: RawRecord,
        reason: Reason,
        detail: str,
        *,
        error: BaseException | None = None,
        attempts: int | None = None,
    ) -> None:
        """Copy ``raw`` to its DLQ (the inbound's, or the requests' for a send request) with
        the reason and the error in its headers."""
        detail = redact(detail)[:DETAIL_MAX]
        headers: Headers = [("reason", str(reason).encode()), ("detail", detail.encode())]
        if error is not None:
            headers.append(("error.class", type(error).__name__.encode()))
            headers.append(("error.message", redact(str(error))[:DETAIL_MAX].encode()))
        if attempts is not None:
            headers.append(("attempts", str(attempts).encode()))
        headers += [
            ("source.topic", raw.topic.encode()),
            ("source.partition", str(raw.partition).encode()),
            ("source.offset", str(raw.offset).encode()),
            ("dead.ts", f"{time.time():.3f}".encode()),
        ]
        ours = {k for k, _ in headers}
        headers += [(k, v) for k, v in raw.headers if k not in ours]
        noun = self._noun(raw)
        log.warning("%s %s -> DLQ (%s: %s)", noun, raw.where, reason, detail)
        role = "dlq" if noun == "inbound" else "requests-dlq"
        try:
            ack = await self._produce(role, raw.key, raw.value or b"", headers)
        except Exception as exc:
            raise BatchAbandoned(f"cannot produce to the {noun} DLQ: {exc}") from exc
        self._pending.add(ack)
        self.dead_letters[reason] += 1

    async def drain(self) -> None:
        """Wait until every dead letter produced so far is acked by the broker."""
        while self._pending:
            batch, self._pending = self._pending, set()
            try:
                await asyncio.wait_for(asyncio.gather(*batch), self.ack_timeout)
            except Exception as exc:
                raise BatchAbandoned(f"a dead letter was not acked by the broker: {exc}") from exc


async def _state_of(ops: Operations, request: ControlRequest) -> str | None:
    """The state of the record an action was about, after it (``None``: no record)."""
    if request.action == "replay_inbound":
        inbound = await ops.inbox.get(request.target)
        return str(inbound.state) if inbound is not None else None
    send = await ops.outbox.get(request.target)
    return str(send.state) if send is not None else None


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
