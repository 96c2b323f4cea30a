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
``ProducerFencedOut`` (``exactly_once``:    the batch is abandoned at once (the worker
another worker's producer fenced ours)      exits and starts afresh)
==========================================  ==========================================

The retry decision is the bot's (``runtime.inbox_retries``: ``inbox.max_attempts`` and
``inbox.backoff``). Dead letters carry the record untouched, with headers ``reason``,
``detail``, ``error.class``, ``error.message``, ``attempts``, ``source.topic``,
``source.partition``, ``source.offset``, ``dead.ts`` (credentials in URLs are masked).

**Dead letters too large to copy.** The producer refuses any record over its request limit
(``max_request_size``: librdkafka's ``message.max.bytes``, 1,000,000 bytes), and a dead
letter is the
record plus our headers. So a record the broker took can be too large to copy: the broker's
default ``max.message.bytes`` (1,048,588) takes a value of 1,048,500 bytes, which with
the headers is over the limit. Before it produces a dead letter the runner works out its
size (:func:`record_size`) as a record alone in a batch (key, value, headers, the record's
overhead and its batch's header, every length the batch decides at its longest);
librdkafka counts a record smaller (its check of ``message.max.bytes``, tested with 2.16),
so a record within the limit by this count passes its check. When it is over the
limit less 16 KiB (``CUT_MARGIN``), the copy is cut to
that size: our headers stay whole and two are added, ``truncated`` = ``true`` and
``original.size`` = the value's length in bytes; the record's own headers stay while they
fit in a quarter of the room (the others are left out and counted in ``headers.dropped``);
the key stays whole up to a quarter of the room (a longer key is cut and its length put in
``original.key.size``); the value keeps its first bytes, as many as fit. The whole record
stays where it was: ``source.topic``, ``source.partition`` and ``source.offset`` say where
to read it (``kcat -C -b <broker> -t <topic> -p <partition> -o <offset> -c 1``) until the topic's
retention deletes it. Should the producer or the broker still refuse a copy as too large
(the DLQ topic's ``max.message.bytes`` under the producer's limit), it is produced again
cut to a sixteenth, then with no value and none of the record's own headers; only a copy
refused at that size, or for another reason, gives the batch up. A record whose headers the
consumer cannot hand over (a header key that is not UTF-8) is copied with a header saying
they were dropped (``botmesh.streams.worker.loop.UNREADABLE_HEADERS``). So no record,
however large or odd (no key, no value, binary bytes, JSON nested too deeply, a huge key or
header, a header key that is not UTF-8), stops the worker or holds up its partition. A
record larger than the consumer's fetch size (1 MiB a partition; a topic whose
``max.message.bytes`` was raised) is fetched all the same: the broker hands over a
partition's first batch whole whatever the fetch size (seen with a 3 MB record, cut here
like any other).

**Send requests** (records of ``requests_topic``, ``<prefix>.requests``: a send from outside
a handler, ``botmesh.topics.records.SendRequest``) go the same way: decoded with
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
``botmesh.topics.control.ControlRequest``, keyed by chat id) are settled in their chat's sequence
too:
``retry_send``, ``replay_inbound``, ``discard``, ``restart_flow``, ``drop_flow`` or
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
receipts are at least once, never lost.
"""

from __future__ import annotations

import asyncio
import dataclasses
import heapq
import logging
import random
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, TypeVar, runtime_checkable

import msgspec
from confluent_kafka import KafkaError, KafkaException

from botmesh.state.backoff import GiveUp, Retries
from botmesh.state.erasure import ErasureReceipt
from botmesh.state.errors import (
    BadRecord,
    DurabilityError,
    FencedError,
    JournalUnavailableError,
    Reason,
    RecordStateError,
    SendDeferredError,
    caused_by,
)
from botmesh.state.inbox import Outcome
from botmesh.state.kv import DurableKv
from botmesh.state.messages import Inbound, Media, Receipt
from botmesh.state.metrics import Timings
from botmesh.state.operations import Operations
from botmesh.state.ports import Provider
from botmesh.state.receipts import ReceiptSink
from botmesh.state.records import Json
from botmesh.streams.retry_tiers import parked_record
from botmesh.streams.table_kv import MembershipUnconfirmed, ProducerFencedOut, in_partition
from botmesh.topics.control import ControlRequest, ControlResult, decode_control, encode_result
from botmesh.topics.dead_letters import DETAIL_MAX, inbound_dead_letter, outbox_dead_letter, redact
from botmesh.topics.records import (
    SendRequest,
    chat_key,
    decode_inbound,
    decode_request,
    encode_receipt,
)

__all__ = [
    "BatchAbandoned",
    "BotDefinition",
    "InboundRunner",
    "KafkaReceipts",
    "RawRecord",
    "RecordScope",
    "RuntimeLike",
    "in_time_order",
    "record_size",
]

log = logging.getLogger("botmesh.streams")

Headers = list[tuple[str, bytes]]
#: ``produce(role, key, value, headers)`` hands a record to the producer (role ``"sent"``,
#: ``"dlq"``, ``"requests-dlq"``, ``"outbox-dlq"``, ``"control-results"`` or
#: ``"retry:<tier>"``) and returns an awaitable that resolves on the broker's ack.
Produce = Callable[[str, bytes | None, bytes, Headers], Awaitable[Awaitable[Any]]]
#: What one record of a batch is, once decoded.
Item = tuple["RawRecord", Inbound | SendRequest | ControlRequest]
#: What the runner settles each record inside, entered once a record: ``scope(raw, item)``
#: (the worker's command line gives ``botmesh.logs.record_scope``: the record's log context
#: and, with tracing on, its span). The default does nothing.
RecordScope = Callable[
    ["RawRecord", Inbound | SendRequest | ControlRequest], AbstractContextManager[object]
]
_NO_SCOPE = nullcontext()
#: The W3C headers (``traceparent``) of the record being settled, set by its span when
#: tracing is on (``botmesh.tracing``): the receipts published meanwhile carry them.
TRACE_HEADERS: ContextVar[tuple[tuple[str, bytes], ...]] = ContextVar(
    "botmesh_trace_headers", default=()
)
_T = TypeVar("_T")
#: Seconds between attempts at a record refused because the worker's group membership is
#: unconfirmed (``botmesh.streams.table_kv.MembershipUnconfirmed``; not charged as attempts).
UNCONFIRMED_WAIT_S = 0.5
#: How long a record waits for the group to confirm the worker before its batch is given up.
UNCONFIRMED_PATIENCE_S = 5.0
#: The largest record the worker's producer sends (key, value, headers and the overhead of
#: its batch together, :func:`record_size`): librdkafka's default ``message.max.bytes``.
MAX_REQUEST_SIZE = 1_000_000
#: Bytes a cut dead letter leaves free under that limit.
CUT_MARGIN = 16 * 1024
#: A cut dead letter keeps a key up to this long whatever its budget (a longer one is cut).
KEY_FLOOR = 256
#: librdkafka's codes for a record too large (a ``KafkaError`` carried by a
#: ``KafkaException``): ``MSG_SIZE_TOO_LARGE`` from its own check before sending (over
#: ``message.max.bytes``) and from the broker (over the topic's ``max.message.bytes``; the
#: delivery report carries it), ``RECORD_LIST_TOO_LARGE`` from the broker for a batch.
_RDKAFKA_TOO_LARGE = frozenset({KafkaError.MSG_SIZE_TOO_LARGE, KafkaError.RECORD_LIST_TOO_LARGE})
#: Kafka's record batch (format v2, magic 2): the batch's header (base offset 8, length 4,
#: leader epoch 4, magic 1, CRC 4, attributes 2, last offset delta 4, first and max
#: timestamps 8 + 8, producer id 8, producer epoch 2, base sequence 4, record count 4).
BATCH_HEADER = 61
#: A record's own fields besides its key, value and headers, each varint at its longest:
#: its length (5), attributes (1), timestamp delta (10), offset delta (5).
RECORD_OVERHEAD = 21


class RuntimeLike(Protocol):
    """What the worker needs from a bound bot (``botmesh.Runtime`` satisfies it)."""

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    async def handle(self, message: Inbound, *, source: str | None = None) -> Outcome: ...

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
        timings: Timings | None = None,
        fallbacks: Mapping[str, Provider] | None = None,
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


#: A dead letter's kind (a label of ``botmesh_dead_letters_total``) by the record's noun.
_KINDS = {"operator action": "control"}


class KafkaReceipts:
    """The runtime's ``ReceiptSink``: each receipt goes to ``<prefix>.sent``, keyed by
    chat id; ``publish`` returns the broker-ack future (the producer uses acks=all)."""

    def __init__(self, produce: Produce, letters: Counter[tuple[str, str]] | None = None) -> None:
        self._produce = produce
        self.published = 0
        self.dead_letters = 0
        self.parked = 0
        #: Dead letters produced, by (kind, reason) (shared with the runner's).
        self.letters: Counter[tuple[str, str]] = Counter() if letters is None else letters

    async def publish(self, receipt: Receipt) -> Awaitable[Any]:
        key, value = chat_key(receipt.chat_id), encode_receipt(receipt)
        ack = await self._produce("sent", key, value, [*TRACE_HEADERS.get()])
        self.published += 1
        return ack

    async def park(self, value: Json, retry_at: float) -> Awaitable[Any]:
        """A failed send parked on its retry tier (``botmesh.streams.retry_tiers``) until
        ``retry_at``; the broker-ack future."""
        tier, key, body, headers = parked_record(value, retry_at)
        ack = await self._produce(f"retry:{tier}", key, body, headers)
        self.parked += 1
        return ack

    async def dead_letter(self, kind: str, value: Json, source: str | None) -> Awaitable[Any]:
        """The journal's dead record ``value`` (``kind``: ``"outbox"``, a dead send, or
        ``"inbound"``) copied to ``<prefix>.outbox.dlq`` / ``<prefix>.inbound.dlq`` with the
        headers of ``botmesh.topics.dead_letters``; the broker-ack future."""
        if kind == "outbox":
            key, body, headers = outbox_dead_letter(value, source)
            role = "outbox-dlq"
        else:
            key, body, headers = inbound_dead_letter(value, source)
            role = "dlq"
        ack = await self._produce(role, key, body, headers)
        self.dead_letters += 1
        error = value.get("error")
        reason = error.get("reason") if isinstance(error, dict) else None
        self.letters[(kind, str(reason or "unknown"))] += 1
        return ack


def record_size(key: bytes | None, value: bytes | None, headers: Headers) -> int:
    """The size of a record alone in a batch (Kafka's record batch v2): the batch's header,
    the record's fields whose varints depend on the batch at their longest, and its key,
    value and headers each with its length's varint: an upper bound of what librdkafka
    checks against ``message.max.bytes``; a ``None`` key, value or header value takes one
    byte (length -1)."""
    size = BATCH_HEADER + RECORD_OVERHEAD + _field(key) + _field(value)
    size += _varint_size(len(headers))
    for name, data in headers:
        size += _field(name.encode()) + _field(data)
    return size


def _field(data: bytes | None) -> int:
    """A length-prefixed field: its length's varint and its bytes (``None``: 1 byte)."""
    return 1 if data is None else _varint_size(len(data)) + len(data)


def _varint_size(n: int) -> int:
    """Bytes of ``n`` as a zigzag varint (Kafka's record fields)."""
    zigzag = (n << 1) ^ (n >> 63)
    size = 1
    while zigzag > 0x7F:
        zigzag >>= 7
        size += 1
    return size


def too_large(exc: BaseException) -> BaseException | None:
    """The error that says a record is too large (the producer's check or the broker's):
    ``exc`` itself or what it was raised from (the journal's ``JournalUnavailableError``;
    8 deep, as ``find_cause``); ``None`` when there is none."""
    seen: BaseException | None = exc
    for _ in range(8):
        if seen is None:
            return None
        if _says_too_large(seen):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


def _says_too_large(exc: BaseException) -> bool:
    if isinstance(exc, KafkaException):
        err = exc.args[0] if exc.args else None
        return isinstance(err, KafkaError) and err.code() in _RDKAFKA_TOO_LARGE
    return False


def _encodable(name: str) -> str:
    """A header key the producer can encode: bytes that were not UTF-8 (kept as surrogate
    escapes) become U+FFFD."""
    try:
        name.encode()
    except UnicodeEncodeError:
        try:
            raw = name.encode("utf-8", "surrogateescape")
        except UnicodeEncodeError:
            raw = name.encode("utf-8", "replace")
        return raw.decode("utf-8", "replace")
    return name


@dataclass(frozen=True, slots=True)
class _Letter:
    """A dead letter to produce: the record, our headers, the record's own headers, and the
    size it must fit in (``None``: whole, as long as it fits the producer's limit)."""

    role: str
    raw: RawRecord
    ours: Headers
    own: Headers
    budget: int | None = None
    #: Counted in ``InboundRunner.cut`` already.
    counted: bool = False


def cut_letter(
    key: bytes | None, value: bytes, ours: Headers, own: Headers, budget: int
) -> tuple[bytes | None, bytes, Headers]:
    """A dead letter cut to fit in ``budget`` bytes (:func:`record_size`): our headers
    whole, then ``truncated`` = ``true`` and ``original.size`` = the value's length; the
    record's own headers while they fit in a quarter of the budget (those left out counted
    in ``headers.dropped``); the key whole up to a quarter of the budget (at least
    ``KEY_FLOOR`` bytes; a longer one is cut, its length in ``original.key.size``); the
    value's first bytes in what is left (none when nothing is)."""
    marks: Headers = [("truncated", b"true"), ("original.size", str(len(value)).encode())]
    room = budget // 4
    kept: Headers = []
    ours_too = {"truncated", "original.size", "original.key.size", "headers.dropped"}
    own = [(name, data) for name, data in own if name not in ours_too]
    for name, data in own:
        size = len(name.encode()) + len(data) + 10  # two varints at their longest
        if size <= room:
            kept.append((name, data))
            room -= size
    if len(kept) < len(own):
        marks.append(("headers.dropped", str(len(own) - len(kept)).encode()))
    longest = max(budget // 4, KEY_FLOOR)
    if key is not None and len(key) > longest:
        marks.append(("original.key.size", str(len(key)).encode()))
        key = key[:longest]
    headers = ours + marks + kept
    room = budget - record_size(key, b"", headers) - 5  # the value's length varint
    return key, value[: max(room, 0)], headers


@dataclass(slots=True)
class _Acks:
    """What a batch produced that the broker must ack before the batch is: dead letters
    (with what to cut if one is refused as too large) and operator actions' results."""

    letters: dict[Awaitable[Any], _Letter] = field(default_factory=dict)
    results: set[Awaitable[Any]] = field(default_factory=set)


#: The acks of the batch the current task works for (``run_batch`` sets it): batches run
#: side by side, and each waits for its own.
_BATCH_ACKS: ContextVar[_Acks | None] = ContextVar("botmesh_batch_acks", default=None)


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
        max_request_size: int = MAX_REQUEST_SIZE,
        flush: Callable[[], Awaitable[None]] | None = None,
        on_settled: Callable[[float], None] | None = None,
        letters: Counter[tuple[str, str]] | None = None,
    ) -> None:
        self.runtime = runtime
        self._flush = flush
        #: Given the seconds from an inbound record's timestamp to its settling.
        self._on_settled = on_settled
        #: Dead letters produced, by (kind, reason): ``inbound``, ``request`` or
        #: ``control`` here, ``outbox`` and ``inbound`` from the journal (``KafkaReceipts``).
        self.letters: Counter[tuple[str, str]] = Counter() if letters is None else letters
        self.max_request_size = max_request_size
        self.requests_topic = requests_topic
        self.control_topic = control_topic
        self.instance = instance
        self._owns = owns
        self._produce = produce
        self._retries = runtime.inbox_retries
        self.ack_timeout = ack_timeout
        self.batch_deadline = batch_deadline
        self._rng = rng or random.Random()
        #: Dead letters and results produced outside a batch (``dead_letter`` called
        #: directly), not acked yet.
        self._unbatched = _Acks()
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
        self.dead_letters: Counter[str] = Counter()
        #: How many send requests were settled, by how (see the module doc): ``sent``,
        #: ``pending``, ``dead``, ``unknown``, ``deferred``, ``fenced``, ``refused``.
        self.requests: Counter[str] = Counter()
        #: Failed attempts that were retried.
        self.retried = 0
        #: Operator actions carried out, by outcome (``done``, ``refused``, ``failed``).
        self.actions: Counter[str] = Counter()
        #: Dead letters that went out cut (``truncated`` = ``true``), each counted once.
        self.cut = 0
        #: What each record is settled inside (``RecordScope``).
        self.scope: RecordScope = _unscoped

    # -- one batch ------------------------------------------------------------------------

    async def run_batch(self, records: Sequence[RawRecord]) -> None:
        """Settle every record of ``records``; return only when all are (then ack them).
        Batches may run side by side: a chat's records wait for its records of the batches
        handed over before (in the order ``run_batch`` was called), nothing else does."""
        self.unsettled += len(records)
        token = _BATCH_ACKS.set(_Acks())
        try:
            await self._run_batch(records)
        finally:
            _BATCH_ACKS.reset(token)

    def _settled(self, n: int = 1) -> None:
        self.unsettled -= n
        self.settled.set()

    async def _run_batch(self, records: Sequence[RawRecord]) -> None:
        deadline = time.monotonic() + self.batch_deadline
        chats: dict[str, list[Item]] = {}
        mixed: set[str] = set()  # chats with requests: their records are merged by time
        requests = self.requests_topic
        #: undecodable records, dead-lettered once the chats' places are taken
        bad: list[tuple[RawRecord, Reason, str, Exception]] = []
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
        # each chat after its records of the batches before: the places are taken before
        # anything here waits, so in the order the batches were handed over
        loop = asyncio.get_running_loop()
        chains = []
        for chat, items in chats.items():
            done: asyncio.Future[None] = loop.create_future()
            chains.append((chat, items, self._chains.get(chat), done))
            self._chains[chat] = done
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
        for raw, item in items:
            # the chat's journal partition; the record's log context and span
            with in_partition(raw.partition, item.chat_id), self.scope(raw, item):
                if isinstance(item, Inbound):
                    await self._settle(raw, item, deadline)
                elif isinstance(item, SendRequest):
                    await self._settle_request(raw, item, deadline)
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
        self._acks().results.add(ack)

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
                cause = too_large(exc)
                if cause is not None:  # trying again cannot make it smaller
                    detail = (
                        f"the {self._noun(raw)} cannot be journaled: a record holding it is "
                        f"too large for the producer ({type(cause).__name__}: {cause})"
                    )
                    await self.dead_letter(
                        raw, Reason.TOO_LARGE, detail, error=exc, attempts=attempt
                    )
                    return None
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
        own = [(_encodable(k), v) for k, v in raw.headers if k not in ours]
        noun = self._noun(raw)
        log.warning("%s %s -> DLQ (%s: %s)", noun, raw.where, reason, detail)
        role = "dlq" if noun == "inbound" else "requests-dlq"
        await self._produce_letter(_Letter(role, raw, headers, own))
        self.dead_letters[reason] += 1
        self.letters[(_KINDS.get(noun, noun), str(reason))] += 1

    async def _produce_letter(self, letter: _Letter) -> None:
        """Hand ``letter`` to the producer: whole when it fits under ``max_request_size``
        (less ``CUT_MARGIN``), else cut to that; a producer that refuses it as too large
        gets it cut smaller (:meth:`_smaller`). Its ack is awaited in :meth:`drain`."""
        raw, value = letter.raw, letter.raw.value or b""
        while True:
            budget = letter.budget
            whole = letter.ours + letter.own
            if budget is None and record_size(raw.key, value, whole) > self._cut_to():
                budget = self._cut_to()
                letter = dataclasses.replace(letter, budget=budget)
            if budget is None:
                key, data, headers = raw.key, value, whole
            else:
                key, data, headers = cut_letter(raw.key, value, letter.ours, letter.own, budget)
                log.warning(
                    "%s %s: its dead letter is cut to %d of %d value bytes to fit in %d bytes "
                    "(headers truncated, original.size; the original stays at its source offset)",
                    self._noun(raw),
                    raw.where,
                    len(data),
                    len(value),
                    budget,
                )
            try:
                ack = await self._produce(letter.role, key, data, headers)
            except Exception as exc:
                smaller = self._smaller(letter, exc)
                if smaller is None:
                    raise BatchAbandoned(
                        f"cannot produce to the {self._noun(raw)} DLQ: {exc}"
                    ) from exc
                letter = smaller
                continue
            if budget is not None and not letter.counted:
                self.cut += 1
                letter = dataclasses.replace(letter, counted=True)
            self._acks().letters[ack] = letter
            return

    def _cut_to(self) -> int:
        return max(self.max_request_size - CUT_MARGIN, 0)

    def _smaller(self, letter: _Letter, exc: BaseException) -> _Letter | None:
        """The same dead letter cut smaller after ``exc`` refused it as too large (a topic
        whose ``max.message.bytes`` is under the producer's limit): to a sixteenth, then to
        its headers alone (no value, none of the record's own headers); ``None`` when
        ``exc`` is another error or nothing is left to cut."""
        if too_large(exc) is None or letter.budget == 0:
            return None
        budget = self._cut_to() if letter.budget is None else letter.budget
        smaller = budget // 16 if budget > 64 * 1024 else 0
        log.warning(
            "%s %s: its dead letter was refused as too large (%s: %s); cutting it to %d bytes",
            self._noun(letter.raw),
            letter.raw.where,
            type(exc).__name__,
            exc,
            smaller,
        )
        return dataclasses.replace(letter, budget=smaller)

    def _acks(self) -> _Acks:
        return _BATCH_ACKS.get() or self._unbatched

    async def drain(self) -> None:
        """Wait until every dead letter and action result the current batch produced so far
        (outside a batch: produced outside any) is acked by the broker (a dead letter it
        refused as too large is produced again, cut smaller, and waited for too)."""
        mine = self._acks()
        if mine.results:
            acks, mine.results = mine.results, set()
            try:
                await asyncio.wait_for(asyncio.gather(*acks), self.ack_timeout)
            except Exception as exc:
                raise BatchAbandoned(f"an action's result was not acked: {exc}") from exc
        while mine.letters:
            batch, mine.letters = mine.letters, {}
            try:
                results = await asyncio.wait_for(
                    asyncio.gather(*batch, return_exceptions=True), self.ack_timeout
                )
            except Exception as exc:
                raise BatchAbandoned(f"a dead letter was not acked by the broker: {exc}") from exc
            for letter, result in zip(batch.values(), results, strict=True):
                if not isinstance(result, BaseException):
                    continue
                smaller = self._smaller(letter, result)
                if smaller is None:
                    raise BatchAbandoned(
                        f"a dead letter was not acked by the broker: {result}"
                    ) from result
                await self._produce_letter(smaller)


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


def _unscoped(
    raw: RawRecord, item: Inbound | SendRequest | ControlRequest
) -> AbstractContextManager[object]:
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
