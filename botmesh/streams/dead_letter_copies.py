"""Dead letters of the worker's inbound path: a record that cannot be settled is copied,
untouched, to its dead-letter topic (``<prefix>.inbound.dlq``; ``<prefix>.requests.dlq``
for send requests and operator actions) with headers that say why: ``reason``,
``detail``, ``error.class``, ``error.message``, ``attempts``, ``source.topic``,
``source.partition``, ``source.offset``, ``dead.ts`` (credentials in URLs masked).

**Dead letters too large to copy.** The producer refuses any record over its request limit
(``max_request_size``: librdkafka's ``message.max.bytes``, 1,000,000 bytes), and a dead
letter is the record plus our headers. So a record the broker took can be too large to copy:
the broker's default ``max.message.bytes`` (1,048,588) takes a value of 1,048,500 bytes,
which with the headers is over the limit. Before it produces a dead letter it works out its
size (:func:`record_size`) as a record alone in a batch (key, value, headers, the record's
overhead and its batch's header, every length the batch decides at its longest); librdkafka
counts a record smaller (its check of ``message.max.bytes``, tested with 2.16), so a record
within the limit by this count passes its check. When it is over the limit less 16 KiB
(``CUT_MARGIN``), the copy is cut to that size: our headers stay whole and two are added,
``truncated`` = ``true`` and ``original.size`` = the value's length in bytes; the record's
own headers stay while they fit in a quarter of the room (the others are left out and
counted in ``headers.dropped``); the key stays whole up to a quarter of the room (a longer
key is cut and its length put in ``original.key.size``); the value keeps its first bytes, as
many as fit. The whole record stays where it was: ``source.topic``, ``source.partition`` and
``source.offset`` say where to read it (``kcat -C -b <broker> -t <topic> -p <partition> -o
<offset> -c 1``) until the topic's retention deletes it. Should the producer or the broker
still refuse a copy as too large (the DLQ topic's ``max.message.bytes`` under the producer's
limit), it is produced again cut to a sixteenth, then with no value and none of the record's
own headers; only a copy refused at that size, or for another reason, gives the batch up. A
record whose headers the consumer cannot hand over (a header key that is not UTF-8) is
copied with a header saying they were dropped
(``botmesh.streams.worker.loop.UNREADABLE_HEADERS``). So no record, however large or odd (no
key, no value, binary bytes, JSON nested too deeply, a huge key or header, a header key that
is not UTF-8), stops the worker or holds up its partition. A record larger than the
consumer's fetch size (1 MiB a partition; a topic whose ``max.message.bytes`` was raised) is
fetched all the same: the broker hands over a partition's first batch whole whatever the
fetch size (seen with a 3 MB record, cut here like any other).

Each batch waits for its own copies' acks (``DeadLetterCopies.drain``) before it is acked:
the runner (``botmesh.streams.runner``) says when a record goes here and why.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import KafkaError, KafkaException

from botmesh.state.errors import Reason
from botmesh.streams.raw_record import RawRecord
from botmesh.streams.sink import Headers, Produce
from botmesh.topics.dead_letters import DETAIL_MAX, redact

__all__ = [
    "CUT_MARGIN",
    "MAX_REQUEST_SIZE",
    "BatchAbandoned",
    "BatchAcks",
    "DeadLetterCopies",
    "cut_letter",
    "record_size",
    "too_large",
]

log = logging.getLogger("botmesh.streams")

#: A dead letter's kind (a label of ``botmesh_dead_letters_total``) by the record's noun.
KINDS = {"operator action": "control"}


class BatchAbandoned(Exception):
    """A batch cannot be settled now (the worker stops, a retry would pass the batch
    deadline, a dead letter was refused): ack nothing of it."""


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
class Letter:
    """A dead letter to produce: the record, our headers, the record's own headers, and the
    size it must fit in (``None``: whole, as long as it fits the producer's limit)."""

    role: str
    #: What the record is, in the logs: ``inbound``, ``request``, ``operator action``.
    noun: str
    raw: RawRecord
    ours: Headers
    own: Headers
    budget: int | None = None
    #: Counted in ``DeadLetterCopies.cut`` already.
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
class BatchAcks:
    """What a batch produced that the broker must ack before the batch is: dead letters
    (with what to cut if one is refused as too large) and operator actions' results."""

    letters: dict[Awaitable[Any], Letter] = field(default_factory=dict)
    results: set[Awaitable[Any]] = field(default_factory=set)


#: The acks of the batch the current task works for (``DeadLetterCopies.batch``, entered by
#: the runner's ``run_batch``): batches run side by side, and each waits for its own.
_BATCH_ACKS: ContextVar[BatchAcks | None] = ContextVar("botmesh_batch_acks", default=None)


class DeadLetterCopies:
    """Copies records that cannot be settled to their dead-letter topic (see the module
    doc), and waits for the broker to ack each batch's copies (``drain``). ``produce``
    hands a record to the worker's producer; ``max_request_size`` is its limit on a record
    (librdkafka's ``message.max.bytes``)."""

    def __init__(
        self,
        produce: Produce,
        *,
        ack_timeout: float = 60.0,
        max_request_size: int = MAX_REQUEST_SIZE,
        letters: Counter[tuple[str, str]] | None = None,
    ) -> None:
        self._produce = produce
        self.ack_timeout = ack_timeout
        self.max_request_size = max_request_size
        #: Dead letters produced, by (kind, reason) (shared with ``KafkaReceipts``').
        self.letters: Counter[tuple[str, str]] = Counter() if letters is None else letters
        #: Dead letters produced, by reason.
        self.dead_letters: Counter[str] = Counter()
        #: Dead letters that went out cut (``truncated`` = ``true``), each counted once.
        self.cut = 0
        #: Produced outside a batch (``copy`` called directly), not acked yet.
        self._unbatched = BatchAcks()

    @contextlib.contextmanager
    def batch(self) -> Iterator[BatchAcks]:
        """A batch's own acks: ``drain`` inside it waits for what the batch produced."""
        token = _BATCH_ACKS.set(BatchAcks())
        try:
            yield _BATCH_ACKS.get() or self._unbatched
        finally:
            _BATCH_ACKS.reset(token)

    async def copy(
        self,
        raw: RawRecord,
        noun: str,
        reason: Reason,
        detail: str,
        *,
        error: BaseException | None = None,
        attempts: int | None = None,
    ) -> None:
        """Copy ``raw`` (an ``inbound``, a send ``request``, an ``operator action``) to its
        DLQ (the inbound's; the requests' for the others) with the reason and the error in
        its headers."""
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
        log.warning("%s %s -> DLQ (%s: %s)", noun, raw.where, reason, detail)
        role = "dlq" if noun in ("inbound", "status") else "requests-dlq"
        await self._produce_letter(Letter(role, noun, raw, headers, own))
        self.dead_letters[reason] += 1
        self.letters[(KINDS.get(noun, noun), str(reason))] += 1

    async def _produce_letter(self, letter: Letter) -> None:
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
                    letter.noun,
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
                    raise BatchAbandoned(f"cannot produce to the {letter.noun} DLQ: {exc}") from exc
                letter = smaller
                continue
            if budget is not None and not letter.counted:
                self.cut += 1
                letter = dataclasses.replace(letter, counted=True)
            self.acks().letters[ack] = letter
            return

    def _cut_to(self) -> int:
        return max(self.max_request_size - CUT_MARGIN, 0)

    def _smaller(self, letter: Letter, exc: BaseException) -> Letter | None:
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
            letter.noun,
            letter.raw.where,
            type(exc).__name__,
            exc,
            smaller,
        )
        return dataclasses.replace(letter, budget=smaller)

    def acks(self) -> BatchAcks:
        """What the current batch (outside a batch: nothing's) must have acked."""
        return _BATCH_ACKS.get() or self._unbatched

    async def drain(self) -> None:
        """Wait until every dead letter and action result the current batch produced so far
        (outside a batch: produced outside any) is acked by the broker (a dead letter it
        refused as too large is produced again, cut smaller, and waited for too)."""
        mine = self.acks()
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
