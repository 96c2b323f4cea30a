"""The inbound path without Faust: decode a batch of records, settle each through the
runtime, dead-letter what cannot be settled, publish receipts.

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
``unjournaled``
``dead`` (the journal dead-lettered it)     DLQ, reason ``attempts-exhausted``
``BadRecord`` (or decoding raised it)       DLQ at once, with its reason
``JournalUnavailableError``                 retried with the bot's inbox backoff; after the
                                            budget, DLQ reason ``journal-unavailable``
any other ``Exception``                     the same; DLQ reason ``handle-failed``
==========================================  ==========================================

The retry decision is the bot's (``runtime.inbox_retries``: ``inbox.max_attempts`` and
``inbox.backoff``). Dead letters carry the record untouched, with headers ``reason``,
``detail``, ``error.class``, ``error.message``, ``attempts``, ``source.topic``,
``source.partition``, ``source.offset``, ``dead.ts`` (credentials in URLs are masked).

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
import logging
import random
import re
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import msgspec

from state.backoff import GiveUp, Retries
from state.errors import BadRecord, JournalUnavailableError, Reason
from state.inbox import Outcome
from state.kv import DurableKv
from state.messages import Inbound, Receipt
from state.operations import Operations
from state.ports import Provider
from state.receipts import ReceiptSink
from streams.table_kv import in_partition
from topics.records import chat_key, decode_inbound, encode_receipt

__all__ = [
    "BatchAbandoned",
    "BotDefinition",
    "InboundRunner",
    "KafkaReceipts",
    "RawRecord",
    "RuntimeLike",
]

log = logging.getLogger("botmesh.streams")

Headers = list[tuple[str, bytes]]
#: ``produce(role, key, value, headers)`` hands a record to the producer (role ``"sent"`` or
#: ``"dlq"``) and returns an awaitable that resolves on the broker's ack.
Produce = Callable[[str, bytes | None, bytes, Headers], Awaitable[Awaitable[Any]]]
DETAIL_MAX = 400
_CREDENTIALS = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*://)[^/@\s]+@")


class RuntimeLike(Protocol):
    """What the worker needs from a bound bot (``botmesh.Runtime`` satisfies it)."""

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    async def handle(self, message: Inbound) -> Outcome: ...

    async def flush_receipts(self) -> int: ...

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

    async def publish(self, receipt: Receipt) -> Awaitable[Any]:
        ack = await self._produce("sent", chat_key(receipt.chat_id), encode_receipt(receipt), [])
        self.published += 1
        return ack


def redact(text: str) -> str:
    """``scheme://user:secret@host`` -> ``scheme://***@host``."""
    return _CREDENTIALS.sub(r"\1***@", text)


class InboundRunner:
    """Settles batches of inbound records through ``runtime.handle`` (see the module doc).

    ``produce`` hands dead letters to the producer. ``stopping`` (an event the worker sets
    when it stops) ends retry waits: the batch is abandoned rather than acked unsettled.
    ``sleep(delay)`` waits between attempts (tests pass their own; the default ends early,
    raising ``BatchAbandoned``, when ``stopping`` is set). ``owns(partition)`` says whether
    this worker still owns a record's partition: a record that fails on a partition taken
    from it is neither retried nor dead-lettered here (``BatchAbandoned``).
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
    ) -> None:
        self.runtime = runtime
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
        #: Failed attempts that were retried.
        self.retried = 0

    # -- one batch ------------------------------------------------------------------------

    async def run_batch(self, records: Sequence[RawRecord]) -> None:
        """Settle every record of ``records``; return only when all are (then ack them)."""
        deadline = time.monotonic() + self.batch_deadline
        chats: dict[str, list[tuple[RawRecord, Inbound]]] = {}
        for raw in records:
            try:
                message = decode_inbound(raw.value)
            except BadRecord as bad:
                await self.dead_letter(raw, bad.reason, bad.detail, error=bad)
                continue
            if not message.id:
                message = msgspec.structs.replace(message, id=raw.where)
            chats.setdefault(message.chat_id, []).append((raw, message))
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

    async def _run_chat(self, items: list[tuple[RawRecord, Inbound]], deadline: float) -> None:
        for raw, message in items:
            with in_partition(raw.partition):  # the chat's journal partition
                await self._settle(raw, message, deadline)

    async def _settle(self, raw: RawRecord, message: Inbound, deadline: float) -> None:
        attempt = 0
        while True:
            attempt += 1
            try:
                outcome = await self.runtime.handle(message)
            except BadRecord as bad:
                await self.dead_letter(raw, bad.reason, bad.detail, error=bad, attempts=attempt)
                return
            except Exception as exc:
                if self._owns is not None and not self._owns(raw.partition):
                    raise BatchAbandoned(
                        f"partition {raw.partition} was taken from this worker while "
                        f"{raw.where} failed ({type(exc).__name__}); its new owner handles it"
                    ) from exc
                decision = self._retries.decide(exc, attempt, self._rng)
                if isinstance(decision, GiveUp):
                    reason = (
                        Reason.JOURNAL_UNAVAILABLE
                        if isinstance(exc, JournalUnavailableError)
                        else Reason.HANDLE_FAILED
                    )
                    detail = f"not settled in {attempt} attempts: {type(exc).__name__}: {exc}"
                    await self.dead_letter(raw, reason, detail, error=exc, attempts=attempt)
                    return
                log.warning(
                    "inbound %s at %s failed (attempt %d): %s: %s; retrying in %.2fs",
                    message.id,
                    raw.where,
                    attempt,
                    type(exc).__name__,
                    redact(str(exc)),
                    decision.delay,
                )
                self.retried += 1
                await self._wait(decision.delay, deadline, message.id)
                continue
            self.outcomes[outcome] += 1
            if outcome == Outcome.DEAD:
                await self.dead_letter(
                    raw,
                    Reason.ATTEMPTS_EXHAUSTED,
                    f"the journal dead-lettered inbound {message.id!r}: inbox.max_attempts "
                    "runs were charged without completing",
                    attempts=attempt,
                )
            return

    async def _wait(self, delay: float, deadline: float, inbound_id: str) -> None:
        if time.monotonic() + delay > deadline:
            raise BatchAbandoned(
                f"inbound {inbound_id!r} still fails after the batch retried for "
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
        """Copy ``raw`` to the inbound DLQ with the reason and the error in its headers."""
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
        log.warning("inbound %s -> DLQ (%s: %s)", raw.where, reason, detail)
        try:
            ack = await self._produce("dlq", raw.key, raw.value or b"", headers)
        except Exception as exc:
            raise BatchAbandoned(f"cannot produce to the inbound DLQ: {exc}") from exc
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
