"""Delivery: calling the provider for a journaled send and recording what came of it.

One retry decision (``OutboxConfig.retry_policy()``) serves the inline path (``ctx.reply``
retrying up to ``outbox.inline_max``) and the background path (the sweeper); one dead-letter
path (``dead``) serves final errors, spent retries and parts after a dead part; every
settled send (``sent``, ``dead``, ``unknown``) goes through ``settle``, which emits its event
and hands its receipt to the runtime's receipts sink, when there is one.

A part never goes out before the part before it settled: a part waits while the earlier
one is pending or failed (not charged as an attempt), dies with it when it is dead, and
becomes ``unknown`` with it when its outcome was lost in a crash.

With ``provider_session="leader"`` a replica that does not hold the provider session never
calls the provider: its sweeper leaves sends alone, and an attempt refused right before
the call (``ProviderNotLeaderError``, the lease lost meanwhile) hands the record back as it
was before the claim (``hand_back``: the attempt not charged, due now) for the leader.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any

from botmesh.state import records
from botmesh.state.backoff import PARK_GRACE, GiveUp, park_delay
from botmesh.state.common import Common
from botmesh.state.config import OutboxConfig
from botmesh.state.edits import change_message
from botmesh.state.errors import (
    FencedError,
    ProviderNotLeaderError,
    RateLimitedError,
    Reason,
    SendDeferredError,
    SendError,
    SendExpiredError,
    VersionConflictError,
)
from botmesh.state.events import AmbiguousEvent, DeadEvent, FallbackEvent, SentEvent
from botmesh.state.fallback import Route, fallback_key, fallback_payload, routed, switches
from botmesh.state.kv import Entry, Op, Put, handover
from botmesh.state.lease import Held
from botmesh.state.message_log import MessageLog
from botmesh.state.messages import Outbound, OutboxState, Receipt, SendResult
from botmesh.state.order import ChatOrder, last_part
from botmesh.state.outbox import new_values, part_payloads
from botmesh.state.pacing import Pacer
from botmesh.state.ports import (
    AmbiguityResolver,
    Provider,
    call_send,
    posts_statuses,
    timed_send,
)
from botmesh.state.records import SETTLED, Json, revise
from botmesh.state.splitter import split_text, text_length, unit_of
from botmesh.state.statuses import index_ops
from botmesh.state.writes import Write

__all__ = ["Delivery", "send_direct"]


log = logging.getLogger("botmesh.delivery")


_SETTLE_LABEL = {
    OutboxState.SENT: Write.OUTBOX_MARK_SENT,
    OutboxState.DEAD: Write.OUTBOX_MARK_DEAD,
    OutboxState.UNKNOWN: Write.OUTBOX_MARK_UNKNOWN,
    OutboxState.CANCELLED: Write.OUTBOX_CANCEL,
}
#: The settled states a send's record is purged in after ``retention.sent``.
_PURGED = frozenset({OutboxState.SENT, OutboxState.CANCELLED})


def _closed(value: Json, now: float, state: OutboxState, **changes: Any) -> Json:
    """A send's record in a settled ``state``: no longer in flight, no longer leased."""
    return revise(value, now, state=state, inflight=None, lease=None, **changes)


async def send_direct(
    provider: Provider,
    message: Outbound,
    key: str,
    inbound_id: str | None,
    *,
    part: int,
    now: float,
) -> Receipt:
    """Call the provider for a send that is not journaled; its receipt."""
    result = await call_send(provider, message, key)
    return Receipt(
        key=key,
        chat_id=message.chat_id,
        message_id=result.message_id,
        state=OutboxState.SENT,
        inbound_id=inbound_id,
        part=part,
        ts=now,
    )


_SUPERSEDED = records.encode_error(
    "SupersededByFallback",
    "the first part of this text went out as its fallback, which replaces the whole text",
    retryable=False,
    reason=Reason.SUPERSEDED_BY_FALLBACK,
)


def _fell_back(value: Json) -> bool:
    """Whether a send's record switched to its fallback."""
    spec = value.get("fallback")
    return isinstance(spec, dict) and bool(spec.get("used"))


def _channel_of(value: Json) -> str | None:
    """The fallback channel a send's record switched to (``None``: the bot's own)."""
    spec = value.get("fallback")
    return spec.get("channel") if isinstance(spec, dict) and spec.get("used") else None


def _later_parts(
    key: str, payloads: list[Json], first: Json, now: float, lease: Json | None
) -> list[Json]:
    """The records of parts 2, 3… of a send whose text was split in ``payloads``, part 1
    being the record ``first``: each under a part key of ``key``, after the part before it
    (``previous_part``), of ``first``'s inbound; leased to this engine when ``lease``."""
    rest = new_values(
        key,
        payloads[1:],
        first_part=2,
        parts=len(payloads),
        fp=None,
        inbound_id=first.get("inbound_id"),
        now=now,
        lease=lease,
        after=None,
    )
    rest[0]["previous_part"] = first["key"]
    return rest


def _fate_of(previous: str, state: OutboxState, cause: object = None) -> Json:
    """The error of a part that shares the fate of an earlier part, dead or unknown."""
    dead = state == OutboxState.DEAD
    what = "is dead" if dead else "has an unknown outcome"
    return records.encode_error(
        "PreviousPartDead" if dead else "PreviousPartUnknown",
        f"an earlier part ({previous}) {what}" + (f": {cause}" if cause else ""),
        retryable=not dead,
        reason=Reason.PREVIOUS_PART_DEAD if dead else Reason.PREVIOUS_PART_UNKNOWN,
    )


_AMBIGUOUS = records.encode_error(
    "Ambiguous",
    "the process stopped between calling the provider and recording it",
    retryable=True,
    reason=Reason.AMBIGUOUS,
)


def _undeliverable(value: Json) -> Json | None:
    """The error of a journaled send whose payload is no send (journaled by code that did
    not check sends when they were built: no chat id, media given as a string…), else
    ``None``. Such a send can never go out: it is dead-lettered at once, never retried."""
    payload = value.get("payload")
    try:
        if not isinstance(payload, dict):
            raise TypeError(f"the payload is {type(payload).__name__}, not an object")
        records.decode_outbound(payload)
    except Exception as exc:
        chat = payload.get("chat_id") if isinstance(payload, dict) else None
        missing = chat is None or chat == ""
        return records.encode_error(
            "BadRecord",
            f"the journaled send is invalid ({exc}); it was never sent. Operator action: "
            "send it again with a valid chat id and content, then discard this record",
            retryable=False,
            reason=Reason.MISSING_CHAT_ID if missing else Reason.WRONG_TYPE,
        )
    return None


def _past_deadline(value: Json, now: float) -> bool:
    """Whether a send's deadline passed while it may still be stopped: never a send that
    may have gone out already (``ambiguous``: found in flight after a crash)."""
    deadline = value.get("deadline")
    return deadline is not None and now >= deadline and not value.get("ambiguous")


def _late(value: Json, now: float) -> bool:
    """Whether a send's deadline passed (whatever may have happened to it before)."""
    deadline = value.get("deadline")
    return deadline is not None and now >= deadline


def _expired(value: Json, cause: object = None) -> Json:
    """The error of a send whose deadline passed before it was delivered."""
    when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(float(value["deadline"])))
    return records.encode_error(
        "SendExpired",
        f"not delivered by its deadline ({when}); never sent"
        + (f" (last error: {cause})" if cause else ""),
        retryable=False,
        reason=Reason.EXPIRED,
    )


class _Skipped(Exception):
    """An ambiguous send the channel could not resolve was marked unknown (``skip``)."""


class Delivery:
    """Provider calls, retries, dead letters and settled sends of one engine."""

    def __init__(
        self,
        common: Common,
        *,
        config: OutboxConfig,
        poll: float,
        provider: Provider,
        order: ChatOrder,
        fallbacks: Mapping[str, Provider] | None = None,
        message_log: MessageLog | None = None,
        pacers: Mapping[str | None, Pacer] | None = None,
    ) -> None:
        self._common = common
        #: The pacing of each channel under its rate limits (``botmesh.state.pacing``), by
        #: fallback channel name (``None``: the bot's own channel); only paced ones.
        self._pacers = {name: p for name, p in (pacers or {}).items() if p.limited}
        #: Logs each part recorded ``sent``, in that same commit (``botmesh.state.message_log``);
        #: a new log entry goes in the partition of its send's record (``self._common.near``).
        self._message_log = message_log
        #: The channels a send's fallback may name, by name (``Fallback.channel``).
        self._fallbacks = dict(fallbacks or {})
        self._prefix = common.keys.outbox
        self._on_ambiguous = config.on_ambiguous
        self._poll = poll
        self._provider = provider
        self._order = order
        self._retries = config.retry_policy()
        self._lease = config.lease
        self._inline_max = config.inline_max
        #: The later parts of a fallback split to its channel's limit, journaled leased to
        #: this engine by an inline switch, by the key of the send that switched: the
        #: inline delivery sends them next (``deliver_inline``).
        self._fallback_parts: dict[str, list[tuple[Held, Outbound]]] = {}

    # -- inline ---------------------------------------------------------------------------

    async def deliver_inline(
        self, helds: list[Held], outs: list[Outbound], started: float
    ) -> Receipt:
        """Deliver the journaled parts of one send in order; the receipt of the first."""
        helds, outs = list(helds), list(outs)
        for held in helds:
            self._common.leases.held[held.key] = held
        first: Receipt | None = None
        try:
            i = -1
            while i + 1 < len(helds):
                i += 1
                held = helds[i]
                if (
                    i > 0
                    and _fell_back(helds[i - 1].value)
                    and not _fell_back(held.value)  # a part of the fallback's own text goes
                ):  # the fallback replaced the text
                    for rest in helds[i:]:
                        with contextlib.suppress(FencedError):
                            await self.dead(rest, _SUPERSEDED, background=False)
                    break
                if i > 0:
                    await self.pace(held.value["payload"]["chat_id"], held.value)
                    await self._common.leases.reclaim(held, self._lease)
                try:
                    try:
                        receipt = await self._attempt_inline(held, outs[i], started)
                    finally:
                        # the switch to a fallback whose text is over its channel's limit
                        # journaled its later parts: they go next, before the send's own
                        extra = self._fallback_parts.pop(held.key, [])
                        for added in extra:
                            self._common.leases.held[added[0].key] = added[0]
                        helds[i + 1 : i + 1] = [h for h, _ in extra]
                        outs[i + 1 : i + 1] = [m for _, m in extra]
                except ProviderNotLeaderError:  # the leader's sweeper delivers it
                    receipt = await self.hand_back(held, inflight=False)
                    await self._release(helds[i + 1 :])
                    return first or receipt
                except SendDeferredError:
                    await self._release(helds[i + 1 :])
                    raise
                except FencedError:
                    raise
                except Exception as exc:
                    if held.value.get("state") == OutboxState.DEAD:
                        await self._cascade(helds[i + 1 :], held.value["key"], exc)
                    raise
                first = first or receipt
        finally:
            for held in helds:
                self._common.leases.held.pop(held.key, None)
        assert first is not None
        return first

    async def _attempt_inline(self, held: Held, message: Outbound, started: float) -> Receipt:
        while True:
            if held.fenced:
                raise FencedError(held.key, held.token, None)
            if _past_deadline(held.value, self._common.clock.now()):
                await self.expire(held, None, background=False)
                raise SendExpiredError(held.value["key"], float(held.value["deadline"]))
            if self._common.leader is not None:
                await self._common.leader.ensure()
            try:
                result = await self._call(routed(held.value, message))
            except ProviderNotLeaderError:
                raise
            except Exception as exc:
                delay = await self._failed(held, exc, started)
                if _fell_back(held.value):  # it switched to its fallback: send that now
                    message = records.decode_outbound(held.value["payload"])
                if delay is None:
                    if (held.value.get("error") or {}).get("reason") == Reason.EXPIRED:
                        deadline = float(held.value["deadline"])
                        raise SendExpiredError(held.value["key"], deadline, str(exc)) from exc
                    if held.value.get("state") == OutboxState.DEAD:
                        raise
                    self._common.metrics.outbox_deferred += 1
                    raise SendDeferredError(held.value["key"], str(exc)) from exc
                await self._common.clock.sleep(delay)
                await self.pace(message.chat_id, held.value)
                await self._common.leases.reclaim(held, self._lease)
                self._common.metrics.outbox_retried += 1
                continue
            return await self.sent(held, result.message_id, background=False)

    async def _failed(self, held: Held, exc: Exception, started: float | None) -> float | None:
        """Record a failed attempt with the one retry decision. Returns the delay to wait
        before retrying inline now; ``None`` when the send is dead or left to the sweeper."""
        if switches(held.value, exc) is not None:
            # the attempt that fails with an error its fallback names switches now, even a
            # retryable one (``Fallback(on=("RateLimitedError",))``): never after retries
            return await self._fall_back(held, exc, started)
        now = self._common.clock.now()
        attempts = int(held.value.get("attempts", 1))
        decision = self._retries.decide(exc, attempts, self._common.rng)
        if isinstance(decision, GiveUp):
            log.error("send %s dead-lettered: %s", held.value["key"], exc)
            await self.dead(
                held, records.error_of(exc, decision.reason), background=started is None
            )
            return None
        if _past_deadline(held.value, now + decision.delay):  # its next try comes too late
            await self.expire(held, exc, background=started is None)
            return None
        inline = started is not None and now + decision.delay - started <= self._inline_max
        lease = self._common.leases.lease(now, decision.delay + self._lease) if inline else None
        parked = not inline and self._common.publisher is not None and self._common.publisher.parks
        retry_at = now + (park_delay(decision.delay) if parked else decision.delay)
        failed = revise(
            held.value,
            now,
            state=OutboxState.FAILED,
            inflight=None,
            lease=lease,
            error=records.error_of(exc, None),
            failed_first=held.value.get("failed_first", now),
            retry_at=retry_at if parked else None,
        )
        due = lease["until"] if lease is not None else retry_at
        if parked:  # the tier brings it back; the sweeper only if the parked record is lost
            due += PARK_GRACE
        await self._common.leases.write(held, failed, Write.OUTBOX_MARK_FAILED, due=due)
        if inline:
            return decision.delay
        self._common.leases.held.pop(held.key, None)
        self._order.block(failed)
        if parked and self._common.publisher is not None:
            await self._common.publisher.park(failed, retry_at)
        self._common.wake.set()
        return None

    async def _fall_back(self, held: Held, exc: Exception, started: float | None) -> float | None:
        """Switch a send to its fallback, once, in one journal write: from now on every
        attempt (inline now, or the sweeper's, also after a crash) sends the fallback
        under its own key. Returns 0 (retry inline at once) or ``None`` (the sweeper)."""
        fallback = switches(held.value, exc)
        assert fallback is not None
        now = self._common.clock.now()
        key = held.value["key"]
        spec = {**held.value["fallback"], "used": True, "key": fallback_key(key)}
        inline = started is not None
        payloads = self.fallback_texts(fallback_payload(held.value["payload"], fallback), spec)
        if len(payloads) > 1:
            spec["parts"] = len(payloads)
        switched = revise(
            held.value,
            now,
            state=OutboxState.PENDING,
            inflight=None,
            attempts=0,
            lease=self._common.leases.lease(now, self._lease) if inline else None,
            payload=payloads[0],
            fallback=spec,
            error=records.error_of(exc, None),
        )
        rest = await self._fallback_rest(switched, payloads, now, inline=inline)
        extra = [handover(self._prefix + v["key"], v, expect=0, due=now) for v in rest]
        await self._common.leases.write(held, switched, Write.OUTBOX_FALLBACK, due=now, extra=extra)
        log.info(
            "send %s refused (%s): sending its fallback %s", key, type(exc).__name__, spec["key"]
        )
        await self._common.emit(
            FallbackEvent(key, spec["key"], type(exc).__name__, fallback.channel)
        )
        if inline:
            if rest:
                got = await self._common.kv.get_many([op.key for op in extra])
                self._fallback_parts[held.key] = [
                    (
                        Held(op.key, 1, got[op.key].version, v, self._lease, v["lease"]["until"]),
                        records.decode_outbound(v["payload"]),
                    )
                    for op, v in zip(extra, rest, strict=True)
                    if op.key in got
                ]
            return 0.0  # the caller takes a new attempt on it at once
        self._common.leases.held.pop(held.key, None)
        self._common.wake.set()
        return None

    def fallback_texts(self, payload: Json, spec: Json) -> list[Json]:
        """The payload of each part of a fallback: its text split to the limit of the
        channel it goes out through (its own, else the send's), as any send's is."""
        text = payload.get("text")
        channel = spec.get("channel")
        provider = self._provider if channel is None else self._fallbacks.get(channel)
        limit = provider.text_limit if provider is not None else None
        if not isinstance(text, str) or provider is None or not limit:
            return [payload]
        unit = unit_of(provider)
        if text_length(text, unit) <= limit:
            return [payload]
        return part_payloads(payload, list(split_text(text, limit, unit)))

    async def _fallback_rest(
        self, switched: Json, payloads: list[Json], now: float, *, inline: bool
    ) -> list[Json]:
        """The records of a fallback's parts 2, 3… (``<key>~fallback#2``…), journaled with
        the switch: each goes out under its own key, through the fallback's channel, after
        the part before it (``previous_part``: part 1 is the send's own record)."""
        if len(payloads) < 2:
            return []
        spec = {k: v for k, v in switched["fallback"].items() if k != "parts"}
        lease = self._common.leases.lease(now, self._lease) if inline else None
        rest = _later_parts(spec["key"], payloads, switched, now, lease)
        rest[0].pop("inflight", None)  # leased for the inline delivery, not yet attempted
        rest[0]["attempts"] = 0
        for value in rest:
            value["fallback"] = {**spec, "key": value["key"]}
        return await self._unjournaled(rest)

    async def _unjournaled(self, values: list[Json]) -> list[Json]:
        """The records of ``values`` the journal does not hold yet (an earlier attempt may
        have journaled them)."""
        existing = await self._common.kv.get_many([self._prefix + v["key"] for v in values])
        return [v for v in values if self._prefix + v["key"] not in existing]

    async def pace(self, chat_id: str, value: Json | None = None) -> None:
        """Wait for the send's slot under its channel's rate limits (the bot's channel, or
        the fallback ``value`` switched to). Taken before the send is marked in flight (a
        journal write), never after: a crash while it waits leaves nothing ambiguous."""
        if self._pacers:
            pacer = self._pacers.get(_channel_of(value) if value is not None else None)
            if pacer is not None:
                await pacer.wait(chat_id)

    async def _call(self, route: Route) -> SendResult:
        """One provider call: the send's own channel, or its fallback's (its slot under
        that channel's rate limits taken before it was marked in flight: ``pace``; the
        calls spaced again here; a 429's Retry-After pauses the channel)."""
        provider = self._channel(route)
        pacer = self._pacers.get(route.channel) if self._pacers else None
        if pacer is not None:
            await pacer.spacing()
        try:
            if route.op is not None:
                return await change_message(provider, route)
            return await timed_send(provider, route.message, route.key, self._common.timings)
        except RateLimitedError as exc:
            if pacer is not None:
                pacer.refused(exc.retry_after)
            raise

    async def _paced_later(self, entry: Entry, now: float) -> bool:
        """The sweeper's send whose chat's next slot is more than a sweeper poll away: left
        due at that slot (not an attempt; no lease) and ``True``, so that the sweeper goes on
        with other chats instead of sleeping on this one. A shorter wait is slept before the
        claim (``pace``), as a wait for the channel's slot is."""
        value = entry.value
        route = routed(value, records.decode_outbound(value["payload"]))
        pacer = self._pacers.get(route.channel)
        if pacer is None:
            return False
        ready = pacer.chat_ready(route.message.chat_id)
        if ready <= now + self._poll:
            return False
        await self._common.leases.write(
            entry, revise(value, now, lease=None), Write.OUTBOX_WAIT, due=ready
        )
        return True

    def _channel(self, route: Route) -> Provider:
        if route.channel is None:
            return self._provider
        provider = self._fallbacks.get(route.channel)
        if provider is None:
            raise SendError(
                f"the fallback names the channel {route.channel!r}, which this runtime was "
                f"not given (fallback channels: {', '.join(sorted(self._fallbacks)) or 'none'}"
                "); give it with botmesh.run(..., fallbacks={name: provider}) or the "
                "worker's BOTMESH_FALLBACK_PROVIDERS",
                retryable=False,
            )
        return provider

    async def _release(self, helds: list[Held]) -> None:
        """Later parts of a deferred send: drop our lease, leave them to the sweeper."""
        now = self._common.clock.now()
        for held in helds:
            try:
                await self._common.leases.write(
                    held, revise(held.value, now, lease=None), Write.OUTBOX_RELEASE, due=now
                )
            except FencedError:
                continue
            finally:
                self._common.leases.held.pop(held.key, None)

    async def _cascade(self, helds: list[Held], previous: str, exc: BaseException) -> None:
        for held in helds:
            error = _fate_of(previous, OutboxState.DEAD, exc)
            try:
                await self.dead(held, error, background=False)
            except FencedError:
                continue

    # -- settling -------------------------------------------------------------------------

    async def sent(self, held: Held, message_id: str, *, background: bool) -> Receipt:
        now = self._common.clock.now()
        value = _closed(held.value, now, OutboxState.SENT, message_id=message_id, error=None)
        receipt = await self._settle(held, value, now, background=background)
        assert receipt is not None  # a holder's write lands or raises FencedError
        return receipt

    async def dead(self, target: Held | Entry, error: Json, *, background: bool) -> bool:
        """The one dead-letter path of a send (held, or read by the sweeper)."""
        now = self._common.clock.now()
        first = target.value.get("failed_first", now)
        value = _closed(target.value, now, OutboxState.DEAD, error=error, failed_first=first)
        if await self._settle(target, value, now, background=background) is None:
            return False
        self._common.metrics.outbox_dead += 1
        key = value["key"]
        await self._common.emit(DeadEvent("outbox", key, Reason(error["reason"]), error["message"]))
        return True

    async def expire(self, target: Held | Entry, cause: object, *, background: bool) -> bool:
        """A send whose deadline passed before it was delivered: dead, reason ``expired``
        (its dead letter and receipt follow, as for any dead send)."""
        key = target.value["key"]
        if not await self.dead(target, _expired(target.value, cause), background=background):
            return False
        self._common.metrics.outbox_expired += 1
        log.warning("send %s expired: not delivered by its deadline", key)
        return True

    async def cancel(self, entry: Entry) -> Receipt | None:
        """A send that has not gone out, cancelled: settled ``cancelled`` (its receipt
        follows), never sent. ``None`` when someone wrote the record first."""
        now = self._common.clock.now()
        value = _closed(entry.value, now, OutboxState.CANCELLED, error=None)
        receipt = await self._settle(entry, value, now, background=True)
        if receipt is not None:
            self._common.metrics.outbox_cancelled += 1
        return receipt

    async def _unknown(self, entry: Entry, now: float, error: Json, *, ambiguous: bool) -> int:
        taken = self._common.leases.claimed(entry.value, now, self._lease)
        value = _closed(taken, now, OutboxState.UNKNOWN, error=error, ambiguous=ambiguous or None)
        if await self._settle(entry, value, now, background=True) is None:
            return 0
        if ambiguous:
            await self._ambiguous(value, resent=False)
        return 1

    async def _ambiguous(self, value: Json, *, resent: bool) -> None:
        self._common.metrics.outbox_ambiguous += 1
        what = "sending it again" if resent else "marked unknown"
        log.warning("send %s is ambiguous after a crash: %s", value["key"], what)
        await self._common.emit(
            AmbiguousEvent(value["key"], value["payload"]["chat_id"], resent=resent)
        )

    async def _settle(
        self,
        target: Held | Entry,
        value: Json,
        now: float,
        *,
        background: bool,
        label: Write | None = None,
        extra: Sequence[Op] = (),
    ) -> Receipt | None:
        """Write a settled state, then tell the world: the event, the receipt, the chat.
        ``None`` when someone else wrote the record first (an ``Entry`` target). ``label``
        and ``extra`` (operations of the same commit) are a delivery state's change
        (``botmesh.state.statuses``): no ``sent`` event again."""
        state: OutboxState = value["state"]
        due: float | None = None
        publisher = self._common.publisher
        rides = publisher is not None and publisher.rides
        if publisher is not None:
            # riding with the record, the receipt is published when the record is written
            value["published"] = rides
            due = None if rides else now + self._lease
        purge = self._common.retention.purge_at(now) if state in _PURGED else None
        change = label is not None
        label = label or _SETTLE_LABEL[state]
        logged = self._riders(target, value, now, purge) if not change else []
        receipt = records.receipt_of(value, now)
        # the receipt handed over with the record, in the same transaction (no await
        # between ``ride`` and the write: a record of the key produced meanwhile would
        # take it without the settled state)
        back = await publisher.ride(target.key, receipt, value) if rides and publisher else None
        try:
            with self._common.near(target.key) if logged else contextlib.nullcontext():
                written = await self._common.leases.write(
                    target, value, label, due=due, purge=purge, before=logged, extra=extra
                )
            if not written:
                if back is not None:
                    back()
                return None
        except BaseException:
            if back is not None:
                back()
            raise
        if isinstance(target, Held):
            self._common.leases.held.pop(target.key, None)
        self._order.unblock(value)
        if state == OutboxState.SENT and not change:
            await self._common.emit(SentEvent(receipt, background))
        if publisher is not None and not rides:
            await publisher.publish(receipt, value=value)
        return receipt

    def _riders(
        self, target: Held | Entry, value: Json, now: float, purge: float | None
    ) -> list[Op]:
        """What rides ahead of a send's record in the commit that records it ``sent``: its
        message log entry, and its name under the channel's message id when the channel
        posts status webhooks."""
        if value["state"] != OutboxState.SENT:
            return []
        # a send is recorded sent by its holder only (a Held): its log entry rides in that
        # very commit, ahead of the record (on Kafka two changelog records, in that order),
        # so a crash leaves both, neither, or the entry alone, which proves the send went
        # out (``_found_in_log``) (botmesh.state.message_log)
        logged = (
            list(self._message_log.entry_ops(value, now))
            if self._message_log is not None
            and isinstance(target, Held)
            and not value.get("op")  # an edit or a delete is no message of the log
            else []
        )
        named = (
            index_ops(self._common.keys, value, purge)
            if posts_statuses(self._resolver_of(value))
            else []
        )
        return [*logged, *named]

    async def record_delivery(
        self, target: Entry, value: Json, *, extra: Sequence[Op] = ()
    ) -> Receipt | None:
        """Write a sent (or dead) send's new delivery state (``botmesh.state.statuses``),
        with ``extra`` in the same commit, and publish its receipt; ``None`` when someone
        wrote the record first."""
        now = self._common.clock.now()
        return await self._settle(
            target, value, now, background=True, label=Write.OUTBOX_DELIVERY, extra=extra
        )

    async def bypass(
        self, message: Outbound, key: str, inbound_id: str | None, part: int
    ) -> Receipt:
        """Send without the journal (too large, not JSON, or ``fail_open``); counted."""
        if (
            self._common.leader is not None
        ):  # it cannot be journaled, so it cannot wait for the leader
            await self._common.leader.ensure()
        self._common.metrics.outbox_bypassed += 1
        await self.pace(message.chat_id)
        now = self._common.clock.now()
        receipt = await send_direct(self._provider, message, key, inbound_id, part=part, now=now)
        await self._common.emit(SentEvent(receipt, False))
        if self._common.publisher is not None:
            await self._common.publisher.publish(receipt, journaled=False)
        return receipt

    # -- background (the sweeper) -----------------------------------------------------------

    async def due(self, entry: Entry, now: float) -> int:
        """A pending or failed send whose time came: wait its turn, resolve an ambiguous
        send, or deliver it. Returns how many records it acted on."""
        value = entry.value
        ls = self._common.leases.state(value, now)
        if ls == "live" or not (ls == "orphan" or entry.due is None or entry.due <= now):
            return 0
        if self._common.leader is not None and not self._common.leader.may_send(now):
            return 0  # a standby: left to the leader, nothing written
        if not value.get("inflight"):
            if value.get("at", 0.0) > now:  # a scheduled send never goes out early
                return 0
            if _past_deadline(value, now):
                return int(await self.expire(entry, None, background=True))
        gated = await self._gate(entry, now)
        if gated is not None:
            return gated
        if value.get("inflight") and ls in ("expired", "orphan"):
            if value.get("op"):  # an edit or a delete: the same change again is harmless
                return await self._deliver(entry, now, resend=True)
            found = await self._found_in_log(entry, now)
            if found is not None:
                return found
            if isinstance(self._resolver_of(value), AmbiguityResolver):
                return await self._deliver(entry, now, resend=True, ask=True)
            if self._on_ambiguous == "skip":
                return await self._unknown(entry, now, _AMBIGUOUS, ambiguous=True)
            return await self._deliver(entry, now, resend=True)
        return await self._deliver(entry, now, resend=False)

    async def _found_in_log(self, entry: Entry, now: float) -> int | None:
        """A send left in flight whose log entry is in the journal: its ``sent`` commit was
        cut after the entry (on Kafka a kill between two changelog records), and the entry
        holds what the channel answered. Recorded ``sent`` from it, with its message id:
        nothing is sent or logged again. ``None`` when no entry names the send."""
        if self._message_log is None:
            return None
        value = entry.value
        found = await self._message_log.find(value["payload"]["chat_id"], value["key"])
        if found is None:
            return None
        taken = self._common.leases.claimed(value, now, self._lease)
        sent = _closed(taken, now, OutboxState.SENT, message_id=found.message_id, error=None)
        if await self._settle(entry, sent, now, background=True) is None:
            return 0
        log.warning(
            "send %s was in flight at a crash and its log entry says the channel took it "
            "(message id %s): recorded sent, not sent again",
            value["key"],
            found.message_id,
        )
        return 1

    async def _gate(self, entry: Entry, now: float) -> int | None:
        """``None`` when the send may go now; else what was done (it waits, or shares the
        fate of its earlier part)."""
        value = entry.value
        previous = value.get("previous_part")
        if previous is not None:
            prev = await self._common.kv.get(self._prefix + previous)
            state = prev.value.get("state") if prev is not None else None
            if state == OutboxState.DEAD:
                error = _fate_of(previous, OutboxState.DEAD)
                return int(await self.dead(entry, error, background=True))
            if state == OutboxState.UNKNOWN:
                error = _fate_of(previous, OutboxState.UNKNOWN)
                return await self._unknown(entry, now, error, ambiguous=False)
            if (
                state == OutboxState.SENT
                and prev is not None
                and _fell_back(prev.value)
                and not _fell_back(value)  # a part of the fallback's own text goes
            ):
                return int(await self.dead(entry, _SUPERSEDED, background=True))
            if prev is not None and state != OutboxState.SENT:
                await self._wait(entry, prev, now)
                return 0
        after = value.get("after")
        if after is None and value.get("at") is not None:
            return await self._take_turn(entry, now)
        if after is not None:
            prev = await self._common.kv.get(self._prefix + after)
            if prev is not None and prev.value.get("state") not in SETTLED:
                await self._wait(entry, prev, now)
                return 0
        return None

    async def _take_turn(self, entry: Entry, now: float) -> int | None:
        """A scheduled send whose time came takes its place in its chat's order: behind the
        send the chat waits for, if any (journaled, ``after``), becoming the chat's end, so
        that sends made from now on go after it; ``None`` when it may go now."""
        value = entry.value
        chat = value["payload"]["chat_id"]
        tail = self._order.tails.get(chat)
        if tail is None or tail == last_part(value):
            return None
        prev = await self._common.kv.get(self._prefix + tail)
        if prev is None or prev.value.get("state") in SETTLED:
            return None
        await self._wait(entry, prev, now, after=tail)
        self._order.tails[chat] = last_part(value)
        return 0

    async def parked_due(self, entry: Entry, now: float) -> int:
        """A parked send whose retry tier brought it back: as :meth:`due`, without waiting
        for the journal's ``due`` (the sweeper's backstop, later)."""
        if self._common.leases.state(entry.value, now) == "live":
            return 0
        if self._common.leader is not None and not self._common.leader.may_send(now):
            return 0
        if _past_deadline(entry.value, now) and not entry.value.get("inflight"):
            return int(await self.expire(entry, None, background=True))
        gated = await self._gate(entry, now)
        if gated is not None:
            return gated
        return await self._deliver(entry, now, resend=False)

    async def _wait(
        self, entry: Entry, prev: Entry, now: float, *, after: str | None = None
    ) -> None:
        """Look again when the earlier send is due (not an attempt); ``after``: it waits
        behind that send from now on (a scheduled send that took its turn)."""
        expected = prev.value.get("retry_at", prev.due or 0.0)
        later = max(min(prev.due or 0.0, expected), now + max(self._poll, 0.001))
        deadline = entry.value.get("deadline")
        if deadline is not None and deadline > now:  # to expire it on time
            later = min(later, deadline)
        value = revise(entry.value, now, lease=None)
        if after is not None:
            value["after"] = after
        await self._common.leases.write(entry, value, Write.OUTBOX_WAIT, due=later)

    async def _deliver(self, entry: Entry, now: float, *, resend: bool, ask: bool = False) -> int:
        """Claim and send. ``resend``: its last attempt's outcome was lost; ``ask``: the
        channel is asked whether it went out before anything is sent (``_resolve``)."""
        invalid = _undeliverable(entry.value)
        if invalid is not None:  # never deliverable: dead now, not pending forever
            log.error("send %s dead-lettered: %s", entry.value.get("key"), invalid["message"])
            return int(await self.dead(entry, invalid, background=True))
        if self._pacers:
            if await self._paced_later(entry, now):
                return 0
            await self.pace(entry.value["payload"]["chat_id"], entry.value)
            now = self._common.clock.now()
        claimed, extra = await self._claim_value(entry, now, resend=resend and not ask)
        due = now + self._lease
        try:
            versions = await self._common.kv.commit(
                [handover(entry.key, claimed, expect=entry.version, due=due), *extra],
                label=Write.OUTBOX_CLAIM,
            )
        except VersionConflictError:
            return 0
        if resend and not ask:
            await self._ambiguous(claimed, resent=True)
        elif claimed["attempts"] > 1:
            self._common.metrics.outbox_retried += 1
        held = Held(entry.key, claimed["token"], versions[0], claimed, self._lease, due)
        self._common.leases.held[entry.key] = held
        message = records.decode_outbound(claimed["payload"])
        try:
            async with self._order.chat_lock(message.chat_id):
                try:
                    if self._common.leader is not None:
                        await self._common.leader.ensure()
                    result = await self._resolve(held, message) if ask else None
                    if result is None and _late(claimed, self._common.clock.now()):
                        return await self._too_late(held)
                    if result is None:
                        if self._common.leader is not None and ask:
                            await self._common.leader.ensure()
                        result = await self._call(routed(claimed, message))
                except _Skipped:
                    return 1
                except ProviderNotLeaderError:
                    await self.hand_back(held, inflight=bool(entry.value.get("inflight")))
                    return 0
                except Exception as exc:
                    await self._failed(held, exc, None)
                    return 1
                await self.sent(held, result.message_id, background=True)
                return 1
        finally:
            self._common.leases.held.pop(entry.key, None)

    async def _too_late(self, held: Held) -> int:
        """A claimed send whose deadline passed before it could go (its claim waited out a
        journal outage, or it was found in flight after a crash): never sent late. Expired
        when it certainly never went out; ``unknown`` when an earlier attempt may have."""
        value = held.value
        if value.get("ambiguous") and value.get("resolved") != "unsent":
            now = self._common.clock.now()
            error = records.encode_error(
                "Ambiguous",
                "found in flight after a crash past its deadline: it may have gone out, and "
                "is not sent again late",
                retryable=False,
                reason=Reason.AMBIGUOUS,
            )
            unknown = _closed(value, now, OutboxState.UNKNOWN, error=error, ambiguous=True)
            return int(await self._settle(held, unknown, now, background=True) is not None)
        return int(await self.expire(held, None, background=True))

    async def hand_back(self, held: Held, *, inflight: bool) -> Receipt:
        """A claimed send this replica may not deliver (``ProviderNotLeaderError``): back to
        pending, its attempt not charged, due now, for the leader. A send that was in flight
        before the claim (``inflight``: its outcome lost in a crash) stays so, with an
        expired lease, so the leader resolves it by the ambiguity policy."""
        now = self._common.clock.now()
        lease = {**self._common.leases.lease(now, 0.0)} if inflight else None
        value = revise(
            held.value,
            now,
            state=OutboxState.PENDING,
            inflight=True if inflight else None,
            lease=lease,
            attempts=max(int(held.value.get("attempts", 1)) - 1, 0),
        )
        try:
            await self._common.leases.write(held, value, Write.OUTBOX_NOT_LEADER, due=now)
        except FencedError:
            pass
        finally:
            self._common.leases.held.pop(held.key, None)
        log.info("send %s left to the provider leader", value["key"])
        return records.receipt_of(value, now)

    async def _resolve(self, held: Held, message: Outbound) -> SendResult | None:
        """Ask the channel whether an ambiguous send went out: its result when it did,
        ``None`` when it did not (the caller sends it now). When the channel cannot tell,
        the ``outbox.on_ambiguous`` policy decides: ``resend`` gives ``None``, ``skip``
        marks the send unknown and raises ``_Skipped``."""
        provider = self._resolver_of(held.value)
        assert isinstance(provider, AmbiguityResolver)
        value = held.value
        key = value["key"]
        route = routed(value, message)
        since = float(value.get("created") or value.get("updated") or 0.0)
        try:
            found = await provider.resolve_ambiguous(route.message, route.key, since)
        except Exception as exc:
            log.warning("send %s is ambiguous and %s cannot tell: %s", key, provider.name, exc)
            if self._on_ambiguous == "skip":
                now = self._common.clock.now()
                unknown = _closed(value, now, OutboxState.UNKNOWN, error=_AMBIGUOUS, ambiguous=True)
                await self._settle(held, unknown, now, background=True)
                await self._ambiguous(unknown, resent=False)
                raise _Skipped from None
            value["ambiguous"] = True
            await self._ambiguous(value, resent=True)
            return None
        if found is None:
            self._common.metrics.outbox_resolved_unsent += 1
            value["resolved"] = "unsent"
            log.info("ambiguous send %s: %s says it never arrived; sending it", key, provider.name)
            return None
        self._common.metrics.outbox_resolved_sent += 1
        value["resolved"] = "sent"
        log.info("ambiguous send %s: %s says it went out; not sending again", key, provider.name)
        return found

    def _resolver_of(self, value: Json) -> Provider | None:
        """The channel an ambiguous attempt of ``value`` went through (its fallback's once
        it switched); an unknown fallback channel resolves nothing."""
        spec = value.get("fallback")
        if not _fell_back(value):
            return self._provider
        channel = spec.get("channel") if isinstance(spec, dict) else None
        return self._provider if channel is None else self._fallbacks.get(channel)

    async def _claim_value(
        self, entry: Entry, now: float, *, resend: bool
    ) -> tuple[Json, list[Put]]:
        """The claimed record, and the later parts to journal when its text is over the
        channel's limit (an older record, or one journaled under a larger limit)."""
        value = entry.value
        claimed = self._common.leases.claimed(value, now, self._lease)
        claimed.update(
            state=OutboxState.PENDING, inflight=True, attempts=int(value.get("attempts", 0)) + 1
        )
        if resend:
            claimed["ambiguous"] = True
        text = value["payload"].get("text")
        limit = self._provider.text_limit
        if not (
            isinstance(text, str)
            and not _fell_back(value)
            and not value.get("op")  # an edit's parts are the send's
            and limit
            and text_length(text, unit_of(self._provider)) > limit
            and value.get("parts", 1) == 1
            and value.get("previous_part") is None
        ):
            return claimed, []
        texts: list[str | None] = list(split_text(text, limit, unit_of(self._provider)))
        payloads = part_payloads(value["payload"], texts)
        claimed.update(payload=payloads[0], parts=len(texts))
        rest = await self._unjournaled(_later_parts(value["key"], payloads, value, now, None))
        return claimed, [handover(self._prefix + v["key"], v, expect=0, due=now) for v in rest]
