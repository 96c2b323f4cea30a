"""Delivery outcomes: what a channel says of a send after it accepted it.

WhatsApp's Cloud API, Twilio, Messenger, Gupshup and others post status webhooks about the
messages they accepted: ``sent``, ``delivered``, ``read``, ``failed``. Some refusals come
only that way (WhatsApp 131047 outside the 24-hour window, 131026 undeliverable): the send
API answered 200, and the message never arrived.

**Joining a status to its send.** When a send is recorded ``sent`` on a channel that posts
status webhooks (``ports.posts_statuses``), the same journal commit names it under the
channel's message id (``<scope>/mid/<message id>`` → its key;
``index_ops``), purged with the send's record. The chat a status names is not compared
with the send's (channels write it their own way: ``whatsapp:+1…``, a JID); on Kafka the
status is read by the owner of its chat's partition, where the send's record is when the
bot sent to the chat id the channel gave. A status (``DeliveryStatus``: chat, message
id, status, the channel's code) is looked up there; one the journal does not hold (never
ours, past ``retention.sent``, erased) is counted (``deliveryUnmatched``) and dropped.

**What a status changes.** A sent send's record gains ``delivery``: ``{"state", "ts",
"code", "error"}``. The states only move forward (``sent`` → ``delivered`` → ``read``;
``failed`` is final): a status that is not further along (a copy, a late ``delivered``
after ``read``) changes nothing (``deliveryUnchanged``). Each change is one journal write
whose receipt (``Receipt.delivery``) follows as a settled send's does.

**A failure acts**, as the same refusal would have in the send's answer:

- the send's ``Fallback``, when it names the error the channel's code maps to
  (``DeliveryFailures``: the provider's own mapping, as for a refusal in the answer), is
  journaled in the very write that records the failure, under ``<key>~fallback``, and the
  sweeper sends it: exactly once, however often or late the status comes, since a second
  ``failed`` finds the send failed already;
- else the send becomes ``dead``, reason ``undelivered``, the channel's code in its error:
  its dead letter and receipt follow as for any dead send.

Nothing here touches the network: statuses come from the runtime (on Kafka from
``<prefix>.statuses``, produced by the webhook gateway).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Protocol, runtime_checkable

from botmesh.state import records
from botmesh.state.common import Common
from botmesh.state.errors import Reason, SendError
from botmesh.state.events import FallbackEvent
from botmesh.state.fallback import fallback_key, fallback_payload, switches
from botmesh.state.keys import ScopeKeys, part_base
from botmesh.state.kv import Entry, Op, Put, handover
from botmesh.state.messages import (
    DELIVERY_ORDER,
    DeliveryState,
    DeliveryStatus,
    OutboxState,
    Receipt,
)
from botmesh.state.outbox import new_values
from botmesh.state.records import Json, revise

__all__ = ["DeliveryFailures", "Statuses", "index_ops"]

log = logging.getLogger("botmesh.statuses")

#: What ``Statuses.apply`` returns besides a delivery state.
UNCHANGED, UNMATCHED = "unchanged", "unmatched"


class Settles(Protocol):
    """What the statuses ask of the delivery (``botmesh.state.delivery.Delivery``)."""

    async def record_delivery(
        self, target: Entry, value: Json, *, extra: Sequence[Op] = ()
    ) -> Receipt | None: ...

    async def dead(self, target: Entry, error: Json, *, background: bool) -> bool: ...

    def fallback_texts(self, payload: Json, spec: Json) -> list[Json]: ...


@runtime_checkable
class DeliveryFailures(Protocol):
    """A channel that says which of our errors a ``failed`` status stands for (the error
    its send API raises for the same code), so a send's ``Fallback`` acts on it."""

    def delivery_error(self, status: DeliveryStatus) -> SendError:
        """Our error for the failure ``status`` reports (``code``, ``error``)."""
        ...


def index_ops(keys: ScopeKeys, value: Json, purge: float | None) -> list[Op]:
    """The operation that names a send being recorded ``sent`` under the channel's message
    id (purged with the record); none for an edit or a delete, or without a message id."""
    message_id = value.get("message_id")
    if not message_id or value.get("op"):
        return []
    return [handover(keys.mid_of(str(message_id)), {"key": value["key"]}, None, purge=purge)]


def _further(current: object, new: DeliveryState) -> bool:
    """Whether ``new`` moves a send's delivery state on from ``current``."""
    if current == DeliveryState.FAILED:
        return False
    was = DELIVERY_ORDER[DeliveryState(str(current))] if current in DELIVERY_ORDER else 0
    return DELIVERY_ORDER[new] > was


def _failure_text(status: DeliveryStatus) -> str:
    what = " ".join(p for p in (status.code, status.error) if p) or "no reason given"
    return (
        f"{status.channel or 'the channel'} accepted the message ({status.message_id}), "
        f"then reported it failed: {what}"
    )


class Statuses:
    """Applies channels' delivery statuses to the journaled sends they name."""

    def __init__(
        self,
        common: Common,
        *,
        delivery: Settles,
        provider: object,
        fallbacks: Mapping[str, object],
    ) -> None:
        self._common = common
        self._delivery = delivery
        self._provider = provider
        self._fallbacks = fallbacks
        self._prefix = common.keys.outbox

    async def apply(self, status: DeliveryStatus) -> str:
        """Apply one status; returns what it did: the delivery state it set
        (``delivered``, ``read``, ``failed``), ``unchanged`` or ``unmatched``."""
        state = DeliveryState(status.status)
        outcome = UNCHANGED
        for _ in range(4):  # a write of the record meanwhile: read it again
            entry = await self._find(status)
            if entry is None:
                outcome = UNMATCHED
                break
            current = (entry.value.get("delivery") or {}).get("state")
            if not _further(current, state):
                break
            # written where the send's record is (on Kafka its journal partition, which the
            # partition of the chat the status names need not be)
            with self._common.near(entry.key):
                done = (
                    await self._failed(entry, status)
                    if state is DeliveryState.FAILED
                    else await self._advance(entry, status, state)
                )
            if done:
                outcome = state.value
                break
        self._count(status, outcome)
        return outcome

    def _count(self, status: DeliveryStatus, outcome: str) -> None:
        metrics = self._common.metrics
        if outcome == UNMATCHED:
            metrics.delivery_unmatched += 1
            log.info(
                "status %s of message %s in chat %s: no send of the journal has that message "
                "id (not ours, past retention, or erased); dropped",
                status.status,
                status.message_id,
                status.chat_id,
            )
        elif outcome == UNCHANGED:
            metrics.delivery_unchanged += 1
        else:
            metrics.delivery_updates += 1
            if outcome == DeliveryState.FAILED:
                metrics.delivery_failed += 1
        timings = self._common.timings
        if timings is not None:
            timings.delivery_status(status.channel or "unknown", outcome)

    async def _find(self, status: DeliveryStatus) -> Entry | None:
        """The record of the send the channel accepted as ``status.message_id``."""
        kv = self._common.kv
        named = await kv.get(self._common.keys.mid_of(status.message_id))
        if named is None:
            return None
        entry = await kv.get(self._prefix + str(named.value.get("key")))
        if entry is None or entry.value.get("message_id") != status.message_id:
            return None
        if entry.value.get("state") not in (OutboxState.SENT, OutboxState.DEAD):
            return None
        return entry

    def _delivery_of(self, status: DeliveryStatus, state: DeliveryState) -> Json:
        value: Json = {"state": state.value, "ts": status.ts or self._common.clock.now()}
        if status.code:
            value["code"] = status.code
        if status.error:
            value["error"] = status.error
        return value

    async def _advance(self, entry: Entry, status: DeliveryStatus, state: DeliveryState) -> bool:
        now = self._common.clock.now()
        value = revise(entry.value, now, delivery=self._delivery_of(status, state))
        return await self._delivery.record_delivery(entry, value) is not None

    def _error(self, status: DeliveryStatus, value: Json) -> SendError:
        """Our error for the failure: the channel's own mapping, else a final ``SendError``."""
        spec = value.get("fallback")
        channel = spec.get("channel") if isinstance(spec, dict) and spec.get("used") else None
        provider = self._provider if channel is None else self._fallbacks.get(channel)
        if isinstance(provider, DeliveryFailures):
            try:
                return provider.delivery_error(status)
            except Exception as exc:  # a channel's mapping must not stop the failure
                log.warning("%s: delivery_error failed (%s); a plain failure", channel, exc)
        return SendError(_failure_text(status), retryable=False)

    async def _failed(self, entry: Entry, status: DeliveryStatus) -> bool:
        """A sent send the channel reports failed: its fallback, else dead."""
        value = revise(
            entry.value,
            self._common.clock.now(),
            delivery=self._delivery_of(status, DeliveryState.FAILED),
        )
        exc = self._error(status, value)
        first = entry if value.get("part", 1) == 1 else await self._first(value)
        if (
            entry.value.get("state") == OutboxState.SENT
            and first is not None
            and switches(first.value, exc) is not None
        ):
            return await self._fall_back(entry, value, first, exc)
        if entry.value.get("state") != OutboxState.SENT:  # dead already: the state only
            return await self._advance(entry, status, DeliveryState.FAILED)
        error = records.encode_error(
            type(exc).__name__, _failure_text(status), retryable=False, reason=Reason.UNDELIVERED
        )
        log.error("send %s undelivered: %s", value["key"], error["message"])
        target = Entry(entry.key, value, entry.version, entry.due, entry.purge)
        return await self._delivery.dead(target, error, background=True)

    async def _first(self, value: Json) -> Entry | None:
        """Part 1 of a split send (where its fallback is journaled)."""
        base = part_base(value["key"], int(value.get("part", 1)))
        return await self._common.kv.get(self._prefix + base)

    async def _fall_back(self, entry: Entry, value: Json, first: Entry, exc: SendError) -> bool:
        """The failure recorded and the fallback journaled, in one write; the sweeper
        sends the fallback (under ``<key>~fallback``, through its channel)."""
        fallback = switches(first.value, exc)
        assert fallback is not None
        now = self._common.clock.now()
        key = first.value["key"]
        spec = {**first.value["fallback"], "used": True, "key": fallback_key(key)}
        payloads = self._delivery.fallback_texts(
            fallback_payload(first.value["payload"], fallback), spec
        )
        made = new_values(
            spec["key"],
            payloads,
            first_part=1,
            parts=len(payloads),
            fp=None,
            inbound_id=first.value.get("inbound_id"),
            now=now,
            lease=None,
            after=None,
        )
        for made_value in made:
            made_value["fallback"] = {**spec, "key": made_value["key"]}
        extra: list[Op] = [handover(self._prefix + v["key"], v, expect=0, due=now) for v in made]
        if first.key == entry.key:
            value["fallback"] = spec
        else:
            marked = revise(first.value, now, fallback=spec)
            extra.insert(0, Put(first.key, marked, first.version, first.due, first.purge, True))
        if await self._delivery.record_delivery(entry, value, extra=extra) is None:
            return False
        log.warning(
            "send %s failed after the channel accepted it (%s): sending its fallback %s",
            key,
            type(exc).__name__,
            spec["key"],
        )
        event = FallbackEvent(key, spec["key"], type(exc).__name__, spec.get("channel"))
        await self._common.emit(event)
        self._common.wake.set()
        return True
