"""The inbound path without Faust: decode a batch of records, run the bot, collect receipts.

``InboundRunner.run_batch`` takes plain :class:`RawRecord` tuples so the Faust agent
(``streams.worker``) and tests share it. Per-chat order: the records of one chat run one after
the other, in offset order; different chats of a batch run concurrently. A batch returns only
when every receipt and dead letter it produced is acked by the broker, so the agent acks
(and Faust later commits) a record only after its side effects are on Kafka.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn, Protocol, runtime_checkable

from state.messages import Inbound, Media, Receipt
from topics.records import BadRecord, InboundRecord, chat_key, decode_inbound, encode_receipt

__all__ = ["BotLike", "InboundRunner", "RawRecord", "to_inbound"]

log = logging.getLogger("botmesh.streams")

Headers = list[tuple[str, bytes]]
#: ``produce(topic_role, key, value, headers)`` -> an awaitable that resolves on the broker ack.
Produce = Callable[[str, bytes | None, bytes, Headers], Awaitable[Awaitable[Any]]]
DETAIL_MAX = 400


@runtime_checkable
class BotLike(Protocol):
    """What the worker needs from a bot (``botmesh.Bot`` satisfies it)."""

    def on(self, event: str, listener: Callable[[Any], Any]) -> None: ...

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    async def handle(self, message: Inbound) -> None: ...


@dataclass(frozen=True, slots=True)
class RawRecord:
    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: Sequence[tuple[str, bytes]] = ()


def to_inbound(rec: InboundRecord, raw: RawRecord) -> Inbound:
    """The bot's view of a decoded record; ``id`` defaults to ``<topic>:<partition>:<offset>``."""
    media = None
    if rec.media is not None:
        media = Media(
            url=rec.media.url, path=rec.media.path, data=rec.media.data, mime=rec.media.mime
        )
    return Inbound(
        id=rec.id if rec.id is not None else f"{raw.topic}:{raw.partition}:{raw.offset}",
        chat_id=rec.chat_id,
        text=rec.text,
        kind=rec.kind,
        sender=rec.sender,
        channel=rec.channel,
        ts=rec.ts,
        media=media,
        data=rec.data,
    )


def _fatal(exc: BaseException) -> NoReturn:
    raise SystemExit(70) from exc


class InboundRunner:
    """Runs batches of inbound records through ``bot.handle``.

    ``produce("sent" | "dlq", key, value, headers)`` hands a record to the producer.
    ``handle_attempts``: runs of ``bot.handle`` that raise (the Bot reports handler errors on
    ``error`` and does not raise; what does raise is the journal or the engine) before the
    record goes to the inbound DLQ with reason ``handle-failed``. ``on_fatal`` is called when
    a receipt or dead letter cannot be written (nothing of the batch may be acked then);
    the worker exits hard so the broker redelivers the batch.
    """

    def __init__(
        self,
        bot: BotLike,
        produce: Produce,
        *,
        handle_attempts: int = 3,
        ack_timeout: float = 60.0,
        on_fatal: Callable[[BaseException], NoReturn] = _fatal,
    ) -> None:
        if handle_attempts < 1:
            raise ValueError(f"handle_attempts must be >= 1, got {handle_attempts}")
        self.bot = bot
        self._produce = produce
        self.handle_attempts = handle_attempts
        self.ack_timeout = ack_timeout
        self._on_fatal = on_fatal
        self._pending: set[Awaitable[Any]] = set()
        self.handled = 0
        self.dead = 0
        self.receipts = 0
        bot.on("sent", self._on_sent)

    async def _on_sent(self, receipt: Receipt) -> None:
        value = encode_receipt(
            key=receipt.key,
            chat_id=receipt.chat_id,
            message_id=receipt.message_id,
            state=receipt.state,
            inbound_id=receipt.inbound_id,
            part=receipt.part,
        )
        try:
            fut = await self._produce("sent", chat_key(receipt.chat_id), value, [])
        except Exception as exc:
            log.critical("cannot produce the receipt of %s: %s", receipt.key, exc)
            self._on_fatal(exc)
        self._pending.add(fut)
        self.receipts += 1

    async def dead_letter(self, raw: RawRecord, reason: str, detail: str) -> None:
        headers: Headers = [
            ("reason", reason.encode()),
            ("detail", detail[:DETAIL_MAX].encode()),
            ("source.topic", raw.topic.encode()),
            ("source.partition", str(raw.partition).encode()),
            ("source.offset", str(raw.offset).encode()),
            ("dead.ts", f"{time.time():.3f}".encode()),
        ]
        headers += [(k, v) for k, v in raw.headers if k not in dict(headers)]
        log.warning(
            "inbound %s:%d:%d -> DLQ (%s: %s)", raw.topic, raw.partition, raw.offset, reason, detail
        )
        try:
            fut = await self._produce("dlq", raw.key, raw.value or b"", headers)
        except Exception as exc:
            log.critical("cannot produce to the inbound DLQ: %s", exc)
            self._on_fatal(exc)
        self._pending.add(fut)
        self.dead += 1

    async def run_batch(self, records: Sequence[RawRecord]) -> None:
        chats: dict[str, list[tuple[RawRecord, Inbound]]] = {}
        for raw in records:
            try:
                rec = decode_inbound(raw.value)
            except BadRecord as bad:
                await self.dead_letter(raw, bad.reason, bad.detail)
                continue
            chats.setdefault(rec.chat_id, []).append((raw, to_inbound(rec, raw)))
        if len(chats) == 1:
            await self._run_chat(next(iter(chats.values())))
        elif chats:
            await asyncio.gather(*(self._run_chat(items) for items in chats.values()))
        await self.drain()

    async def _run_chat(self, items: list[tuple[RawRecord, Inbound]]) -> None:
        for raw, inbound in items:
            await self._run_one(raw, inbound)

    async def _run_one(self, raw: RawRecord, inbound: Inbound) -> None:
        for attempt in range(1, self.handle_attempts + 1):
            try:
                await self.bot.handle(inbound)
            except Exception as exc:
                log.warning(
                    "handle %s failed (attempt %d/%d): %s: %s",
                    inbound.id,
                    attempt,
                    self.handle_attempts,
                    type(exc).__name__,
                    exc,
                )
                if attempt == self.handle_attempts:
                    await self.dead_letter(raw, "handle-failed", f"{type(exc).__name__}: {exc}")
                    return
                await asyncio.sleep(min(0.2 * 2**attempt, 5.0))
            else:
                self.handled += 1
                return

    async def drain(self) -> None:
        """Wait until every receipt and dead letter produced so far is acked by the broker."""
        while self._pending:
            batch, self._pending = self._pending, set()
            try:
                await asyncio.wait_for(asyncio.gather(*batch), self.ack_timeout)
            except Exception as exc:
                log.critical("a receipt or dead letter was not acked by the broker: %s", exc)
                self._on_fatal(exc)
