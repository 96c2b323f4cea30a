"""Operating a running bot's journal: list records, replay an inbound, retry a send,
discard one, list, restart or drop a chat's flow, erase a chat, read the counters
(``app.durability``)."""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Iterable

from botmesh.state.campaigns import CampaignStatus, campaign_prefix, tally
from botmesh.state.checkpoints import ACTIVE, Checkpoints, FlowRecord, ended_record, fresh_record
from botmesh.state.clock import Clock
from botmesh.state.common import Common
from botmesh.state.delivery import Delivery
from botmesh.state.erasure import Erasure, ErasureReceipt
from botmesh.state.errors import Reason, RecordStateError
from botmesh.state.events import FlowEndedEvent
from botmesh.state.inbox import replay_value
from botmesh.state.keys import campaign_key, part_base, part_key
from botmesh.state.kv import Delete, DurableKv, Entry, handover
from botmesh.state.lease import Leases
from botmesh.state.messages import Receipt
from botmesh.state.records import (
    InboxRecord,
    InboxState,
    Json,
    OutboxRecord,
    OutboxState,
    receipt_of,
    revise,
)
from botmesh.state.scheduler import Sweeper
from botmesh.state.writes import Write

__all__ = ["InboxView", "Operations", "OutboxView"]


_RETRYABLE = frozenset({OutboxState.DEAD, OutboxState.FAILED, OutboxState.UNKNOWN})
#: The states of a send that has not gone out: it can be cancelled (unless in flight).
_WAITING = frozenset({OutboxState.PENDING, OutboxState.FAILED})
_CASCADED = frozenset({Reason.PREVIOUS_PART_DEAD, Reason.PREVIOUS_PART_UNKNOWN})


class InboxView:
    """``app.durability.inbox``: the inbound journal of this bot's scope."""

    def __init__(self, kv: DurableKv, *, prefix: str) -> None:
        self._kv = kv
        self._prefix = prefix

    async def list(self, state: InboxState | str | None = None) -> list[InboxRecord]:
        """Records of this scope, optionally only those in ``state`` (``"dead"``: the DLQ)."""
        entries = await self._kv.scan(self._prefix)
        return [
            InboxRecord.from_value(e.value, e.version)
            for e in entries
            if state is None or e.value.get("state") == state
        ]

    async def get(self, inbound_id: str) -> InboxRecord | None:
        entry = await self._kv.get(self._prefix + inbound_id)
        return InboxRecord.from_value(entry.value, entry.version) if entry else None


class OutboxView:
    """``app.durability.outbox``: the outbound journal of this bot's scope."""

    def __init__(
        self,
        kv: DurableKv,
        *,
        prefix: str,
        leases: Leases | None = None,
        clock: Clock | None = None,
    ) -> None:
        self._kv = kv
        self._prefix = prefix
        #: Who holds what: a send a live holder is delivering is not discarded.
        self._leases = leases
        self._clock = clock

    async def list(self, state: OutboxState | str | None = None) -> list[OutboxRecord]:
        """Records of this scope, optionally only those in ``state`` (``"dead"``: the DLQ)."""
        entries = await self._kv.scan(self._prefix)
        return [
            OutboxRecord.from_value(e.value, e.version)
            for e in entries
            if state is None or e.value.get("state") == state
        ]

    async def get(self, key: str) -> OutboxRecord | None:
        entry = await self._kv.get(self._prefix + key)
        return OutboxRecord.from_value(entry.value, entry.version) if entry else None

    async def discard(self, key: str) -> None:
        """Forget the send ``key`` (any settled or waiting state). A later send under that
        key goes out again. A send in flight (leased by a live holder, its provider call
        under way or about to be) is refused with ``RecordStateError``: forgotten now, it
        would go out twice (once from the call under way, once from the next send under
        its key). Wait until it settles, then discard it."""
        entry = await self._kv.get(self._prefix + key)
        if entry is None:
            raise RecordStateError(key, None, "no outbox record under this key in this scope")
        value = entry.value
        if (
            self._leases is not None
            and self._clock is not None
            and value.get("state") == OutboxState.PENDING
            and self._leases.state(value, self._clock.now()) == "live"
        ):
            owner = (value.get("lease") or {}).get("owner")
            raise RecordStateError(
                key,
                str(value.get("state")),
                f"it is in flight (held by {owner!r}, the provider call may be under way): "
                "discarding it now could send it twice; wait until it settles (sent, failed, "
                "dead or unknown), then discard it",
            )
        await self._kv.commit([Delete(entry.key, expect=entry.version)], label=Write.OUTBOX_DISCARD)


class Operations:
    """The operator's handle on one running bot's journal (``app.durability``)."""

    def __init__(
        self,
        common: Common,
        *,
        delivery: Delivery,
        sweeper: Sweeper,
        checkpoints: Checkpoints,
        erasure: Erasure,
        recover: Callable[[], Awaitable[int]],
    ) -> None:
        self._common = common
        self._delivery = delivery
        self._sweeper = sweeper
        self._checkpoints = checkpoints
        self._erasure = erasure
        #: The engine's recovery pass (``Engine.recover``), a callback: the engine owns it.
        self._recover = recover
        self.inbox = InboxView(common.kv, prefix=common.keys.inbox)
        self.outbox = OutboxView(
            common.kv,
            prefix=common.keys.outbox,
            leases=common.leases,
            clock=common.clock,
        )

    @property
    def scope(self) -> str:
        return self._common.keys.scope

    @property
    def instance_id(self) -> str:
        return self._common.instance_id

    def metrics(self) -> dict[str, int]:
        """The counters: the reference's thirteen, under its names, then our three."""
        return self._common.metrics.as_dict()

    async def sweep_once(self, now: float | None = None) -> int:
        """Run one sweeper pass now (with ``poll=0`` nothing else runs it)."""
        return await self._sweeper.sweep_once(now)

    async def drain(self, max_passes: int = 100) -> int:
        """Sweep until a pass acts on nothing."""
        return await self._sweeper.drain(max_passes)

    async def recover(self) -> int:
        """Run the recovery pass now, over what the journal holds (``Engine.recover``): the
        Kafka worker runs it for each journal partition it is given."""
        return await self._recover()

    async def replay_inbound(self, inbound_id: str) -> None:
        """Process inbound ``inbound_id`` again (dead or done), with a fresh attempt budget;
        its sends that already went out are answered from the outbox."""
        key = self._common.keys.inbox + inbound_id
        entry = await self._common.kv.get(key)
        if entry is None:
            raise RecordStateError(inbound_id, None, "no inbox record under this id in this scope")
        now = self._common.clock.now()
        state = entry.value.get("state")
        if state == InboxState.PENDING and self._common.leases.state(entry.value, now) == "live":
            raise RecordStateError(inbound_id, state, "it is being processed now; try again later")
        await self._common.kv.commit(
            [handover(key, replay_value(entry.value, now), expect=entry.version, due=now)],
            label=Write.INBOX_REPLAY,
        )
        self._common.wake.set()

    async def retry_send(self, key: str) -> None:
        """Send ``key`` again (dead, failed or unknown) with a fresh retry budget; the later
        parts of its text that died or became unknown because of it come back with it."""
        entry = await self._common.kv.get(self._common.keys.outbox + key)
        if entry is None:
            raise RecordStateError(key, None, "no outbox record under this key in this scope")
        state = entry.value.get("state")
        if state not in _RETRYABLE:
            raise RecordStateError(key, state, "only dead, failed or unknown sends can be retried")
        now = self._common.clock.now()
        revived = [entry, *await self._cascaded_parts(entry.value)]
        ops = [
            handover(r.key, _retry_value(r.value, now), expect=r.version, due=now) for r in revived
        ]
        await self._common.kv.commit(ops, label=Write.OUTBOX_RETRY)
        self._common.wake.set()

    async def cancel(self, key: str, *, chat_id: str | None = None) -> Receipt:
        """Cancel the send ``key`` before it goes out (a scheduled send, one waiting for a
        retry or its turn): settled ``cancelled`` with its later parts, never sent, and a
        later send under ``key`` is answered from it. Its receipt (``cancelled``).

        With ``chat_id``, a key the journal does not hold yet is cancelled ahead (a request
        still on its way: it is then answered ``cancelled``, not sent). Cancelling again
        answers the same receipt. ``RecordStateError`` for a send that went out or settled
        (sent, dead, unknown), or that is in flight (it may be going out now)."""
        prefix, now = self._common.keys.outbox, self._common.clock.now()
        entry = await self._common.kv.get(prefix + key)
        if entry is None:
            if chat_id is None:
                raise RecordStateError(
                    key,
                    None,
                    "no send under this key in this scope; to cancel a send whose request "
                    "is not journaled yet, give its chat id",
                )
            entry = Entry(prefix + key, _ahead(key, chat_id, now), 0)
        value = entry.value
        state = value.get("state")
        if state == OutboxState.CANCELLED:
            return receipt_of(value, now)
        if state not in _WAITING:
            raise RecordStateError(
                key, state, "it already settled: only a send that has not gone out is cancelled"
            )
        if value.get("inflight") or self._common.leases.state(value, now) == "live":
            raise RecordStateError(
                key,
                state,
                "it is in flight (the provider call may be under way, so it may go out): "
                "wait until it settles",
            )
        for later in await self._later_parts(value):
            await self._delivery.cancel(later)
        receipt = await self._delivery.cancel(entry)
        if receipt is None:
            raise RecordStateError(key, state, "it changed while being cancelled; try again")
        return receipt

    async def campaign(self, campaign: str) -> CampaignStatus:
        """Where the sends of ``campaign`` stand (``botmesh.state.campaigns``)."""
        entries = await self._common.kv.scan(self._common.keys.outbox + campaign_prefix(campaign))
        return tally(campaign, (e.value for e in entries))

    async def cancel_campaign(self, campaign: str, chat_ids: Iterable[str] = ()) -> CampaignStatus:
        """Cancel every send of ``campaign`` that has not gone out (one in flight goes on);
        ``chat_ids``: also its recipients not journaled yet, so a run of the campaign
        started again sends them nothing. Its status after."""
        prefix = self._common.keys.outbox + campaign_prefix(campaign)
        entries = await self._common.kv.scan(prefix)
        held = {e.value["key"] for e in entries}
        for entry in entries:
            value = entry.value
            if value.get("part", 1) != 1 or value.get("state") not in _WAITING:
                continue
            with contextlib.suppress(RecordStateError):  # in flight: it may go out
                await self.cancel(value["key"])
        for chat_id in dict.fromkeys(chat_ids):
            key = campaign_key(campaign, chat_id)
            if key not in held:
                with contextlib.suppress(RecordStateError):
                    await self.cancel(key, chat_id=chat_id)
        return await self.campaign(campaign)

    async def _later_parts(self, value: Json) -> list[Entry]:
        """The later parts of a send's text that have not gone out yet."""
        return [
            entry
            for entry in await self._parts_after(value)
            if entry.value.get("state") in _WAITING and not entry.value.get("inflight")
        ]

    async def _parts_after(self, value: Json) -> list[Entry]:
        """The records of the parts after ``value``'s in its text, in order."""
        part, parts = value.get("part", 1), value.get("parts", 1)
        if part >= parts:
            return []
        base = part_base(value["key"], part)
        keys = [self._common.keys.outbox + part_key(base, n) for n in range(part + 1, parts + 1)]
        found = await self._common.kv.get_many(keys)
        return [entry for k in keys if (entry := found.get(k)) is not None]

    async def retry_parked(self, key: str, attempts: int) -> str:
        """A send parked for its retry came back from its tier: attempt it now when the
        journal still holds it ``failed`` after ``attempts`` attempts (``"delivered"``, or
        ``"waiting"`` behind an earlier send or part of its chat); else nothing
        (``"stale"``: it was sent, retried by an operator, discarded or retried already)."""
        entry = await self._common.kv.get(self._common.keys.outbox + key)
        if (
            entry is None
            or entry.value.get("state") != OutboxState.FAILED
            or int(entry.value.get("attempts", 0)) != attempts
        ):
            return "stale"
        acted = await self._delivery.parked_due(entry, self._common.clock.now())
        return "delivered" if acted else "waiting"

    async def erase_chat(
        self, chat_id: str, *, note: str = "", dry_run: bool = False, wait: float = 60.0
    ) -> ErasureReceipt:
        """Delete every journal record of ``chat_id`` (inbounds, sends in any state, flow
        checkpoint, turn, message log) once its sends in flight settled; the receipt says
        what went, which sends were discarded unsent and the chat's dead records
        (``botmesh.state.erasure``). ``note`` (who asked, a ticket) goes in the receipt;
        ``dry_run`` deletes nothing. ``RecordStateError`` when a record stays in flight for
        ``wait`` seconds. Erasing again is harmless."""
        return await self._erasure.erase(chat_id, note=note, dry_run=dry_run, wait=wait)

    # -- flows (persistent ones: those in the journal) -----------------------------------

    async def flows(self, chat_id: str | None = None) -> list[FlowRecord]:
        """The flow checkpoints of this scope (active, parked or ended and not purged yet),
        or the one of ``chat_id``. Non-persistent flows live in memory and are not listed."""
        if chat_id is not None:
            entry = await self._checkpoints.get(self._checkpoints.key(chat_id))
            return [] if entry is None else [FlowRecord.from_value(entry.value, entry.version)]
        found = await self._common.kv.scan(self._common.keys.flow)
        return [FlowRecord.from_value(x.value, x.version) for x in found]

    async def restart_flow(self, chat_id: str) -> FlowRecord:
        """Start the chat's flow again from its beginning (same flow, same args, a new
        run): what to do with a checkpoint refused by new code (``FlowVersionError``). The
        sweeper runs the start: its first question goes out keyed from the new run."""
        entry = await self._flow_entry(chat_id)
        now = self._common.clock.now()
        old = entry.value
        new = fresh_record(old["flow"], int(old.get("version", 1)), chat_id, old["args"], now)
        new["restart"] = True
        with self._common.near(entry.key):
            version = await self._checkpoints.write(entry.key, new, expect=entry.version, now=now)
        self._common.wake.set()
        return FlowRecord.from_value(new, version)

    async def drop_flow(self, chat_id: str) -> FlowRecord:
        """End the chat's flow now (``dropped``): its next message goes to the handlers."""
        entry = await self._flow_entry(chat_id)
        now = self._common.clock.now()
        if entry.value.get("status") != ACTIVE:
            raise RecordStateError(chat_id, entry.value.get("status"), "this flow ended already")
        ended = ended_record(entry.value, "dropped", now)
        with self._common.near(entry.key):
            version = await self._checkpoints.write(entry.key, ended, expect=entry.version, now=now)
        await self._common.emit(FlowEndedEvent(ended["flow"], chat_id, "dropped"))
        return FlowRecord.from_value(ended, version)

    async def _flow_entry(self, chat_id: str) -> Entry:
        key = self._checkpoints.key(chat_id)
        with self._common.near(key):
            entry = await self._checkpoints.get(key)
        if entry is None:
            raise RecordStateError(chat_id, None, "no flow checkpoint for this chat in this scope")
        return entry

    async def _cascaded_parts(self, value: Json) -> list[Entry]:
        return [
            entry
            for entry in await self._parts_after(value)
            if entry.value.get("state") in _RETRYABLE
            and (entry.value.get("error") or {}).get("reason") in _CASCADED
        ]


def _retry_value(value: Json, now: float) -> Json:
    """A send an operator retries: a fresh budget, and no deadline (they chose to send it)."""
    return revise(
        value,
        now,
        state=OutboxState.PENDING,
        inflight=None,
        lease=None,
        error=None,
        attempts=0,
        published=None,
        failed_first=None,
        deadline=None,
    )


def _ahead(key: str, chat_id: str, now: float) -> Json:
    """The record of a send cancelled before it was journaled (it holds no content)."""
    return {
        "key": key,
        "state": OutboxState.PENDING,
        "attempts": 0,
        "token": 0,
        "payload": {"chat_id": chat_id},
        "created": now,
        "updated": now,
    }
