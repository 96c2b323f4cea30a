"""``KvDurability``: the inbox, the outbox and their leases over any ``DurableKv``.

A ``KvDurability`` is a backend that several bots may share; ``bind()`` gives one bot its
``ScopedDurability``: the engine working only on that bot's scope. The engine keeps the
state transitions (``handle_inbound``, ``send``, ``enqueue``, ``sweep_once(now)``,
``heartbeat_once(now)``, operator actions) apart from scheduling: ``state.sweeper`` calls
``sweep_once`` / ``heartbeat_once`` on a timer, and the Kafka worker can call them itself.

Write points (the ``label`` of each ``DurableKv.commit``): ``inbox.journal``,
``inbox.claim``, ``inbox.heartbeat``, ``inbox.mark_done``, ``inbox.mark_retry``,
``inbox.mark_dead``, ``inbox.replay``, ``outbox.journal``, ``outbox.enqueue``,
``outbox.claim``, ``outbox.heartbeat``, ``outbox.mark_sent``, ``outbox.mark_failed``,
``outbox.mark_dead``, ``outbox.mark_unknown``, ``outbox.release``, ``outbox.wait``,
``outbox.retry``, ``outbox.discard``, ``retention.purge``.

Only ``Exception`` is ever caught: a ``BaseException`` (a simulated crash, a cancel) always
goes through, so nothing is written after it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import random
import socket
import uuid
import weakref
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Any

from state import inbox as inbox_sm
from state import outbox as outbox_sm
from state.clock import Clock, SystemClock
from state.config import DurabilityConfig
from state.errors import (
    ConfigError,
    DurabilityError,
    FencedError,
    JournalUnavailableError,
    RateLimitedError,
    RecordStateError,
    SendDeferredError,
    VersionConflictError,
)
from state.events import AMBIGUOUS, DEAD, AmbiguousEvent, DeadEvent
from state.inbox import Inbox
from state.keys import diverged_key
from state.kv import Delete, DurableKv, Entry, MemoryKv, Put
from state.lease import Held, claim_value, lease_state
from state.messages import Inbound, Outbound, Receipt
from state.metrics import Metrics
from state.outbox import Outbox, receipt_of
from state.ports import Provider
from state.records import decode_inbound, decode_outbound, encode_outbound, error_of
from state.splitter import split_text

__all__ = [
    "EngineHooks",
    "KvDurability",
    "MemoryDurability",
    "ScopedDurability",
    "resolve_backend",
]

log = logging.getLogger("botmesh.durability")

Json = dict[str, Any]


@dataclass(frozen=True, slots=True)
class EngineHooks:
    """What the engine calls back into the bot."""

    #: Run the handlers of one inbound (handler errors are the bot's to report).
    dispatch: Callable[[Inbound], Awaitable[None]]
    #: A send went out (``background``: delivered by the sweeper, not inline).
    delivered: Callable[[Receipt, bool], Awaitable[None]]
    #: Emit a bot event (``error``, ``durability:dead``, ``durability:ambiguous``).
    emit: Callable[[str, object], Awaitable[None]]


class KvDurability:
    """A journal backend: any ``DurableKv``, shareable by several bots (each in its scope).

    ``shared`` says whether processes on other hosts may use the same data (Postgres,
    Redis): then the default instance id gets a per-boot suffix. It defaults to the kv's
    ``shared`` attribute when it has one, else False. The bot opens and closes the
    backend; opens are counted, so bots sharing one backend close it once, last.
    """

    def __init__(
        self,
        kv: DurableKv | None = None,
        *,
        shared: bool | None = None,
        opener: Callable[[], Awaitable[DurableKv]] | None = None,
        name: str = "",
    ) -> None:
        if kv is None and opener is None:
            raise ValueError("KvDurability needs a DurableKv or an opener")
        self._kv = kv
        self._opener = opener
        self._shared = shared
        self._opens = 0
        self.name = name or type(kv).__name__

    @property
    def kv(self) -> DurableKv:
        if self._kv is None:
            raise DurabilityError(f"the {self.name} journal is not open yet: await bot.start()")
        return self._kv

    @property
    def shared(self) -> bool:
        if self._shared is not None:
            return self._shared
        return bool(getattr(self._kv, "shared", False))

    async def open(self) -> None:
        if self._kv is None:
            assert self._opener is not None
            self._kv = await self._opener()
        if self._opens == 0:
            await self._kv.open()
        self._opens += 1

    async def close(self) -> None:
        if self._opens == 0:
            return
        self._opens -= 1
        if self._opens == 0 and self._kv is not None:
            await self._kv.close()

    def bind(
        self,
        *,
        scope: str,
        config: DurabilityConfig,
        provider: Provider,
        hooks: EngineHooks,
        bot_id: str = "bot",
        connection_id: str = "default",
        clock: Clock | None = None,
        rng: random.Random | None = None,
    ) -> ScopedDurability:
        return ScopedDurability(
            self,
            scope=scope,
            config=config,
            provider=provider,
            hooks=hooks,
            bot_id=bot_id,
            connection_id=connection_id,
            clock=clock or SystemClock(),
            rng=rng,
        )


class MemoryDurability(KvDurability):
    """The in-memory backend (``durability={}``): retries, backoff and the DLQ, in one
    process; survives nothing."""

    def __init__(self) -> None:
        super().__init__(MemoryKv(), shared=False, name="memory")


class ScopedDurability:
    """One bot's view of a backend: ``bot.durability``.

    Operators use ``inbox.list(state=)``, ``outbox.list(state=)``, ``replay_inbound(id)``,
    ``retry_send(key)``, ``outbox.discard(key)``, ``metrics()`` and ``scope``.
    """

    def __init__(
        self,
        backend: KvDurability,
        *,
        scope: str,
        config: DurabilityConfig,
        provider: Provider,
        hooks: EngineHooks,
        bot_id: str,
        connection_id: str,
        clock: Clock,
        rng: random.Random | None,
    ) -> None:
        self.backend = backend
        self.scope = scope
        self.config = config
        self.provider = provider
        self.hooks = hooks
        self.clock = clock
        self.rng = rng or random.Random()
        self.boot = uuid.uuid4().hex[:12]
        default_id = f"{socket.gethostname()}/{bot_id}/{connection_id}"
        if config.instance_id is not None:
            self.instance_id = config.instance_id
        elif backend.shared:
            self.instance_id = f"{default_id}/{self.boot}"
        else:
            self.instance_id = default_id
        self.prefix = f"{scope}/"
        self.in_prefix = f"{scope}/in/"
        self.out_prefix = f"{scope}/out/"
        self._metrics = Metrics()
        self._kv: DurableKv | None = None
        self._held: dict[str, Held] = {}
        self._inbound_inflight: set[str] = set()
        self._chat_locks: weakref.WeakValueDictionary[str, asyncio.Lock] = (
            weakref.WeakValueDictionary()
        )
        self._fail_counts: dict[str, int] = {}
        self._not_before: dict[str, float] = {}
        self.wake = asyncio.Event()
        self.inbox = Inbox(self)
        self.outbox = Outbox(self)
        # hot-path constants
        self._in_lease = config.inbox.lease
        self._out_lease = config.outbox.lease
        self._in_backoff = config.inbox.backoff.backoff()
        self._out_backoff = config.outbox.backoff.backoff()

    # -- lifecycle ----------------------------------------------------------------------

    @property
    def kv(self) -> DurableKv:
        if self._kv is None:
            return self.backend.kv
        return self._kv

    async def open(self) -> None:
        """Open the backend and recover: reclaim this instance's records of earlier boots
        at once, replay unfinished inbounds, resolve sends left in flight."""
        await self.backend.open()
        self._kv = self.backend.kv
        await self.sweep_once(recovering=True)

    async def close(self) -> None:
        self._kv = None
        await self.backend.close()

    def metrics(self) -> dict[str, int]:
        """The thirteen counters, under the reference's names."""
        return self._metrics.as_dict()

    @property
    def counters(self) -> Metrics:
        return self._metrics

    def _purge_at(self, now: float) -> float | None:
        return now + self.config.retention if self.config.retention > 0 else None

    def _lease(self, now: float, lease: float) -> Json:
        return {"owner": self.instance_id, "boot": self.boot, "until": now + lease}

    def _chat_lock(self, chat_id: str) -> asyncio.Lock:
        lock = self._chat_locks.get(chat_id)
        if lock is None:
            lock = asyncio.Lock()
            self._chat_locks[chat_id] = lock
        return lock

    # -- holder writes --------------------------------------------------------------------

    async def _update(
        self,
        held: Held,
        value: Json,
        label: str,
        due: float | None,
        purge: float | None = None,
    ) -> None:
        """Write ``value`` as the holder of ``held``; ``FencedError`` when taken over."""
        for _ in range(8):
            try:
                [version] = await self.kv.commit(
                    [Put(held.key, value, expect=held.version, due=due, purge=purge)], label=label
                )
            except VersionConflictError:
                entry = await self.kv.get(held.key)
                current = entry.value.get("token") if entry is not None else None
                if entry is None or current != held.token:
                    held.fenced = True
                    self._held.pop(held.key, None)
                    self._metrics.stale_leases += 1
                    log.warning(
                        "stale completion of %s refused (%s): token %s, record at %s",
                        held.key,
                        label,
                        held.token,
                        current,
                    )
                    raise FencedError(held.key, held.token, current) from None
                held.version = entry.version  # our own heartbeat landed first
                continue
            held.version = version
            held.value = value
            lease = value.get("lease")
            if lease:
                held.until = lease["until"]
            return
        raise DurabilityError(f"{held.key}: too many concurrent writes by this holder")

    async def _reclaim(self, held: Held, label: str, lease: float, *, attempt: bool) -> None:
        """Take a fresh fencing token on a record we hold (before a provider call)."""
        now = self.clock.now()
        new = claim_value(held.value, self.instance_id, self.boot, now, lease)
        if attempt:
            new["state"] = "pending"
            new["inflight"] = True
            new["attempts"] = int(held.value.get("attempts", 0)) + 1
        await self._update(held, new, label, due=now + lease)
        held.token = new["token"]

    async def heartbeat_once(self, now: float | None = None) -> int:
        """Extend every lease held here that is a third or more through; returns how many."""
        now = self.clock.now() if now is None else now
        extended = 0
        for held in list(self._held.values()):
            if held.fenced or held.until - now > held.lease * 2 / 3:
                continue
            lease = held.value.get("lease")
            if not lease:
                continue
            new = dict(held.value)
            new["lease"] = {**lease, "until": now + held.lease}
            label = "inbox.heartbeat" if held.key.startswith(self.in_prefix) else "outbox.heartbeat"
            try:
                [version] = await self.kv.commit(
                    [Put(held.key, new, expect=held.version, due=now + held.lease)], label=label
                )
            except VersionConflictError:
                entry = await self.kv.get(held.key)
                if entry is None or entry.value.get("token") != held.token:
                    held.fenced = True
                continue  # else the holder itself wrote meanwhile; next tick
            except Exception as exc:
                log.warning("heartbeat of %s failed: %s", held.key, exc)
                continue
            if self._held.get(held.key) is held:
                held.version = version
                held.value = new
                held.until = now + held.lease
                extended += 1
        return extended

    # -- inbox --------------------------------------------------------------------------

    async def handle_inbound(self, message: Inbound) -> None:
        """Journal ``message`` (fail closed), run the handlers, mark it done."""
        mid = message.id
        if mid in self._inbound_inflight:
            self._metrics.inbound_duplicates += 1
            return
        self._inbound_inflight.add(mid)
        try:
            key = self.in_prefix + mid
            now = self.clock.now()
            try:
                value = inbox_sm.new_value(
                    message,
                    now,
                    owner=self.instance_id,
                    boot=self.boot,
                    lease=self._in_lease,
                    media_refs=self.config.inbox.media_refs,
                )
                [version] = await self.kv.commit(
                    [Put(key, value, expect=0, due=now + self._in_lease)], label="inbox.journal"
                )
            except VersionConflictError:
                try:
                    await self._redelivered(key)
                except Exception as exc:  # the record stays for the sweeper
                    log.warning("redelivery of %s not processed: %s", mid, exc)
                    await self.hooks.emit("error", exc)
                return
            except Exception as exc:
                await self._journal_failed(message, exc)
                return
            self._metrics.inbound_journaled += 1
            held = Held(key, 1, version, value, self._in_lease, now + self._in_lease)
            await self._run_inbound(held, message)
        finally:
            self._inbound_inflight.discard(mid)

    async def _journal_failed(self, message: Inbound, exc: Exception) -> None:
        if self.config.fail_open:
            log.warning(
                "inbound %s not journaled (%s); dispatched anyway (fail_open)", message.id, exc
            )
            await self.hooks.emit("error", exc)
            await self.hooks.dispatch(message)
            return
        log.error(
            "inbound %s not journaled, not dispatched (fail closed): %s. A redelivery will "
            "be processed; set fail_open=True to dispatch without the journal",
            message.id,
            exc,
        )
        await self.hooks.emit("error", exc)

    async def _redelivered(self, key: str) -> None:
        entry = await self.kv.get(key)
        if entry is not None and key not in self._held and entry.value.get("state") == "pending":
            now = self.clock.now()
            if lease_state(entry.value, self.instance_id, self.boot, now) != "live":
                await self._replay_record(entry, now)
                return
        self._metrics.inbound_duplicates += 1

    async def _run_inbound(self, held: Held, message: Inbound) -> None:
        self._held[held.key] = held
        try:
            await self.hooks.dispatch(message)
        finally:
            self._held.pop(held.key, None)
        now = self.clock.now()
        try:
            await self._update(
                held,
                inbox_sm.done_value(held.value, now),
                "inbox.mark_done",
                due=None,
                purge=self._purge_at(now),
            )
        except FencedError as exc:
            await self.hooks.emit("error", exc)
        except Exception as exc:
            # not marked done: the lease runs out and the sweeper handles it again
            log.warning("inbound %s handled but not marked done: %s", held.key, exc)
            await self.hooks.emit("error", exc)

    async def _replay_record(self, entry: Entry, now: float) -> int:
        value = entry.value
        attempts = int(value.get("attempts", 0))
        if attempts >= self.config.inbox.max_attempts:
            error = {
                "type": "AttemptsExhausted",
                "message": f"{attempts} runs were charged without completing "
                f"(inbox.max_attempts={self.config.inbox.max_attempts})",
                "retryable": False,
            }
            if value.get("error"):
                error["last"] = value["error"]
            try:
                await self.kv.commit(
                    [Put(entry.key, inbox_sm.dead_value(value, now, error), expect=entry.version)],
                    label="inbox.mark_dead",
                )
            except VersionConflictError:
                return 0
            self._metrics.inbound_dead += 1
            await self.hooks.emit(DEAD, DeadEvent("inbox", value["id"], str(error["message"])))
            return 1
        claimed = claim_value(value, self.instance_id, self.boot, now, self._in_lease)
        claimed["attempts"] = attempts + 1
        claimed["state"] = "pending"
        try:
            [version] = await self.kv.commit(
                [Put(entry.key, claimed, expect=entry.version, due=now + self._in_lease)],
                label="inbox.claim",
            )
        except VersionConflictError:
            return 0
        held = Held(
            entry.key, claimed["token"], version, claimed, self._in_lease, now + self._in_lease
        )
        self._metrics.inbound_replayed += 1
        try:
            message = decode_inbound(claimed["message"])
        except Exception as exc:
            await self._inbox_failed_before_handlers(held, exc)
            return 1
        await self._run_inbound(held, message)
        return 1

    async def _inbox_failed_before_handlers(self, held: Held, exc: Exception) -> None:
        now = self.clock.now()
        attempts = int(held.value.get("attempts", 0))
        error = error_of(exc)
        log.warning(
            "inbound %s failed before its handlers (attempt %d): %s", held.key, attempts, exc
        )
        if attempts >= self.config.inbox.max_attempts:
            await self._update(
                held, inbox_sm.dead_value(held.value, now, error), "inbox.mark_dead", None
            )
            self._metrics.inbound_dead += 1
            await self.hooks.emit(DEAD, DeadEvent("inbox", held.value["id"], str(exc)))
            return
        delay = self._in_backoff.delay(attempts, self.rng)
        await self._update(
            held, inbox_sm.retry_value(held.value, now, error), "inbox.mark_retry", due=now + delay
        )

    # -- outbox: inline -------------------------------------------------------------------

    def _payload(self, message: Outbound) -> Json | None:
        """The journaled payload, or ``None`` when it must bypass the outbox."""
        try:
            payload = encode_outbound(message)
        except Exception as exc:
            log.warning(
                "send to %s bypasses the outbox: cannot encode it (%s)", message.chat_id, exc
            )
            return None
        limit = self.config.outbox.max_payload_bytes
        text = message.text or ""
        if message.media is None and not message.options and len(text) * 6 + 256 < limit:
            return payload
        try:
            size = len(json.dumps(payload, ensure_ascii=False).encode())
        except (TypeError, ValueError) as exc:
            log.warning("send to %s bypasses the outbox: not JSON (%s)", message.chat_id, exc)
            return None
        if size > limit:
            log.warning(
                "send to %s bypasses the outbox: %d bytes > outbox.max_payload_bytes=%d; "
                "prefer URL or path media for large files",
                message.chat_id,
                size,
                limit,
            )
            return None
        return payload

    async def _bypass(self, message: Outbound, key: str, inbound_id: str | None) -> Receipt:
        self._metrics.outbox_bypassed += 1
        result = await self.provider.send(message)
        receipt = Receipt(key, message.chat_id, result.message_id, "sent", inbound_id)
        await self.hooks.delivered(receipt, False)
        return receipt

    def _texts(self, message: Outbound) -> list[str | None]:
        if message.text is None:
            return [None]
        return list(split_text(message.text, self.provider.text_limit))

    async def send(
        self,
        message: Outbound,
        *,
        key: str,
        derived: bool = False,
        fp: str | None = None,
        inbound_id: str | None = None,
    ) -> Receipt:
        """Journal the send under ``key`` (in flight), call the provider, record the result.

        Answers from the outbox when ``key`` is recorded; retries inline for up to
        ``outbox.inline_max`` then raises ``SendDeferredError``; raises the send error of a
        final failure (the record is dead); ``FencedError`` when the lease was taken over.
        Returns the receipt of part 1.
        """
        if "idempotency_key" in message.options:  # the provider never sees the key
            message = _strip_key(message)
        payload = self._payload(message)
        if payload is None:
            return await self._bypass(message, key, inbound_id)
        texts = self._texts(message)
        async with self._chat_lock(message.chat_id):
            for _ in range(4):
                now = self.clock.now()
                lease = self._lease(now, self._out_lease)
                values = outbox_sm.new_values(
                    key,
                    payload,
                    texts,
                    fp=fp,
                    inbound_id=inbound_id,
                    now=now,
                    lease=lease,
                    inflight=True,
                )
                due = now + self._out_lease
                ops = [Put(self.out_prefix + v["key"], v, expect=0, due=due) for v in values]
                try:
                    versions = await self.kv.commit(ops, label="outbox.journal")
                except VersionConflictError:
                    answer = await self._answer_existing(key, derived, fp)
                    if isinstance(answer, Receipt):
                        return answer
                    key = answer
                    continue
                except JournalUnavailableError:
                    if self.config.fail_open:
                        return await self._bypass(message, key, inbound_id)
                    raise
                self._metrics.outbox_journaled += 1
                helds = [
                    Held(op.key, v["token"], ver, v, self._out_lease, due)
                    for op, v, ver in zip(ops, values, versions, strict=True)
                ]
                outs = [message] if len(texts) == 1 else [replace(message, text=t) for t in texts]
                return await self._deliver_inline(helds, outs, now)
        raise DurabilityError(f"send {key!r}: the outbox record keeps changing under us")

    async def _answer_existing(self, key: str, derived: bool, fp: str | None) -> Receipt | str:
        entry = await self.kv.get(self.out_prefix + key)
        if entry is None:
            return key  # discarded or purged meanwhile: journal again
        value = entry.value
        recorded = value.get("fp")
        if derived and fp is not None and recorded is not None and recorded != fp:
            self._metrics.outbox_diverged += 1
            log.warning(
                "replay produced other content under key %r (on_diverged=%s)",
                key,
                self.config.outbox.on_diverged,
            )
            if self.config.outbox.on_diverged == "send":
                return diverged_key(key, fp)
        self._metrics.outbox_deduped += 1
        return receipt_of(value)

    async def _deliver_inline(
        self, helds: list[Held], outs: list[Outbound], started: float
    ) -> Receipt:
        for held in helds:
            self._held[held.key] = held
        first: Receipt | None = None
        try:
            for i, held in enumerate(helds):
                if i > 0:
                    await self._reclaim(held, "outbox.claim", self._out_lease, attempt=True)
                try:
                    receipt = await self._attempt_inline(held, outs[i], started)
                except SendDeferredError:
                    await self._release(helds[i + 1 :])
                    raise
                except FencedError:
                    raise
                except Exception as exc:
                    if held.value.get("state") == "dead":
                        await self._cascade_dead(helds[i + 1 :], held.key, exc)
                    raise
                if first is None:
                    first = receipt
        finally:
            for held in helds:
                self._held.pop(held.key, None)
        assert first is not None
        return first

    async def _attempt_inline(self, held: Held, message: Outbound, started: float) -> Receipt:
        retries = self.config.outbox.retries
        while True:
            if held.fenced:
                raise FencedError(held.key, held.token, None)
            try:
                result = await self.provider.send(message)
            except Exception as exc:
                now = self.clock.now()
                attempts = int(held.value.get("attempts", 1))
                if not getattr(exc, "retryable", True) or attempts >= retries + 1:
                    await self._mark_dead(held, exc, now)
                    raise
                floor = exc.retry_after if isinstance(exc, RateLimitedError) else 0.0
                delay = self._out_backoff.delay(attempts, self.rng, floor)
                if now + delay - started > self.config.outbox.inline_max:
                    await self._update(
                        held,
                        outbox_sm.failed_value(held.value, now, error_of(exc), None),
                        "outbox.mark_failed",
                        due=now + delay,
                    )
                    self._held.pop(held.key, None)
                    self._metrics.outbox_deferred += 1
                    self.wake.set()
                    raise SendDeferredError(held.value["key"], str(exc)) from exc
                keep = self._lease(now, delay + self._out_lease)
                await self._update(
                    held,
                    outbox_sm.failed_value(held.value, now, error_of(exc), keep),
                    "outbox.mark_failed",
                    due=keep["until"],
                )
                await self.clock.sleep(delay)
                await self._reclaim(held, "outbox.claim", self._out_lease, attempt=True)
                self._metrics.outbox_retried += 1
                continue
            return await self._mark_sent(held, result.message_id, background=False)

    async def _mark_sent(self, held: Held, message_id: str, *, background: bool) -> Receipt:
        now = self.clock.now()
        await self._update(
            held,
            outbox_sm.sent_value(held.value, now, message_id),
            "outbox.mark_sent",
            due=None,
            purge=self._purge_at(now),
        )
        self._held.pop(held.key, None)
        receipt = receipt_of(held.value)
        await self.hooks.delivered(receipt, background)
        return receipt

    async def _mark_dead(self, held: Held, exc: BaseException, now: float) -> None:
        error = error_of(exc)
        await self._update(
            held, outbox_sm.dead_value(held.value, now, error), "outbox.mark_dead", None
        )
        self._held.pop(held.key, None)
        self._metrics.outbox_dead += 1
        log.error("send %s dead-lettered: %s", held.value["key"], exc)
        await self.hooks.emit(DEAD, DeadEvent("outbox", held.value["key"], str(exc)))

    async def _release(self, helds: list[Held]) -> None:
        """Later parts of a deferred send: drop our lease, wait for the sweeper."""
        if not helds:
            return
        now = self.clock.now()
        for held in helds:
            new = dict(held.value)
            new.update(lease=None, updated=now)
            try:
                await self._update(held, new, "outbox.release", due=now)
            except FencedError:
                continue
            finally:
                self._held.pop(held.key, None)

    async def _cascade_dead(self, helds: list[Held], previous: str, exc: BaseException) -> None:
        now = self.clock.now()
        for held in helds:
            error = {
                "type": "PreviousPartDead",
                "message": f"an earlier part ({previous}) is dead: {exc}",
                "retryable": False,
            }
            try:
                await self._update(
                    held, outbox_sm.dead_value(held.value, now, error), "outbox.mark_dead", None
                )
            except FencedError:
                continue
            finally:
                self._held.pop(held.key, None)
            self._metrics.outbox_dead += 1
            await self.hooks.emit(
                DEAD, DeadEvent("outbox", held.value["key"], str(error["message"]))
            )

    async def enqueue(
        self,
        message: Outbound,
        *,
        key: str,
        derived: bool = False,
        fp: str | None = None,
        inbound_id: str | None = None,
    ) -> str:
        """Journal the send for the sweeper and return its key at once (a recorded key is a
        no-op)."""
        if "idempotency_key" in message.options:
            message = _strip_key(message)
        payload = self._payload(message)
        if payload is None:
            await self._bypass(message, key, inbound_id)
            return key
        texts = self._texts(message)
        for _ in range(4):
            now = self.clock.now()
            values = outbox_sm.new_values(
                key,
                payload,
                texts,
                fp=fp,
                inbound_id=inbound_id,
                now=now,
                lease=None,
                inflight=False,
            )
            ops = [Put(self.out_prefix + v["key"], v, expect=0, due=now) for v in values]
            try:
                await self.kv.commit(ops, label="outbox.enqueue")
            except VersionConflictError:
                answer = await self._answer_existing(key, derived, fp)
                if isinstance(answer, Receipt):
                    return answer.key
                key = answer
                continue
            self._metrics.outbox_journaled += 1
            self.wake.set()
            return key
        raise DurabilityError(f"enqueue {key!r}: the outbox record keeps changing under us")

    # -- the sweeper's transitions --------------------------------------------------------

    async def sweep_once(self, now: float | None = None, *, recovering: bool = False) -> int:
        """One pass: due retries, expired leases, ambiguous sends, split records, purge.

        Returns how many records it acted on. ``recovering`` (the first pass after start)
        also takes this instance's leases of earlier boots whatever their expiry.
        """
        now = self.clock.now() if now is None else now
        until = math.inf if recovering else now
        keys = await self.kv.range(
            "due", self.prefix, until, limit=1_000_000 if recovering else 500
        )
        # Sends first: a replayed handler must find its earlier sends settled (sent,
        # unknown or resent), so that a later reply never overtakes them in the chat.
        keys.sort(key=lambda k: k.startswith(self.in_prefix))
        acted = 0
        for key in keys:
            if key in self._held:
                continue
            nb = self._not_before.get(key)
            if nb is not None and nb > now:
                continue
            try:
                entry = await self.kv.get(key)
                if entry is None:
                    continue
                if key.startswith(self.in_prefix):
                    acted += await self._sweep_inbox(entry, now)
                else:
                    acted += await self._sweep_outbox(entry, now)
            except Exception as exc:
                count = self._fail_counts.get(key, 0) + 1
                self._fail_counts[key] = count
                self._not_before[key] = now + self._in_backoff.delay(count, self.rng)
                log.warning("sweeper: %s failed (%d in a row): %s", key, count, exc)
                await self.hooks.emit("error", exc)
            else:
                if self._fail_counts:
                    self._fail_counts.pop(key, None)
                    self._not_before.pop(key, None)
        acted += await self._purge(now)
        return acted

    async def drain(self, max_passes: int = 100) -> int:
        """Sweep until a pass acts on nothing (tests, shutdown); returns the total."""
        total = 0
        for _ in range(max_passes):
            n = await self.sweep_once()
            total += n
            if n == 0:
                break
        return total

    def _due_now(self, entry: Entry, now: float, ls: str) -> bool:
        return ls == "orphan" or entry.due is None or entry.due <= now

    async def _sweep_inbox(self, entry: Entry, now: float) -> int:
        value = entry.value
        if value.get("state") != "pending":
            return 0
        ls = lease_state(value, self.instance_id, self.boot, now)
        if ls == "live" or not self._due_now(entry, now, ls):
            return 0
        return await self._replay_record(entry, now)

    async def _sweep_outbox(self, entry: Entry, now: float) -> int:
        value = entry.value
        state = value.get("state")
        if state not in ("pending", "failed"):
            return 0
        ls = lease_state(value, self.instance_id, self.boot, now)
        if ls == "live" or not self._due_now(entry, now, ls):
            return 0
        previous = value.get("previous_part")
        if previous is not None:
            prev = await self.kv.get(self.out_prefix + previous)
            if prev is not None:
                pstate = prev.value.get("state")
                if pstate == "dead":
                    error = {
                        "type": "PreviousPartDead",
                        "message": f"an earlier part ({previous}) is dead",
                        "retryable": False,
                    }
                    try:
                        await self.kv.commit(
                            [
                                Put(
                                    entry.key,
                                    outbox_sm.dead_value(value, now, error),
                                    expect=entry.version,
                                )
                            ],
                            label="outbox.mark_dead",
                        )
                    except VersionConflictError:
                        return 0
                    self._metrics.outbox_dead += 1
                    await self.hooks.emit(
                        DEAD, DeadEvent("outbox", value["key"], str(error["message"]))
                    )
                    return 1
                if pstate not in ("sent", "unknown"):
                    wait = dict(value)
                    wait.update(lease=None, updated=now)
                    later = max(prev.due or 0.0, now + max(self.config.poll, 0.001))
                    with contextlib.suppress(VersionConflictError):
                        await self.kv.commit(
                            [Put(entry.key, wait, expect=entry.version, due=later)],
                            label="outbox.wait",
                        )
                    return 0
        resend = False
        if value.get("inflight") and ls in ("expired", "orphan"):
            chat_id = value["payload"]["chat_id"]
            if self.config.outbox.on_ambiguous == "skip":
                taken = claim_value(value, self.instance_id, self.boot, now, self._out_lease)
                try:
                    await self.kv.commit(
                        [
                            Put(
                                entry.key,
                                {**outbox_sm.unknown_value(taken, now), "ambiguous": True},
                                expect=entry.version,
                            )
                        ],
                        label="outbox.mark_unknown",
                    )
                except VersionConflictError:
                    return 0
                self._metrics.outbox_ambiguous += 1
                log.warning("send %s is ambiguous after a crash: marked unknown", value["key"])
                await self.hooks.emit(AMBIGUOUS, AmbiguousEvent(value["key"], chat_id, False))
                return 1
            resend = True
        return await self._deliver_background(entry, now, resend=resend)

    async def _deliver_background(self, entry: Entry, now: float, *, resend: bool) -> int:
        value = entry.value
        claimed = claim_value(value, self.instance_id, self.boot, now, self._out_lease)
        claimed.update(state="pending", inflight=True, attempts=int(value.get("attempts", 0)) + 1)
        if resend:
            claimed["ambiguous"] = True
        ops: list[Put] = []
        text = value["payload"].get("text")
        limit = self.provider.text_limit
        if (
            isinstance(text, str)
            and limit
            and len(text) > limit
            and value.get("parts", 1) == 1
            and value.get("previous_part") is None
        ):
            texts = split_text(text, limit)
            claimed["payload"] = {**value["payload"], "text": texts[0]}
            claimed["parts"] = len(texts)
            rest = outbox_sm.new_values(
                value["key"],
                value["payload"],
                list(texts),
                fp=None,
                inbound_id=value.get("inbound_id"),
                now=now,
                lease=None,
                inflight=False,
            )[1:]
            existing = await self.kv.get_many([self.out_prefix + v["key"] for v in rest])
            ops = [
                Put(self.out_prefix + v["key"], v, expect=0, due=now)
                for v in rest
                if self.out_prefix + v["key"] not in existing
            ]
        due = now + self._out_lease
        try:
            versions = await self.kv.commit(
                [Put(entry.key, claimed, expect=entry.version, due=due), *ops], label="outbox.claim"
            )
        except VersionConflictError:
            return 0
        if resend:
            self._metrics.outbox_ambiguous += 1
            log.warning("send %s is ambiguous after a crash: sending it again", value["key"])
            await self.hooks.emit(
                AMBIGUOUS, AmbiguousEvent(value["key"], value["payload"]["chat_id"], True)
            )
        elif claimed["attempts"] > 1:
            self._metrics.outbox_retried += 1
        held = Held(entry.key, claimed["token"], versions[0], claimed, self._out_lease, due)
        self._held[entry.key] = held
        message = decode_outbound(claimed["payload"])
        try:
            async with self._chat_lock(message.chat_id):
                try:
                    result = await self.provider.send(message)
                except Exception as exc:
                    now = self.clock.now()
                    attempts = int(claimed["attempts"])
                    if (
                        not getattr(exc, "retryable", True)
                        or attempts >= self.config.outbox.retries + 1
                    ):
                        await self._mark_dead(held, exc, now)
                        return 1
                    floor = exc.retry_after if isinstance(exc, RateLimitedError) else 0.0
                    delay = self._out_backoff.delay(attempts, self.rng, floor)
                    await self._update(
                        held,
                        outbox_sm.failed_value(held.value, now, error_of(exc), None),
                        "outbox.mark_failed",
                        due=now + delay,
                    )
                    return 1
                await self._mark_sent(held, result.message_id, background=True)
                return 1
        finally:
            self._held.pop(entry.key, None)

    async def _purge(self, now: float) -> int:
        keys = await self.kv.range("purge", self.prefix, now, limit=500)
        if not keys:
            return 0
        entries = await self.kv.get_many(keys)
        ops = [
            Delete(e.key, expect=e.version)
            for e in entries.values()
            if e.purge is not None and e.purge <= now and e.value.get("state") in ("done", "sent")
        ]
        if not ops:
            return 0
        try:
            await self.kv.commit(ops, label="retention.purge")
        except VersionConflictError:
            return 0
        return len(ops)

    # -- operator actions -----------------------------------------------------------------

    async def replay_inbound(self, inbound_id: str) -> None:
        """Process inbound ``inbound_id`` again (dead or done), with a fresh attempt budget;
        its sends that already went out are answered from the outbox."""
        key = self.in_prefix + inbound_id
        entry = await self.kv.get(key)
        if entry is None:
            raise RecordStateError(inbound_id, None, "no inbox record under this id in this scope")
        now = self.clock.now()
        state = entry.value.get("state")
        if (
            state == "pending"
            and lease_state(entry.value, self.instance_id, self.boot, now) == "live"
        ):
            raise RecordStateError(inbound_id, state, "it is being processed now; try again later")
        await self.kv.commit(
            [Put(key, inbox_sm.replay_value(entry.value, now), expect=entry.version, due=now)],
            label="inbox.replay",
        )
        self.wake.set()

    async def retry_send(self, key: str) -> None:
        """Send ``key`` again (dead, failed or unknown): pending, with a fresh retry budget."""
        rkey = self.out_prefix + key
        entry = await self.kv.get(rkey)
        if entry is None:
            raise RecordStateError(key, None, "no outbox record under this key in this scope")
        state = entry.value.get("state")
        if state not in ("dead", "failed", "unknown"):
            raise RecordStateError(key, state, "only dead, failed or unknown sends can be retried")
        now = self.clock.now()
        await self.kv.commit(
            [Put(rkey, outbox_sm.retry_value(entry.value, now), expect=entry.version, due=now)],
            label="outbox.retry",
        )
        self.wake.set()


def _strip_key(message: Outbound) -> Outbound:
    options = {k: v for k, v in message.options.items() if k != "idempotency_key"}
    return replace(message, options=options)


def resolve_backend(backend: object) -> KvDurability:
    """``DurabilityConfig.backend`` as a ``KvDurability``: ``None`` (memory), a URL, a
    ``DurableKv`` or a ``KvDurability``."""
    if backend is None:
        return MemoryDurability()
    if isinstance(backend, KvDurability):
        return backend
    if isinstance(backend, str):
        from state.backends import open_backend  # noqa: PLC0415 - URL backends load lazily

        url = backend
        scheme = url.partition("://")[0]

        async def opener() -> DurableKv:
            return await open_backend(url)

        return KvDurability(opener=opener, name=f"{scheme}://")
    if isinstance(backend, DurableKv):
        return KvDurability(backend)
    raise ConfigError(
        "backend",
        f"expected a URL such as 'memory://' or 'file:///path', a DurableKv or a "
        f"KvDurability, got {type(backend).__name__}",
    )
