"""Erasure of a chat: every journal record of one chat deleted, and a receipt saying so.

``Erasure.erase(chat_id)`` (``app.durability.erase_chat``; on Kafka the ``erase_chat``
control action, carried out by the worker that owns the chat) deletes, in this bot's scope:

===============  ====================================================================
``inbox``        the chat's inbounds (``<scope>/in/…`` whose message is of the chat)
``outbox``       the chat's sends (``<scope>/out/…``, any state: a ``pending`` or
                 ``failed`` one is discarded unsent, and named in the receipt)
``flow``         its flow checkpoint (``<scope>/flow/<chat>``)
``turn``         its turn record (``<scope>/turn/<chat>``)
``log``          its message log (everything under ``ScopeKeys.log_of(chat)``)
===============  ====================================================================

and the names of its sends under their message ids (``ScopeKeys.mid_of``), not counted.

**Sends in flight finish first.** The erasure holds the chat's order lock
(``ChatOrder.chat_lock``) while it reads and deletes: an attempt under way holds it for its
provider call, so it finishes (and is recorded) before; no new attempt of the chat starts
until the erasure is done. A record held by this engine (claimed by the sweeper and waiting
for the lock, an inbound whose handlers run) or leased live by another replica is in
flight: the erasure lets go of the lock, waits until it settled, and reads again (up to
``wait`` seconds, then ``RecordStateError``: erase again later). Deletes are
compare-and-sets on the versions read, so a claim that lands between the read and the
delete is never deleted under its holder: the erasure reads again.

**Finding the records.** The journal has no index by chat: a send is keyed by its
idempotency key and an inbound by its id, and the chat is inside the value. So the
erasure reads the scope's inbounds and sends (``DurableKv.scan``) and keeps the chat's: it
costs what the scope retains (on the Kafka worker: what the chat's journal partition
retains), not what the chat has. The flow checkpoint and the turn are one read each, and
the message log one prefix. That is why it is an operator action, not a hot path.

**Deletes are journal writes** (label ``chat.erase``): on the Kafka worker each one is a
tombstone on the journal's compacted changelog, so a restart, or another worker restoring
the partition, does not bring the chat back. Erasing again is harmless (nothing is found,
the receipt counts zeros). An inbound of the chat that arrives later is a new conversation.

**The receipt** (:class:`ErasureReceipt`) says which chat, when, where (instance, scope,
the operator's note), how many records of each kind were deleted, which sends were
discarded unsent, and the chat's dead records, read before they were deleted: the dead
letters on the dead-letter topics are copies the erasure does not reach, for the operator
to handle. It never carries a message text nor an error message (they may quote one).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Literal

import msgspec

from botmesh.state.basis import Basis
from botmesh.state.errors import RecordStateError, VersionConflictError
from botmesh.state.keys import ScopeKeys
from botmesh.state.kv import Delete, Entry
from botmesh.state.lease import Leases
from botmesh.state.messages import OutboxState
from botmesh.state.order import ChatOrder
from botmesh.state.receipts import Publisher
from botmesh.state.records import InboxState, Json
from botmesh.state.writes import Write

__all__ = [
    "DeadRecord",
    "Erased",
    "Erasure",
    "ErasureReceipt",
    "RecordKind",
]

log = logging.getLogger("botmesh.erasure")

#: Deletes per journal commit (a chat with a long history is deleted in several).
_CHUNK = 500
#: Seconds the erasure waits for the receipts sink to acknowledge what it was handed.
_FLUSH_S = 5.0
#: Seconds between two looks at a record in flight that this process holds.
_LOCAL_POLL = 0.01

#: The kinds of a chat's records, as the receipt counts them.
RecordKind = Literal["inbox", "outbox", "flow", "turn", "log"]
_DISCARDED = frozenset({OutboxState.PENDING, OutboxState.FAILED})


class DeadRecord(msgspec.Struct, frozen=True, kw_only=True):
    """A dead record of the chat the operator must handle: ``kind`` ``inbox`` (``id``: the
    inbound id) or ``outbox`` (``id``: the send's idempotency key), ``reason`` why it died,
    ``dead_ts`` when; ``where`` is ``journal`` (read from the journal before the erasure
    deleted it) or ``topic:partition:offset`` (a dead letter on a dead-letter topic, which
    the erasure does not delete)."""

    kind: str
    id: str
    reason: str | None = None
    dead_ts: float | None = None
    where: str = "journal"

    def as_json(self) -> dict[str, object]:
        out: dict[str, object] = msgspec.to_builtins(self)
        return out


class Erased(msgspec.Struct, frozen=True, kw_only=True):
    """How many records of each kind were deleted (a dry run: would be)."""

    inbox: int = 0
    outbox: int = 0
    flow: int = 0
    turn: int = 0
    log: int = 0

    @property
    def total(self) -> int:
        return self.inbox + self.outbox + self.flow + self.turn + self.log


class ErasureReceipt(msgspec.Struct, frozen=True, kw_only=True):
    """The evidence of one erasure (no message text, no error message)."""

    chat_id: str
    #: The bot's scope (``tenant:environment:bot:connection``).
    scope: str
    #: When the records were deleted (Unix seconds).
    ts: float
    #: The instance that erased (the lease owner; on Kafka the worker owning the chat).
    instance: str
    #: The operator's note (who asked, a ticket).
    note: str = ""
    #: Nothing was deleted: what an erasure would delete now.
    dry_run: bool = False
    deleted: Erased = Erased()
    #: The sends discarded unsent (``pending`` or ``failed``): their idempotency keys.
    discarded: list[str] = msgspec.field(default_factory=list)
    #: The chat's dead records (dead letters), for the operator to handle.
    dead: list[DeadRecord] = msgspec.field(default_factory=list)

    def as_json(self) -> dict[str, object]:
        """The receipt as plain JSON values."""
        out: dict[str, object] = msgspec.to_builtins(self)
        return out


class _Found:
    """A chat's records, read once: by kind, and what they say for the receipt."""

    def __init__(self) -> None:
        self.entries: dict[RecordKind, list[Entry]] = {
            "inbox": [],
            "outbox": [],
            "flow": [],
            "turn": [],
            "log": [],
        }
        #: The names of its sends under their message ids (``botmesh.state.statuses``):
        #: deleted with them, not counted in the receipt (each holds a send's key only).
        self.names: list[Entry] = []


class _Tally:
    """What an erasure did, over its passes: the keys deleted by kind, the sends discarded
    unsent, the dead records."""

    def __init__(self) -> None:
        self.deleted: dict[RecordKind, set[str]] = {k: set() for k in _Found().entries}
        self.discarded: dict[str, None] = {}
        self.dead: dict[str, DeadRecord] = {}


class Erasure:
    """Erases the records of one chat from this scope's journal (see the module doc)."""

    def __init__(
        self,
        basis: Basis,
        *,
        order: ChatOrder,
        leases: Leases,
        publisher: Publisher | None,
        erased: Callable[[ErasureReceipt], Awaitable[None]],
    ) -> None:
        self._basis = basis
        self._order = order
        self._leases = leases
        self._publisher = publisher
        #: Tells the bot's listeners (``ErasedEvent``; the engine wires it: the events
        #: module names this one's receipt, so this one does not import it).
        self._erased = erased

    async def erase(
        self, chat_id: str, *, note: str = "", dry_run: bool = False, wait: float = 60.0
    ) -> ErasureReceipt:
        """Delete every journal record of ``chat_id`` once its sends in flight settled, and
        return the receipt (``dry_run``: delete nothing, say what would go). Raises
        ``RecordStateError`` (state ``in flight``) when a record stays in flight for
        ``wait`` seconds (an erasure started by a handler of the same chat waits for that
        handler: erase from elsewhere), ``ValueError`` for an empty ``chat_id``, the journal's
        errors (``JournalUnavailableError``) when a delete is refused: erasing again
        finishes the work."""
        if not isinstance(chat_id, str) or not chat_id:
            raise ValueError(f"chat_id {chat_id!r}: give the id of the chat to erase")
        deadline = time.monotonic() + wait
        tally = _Tally()
        with self._basis.near(self._basis.keys.flow + chat_id):
            while (busy := await self._pass(chat_id, tally, dry_run=dry_run)) is not None:
                if time.monotonic() >= deadline:
                    shown = ", ".join(busy[:5]) + (" …" if len(busy) > 5 else "") or "changing"
                    raise RecordStateError(
                        chat_id,
                        "in flight",
                        f"not erased: records still in flight after {wait:g} s ({shown}); "
                        "erase it again once they settled",
                    )
                if not busy:
                    continue  # a record changed under us: read again
                if all(k in self._leases.held for k in busy):  # this process's: let it run
                    await asyncio.sleep(_LOCAL_POLL)
                else:  # another replica's lease: until it settles or expires
                    await self._basis.clock.sleep(0.05)
        receipt = self._receipt(chat_id, note, tally, dry_run=dry_run)
        if dry_run:
            return receipt
        log.warning(
            "chat %s erased (%s): %s records deleted, %d sends discarded unsent, %d dead%s",
            chat_id,
            self._basis.keys.scope,
            receipt.deleted.total,
            len(receipt.discarded),
            len(receipt.dead),
            f" ({note})" if note else "",
        )
        await self._erased(receipt)
        return receipt

    async def _pass(self, chat_id: str, tally: _Tally, *, dry_run: bool) -> list[str] | None:
        """One look at the chat under its lock: ``None`` when it is erased (a dry run: when
        the tally says what would go), else the keys still in flight (``[]``: a record
        changed since it was read)."""
        async with self._order.chat_lock(chat_id):
            if self._publisher is not None and not dry_run:
                # the receipts and dead letters of its settled sends are recorded published
                # first (they are with the sink already: a sink that does not answer only
                # costs their copies after a restart, not the erasure)
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(_FLUSH_S):
                        await self._publisher.flush()
            found = await self._find(chat_id)
            busy = self._in_flight(found)
            if busy:
                return busy
            _describe(self._basis.keys, found, tally)
            if dry_run:
                for kind, entries in found.entries.items():
                    tally.deleted[kind].update(e.key for e in entries)
                return None
            if not await self._delete(found, tally.deleted):
                return []
            self._order.tails.pop(chat_id, None)
            return None

    async def _find(self, chat_id: str) -> _Found:
        keys, kv = self._basis.keys, self._basis.kv
        found = _Found()
        found.entries["inbox"] = [
            e
            for e in await kv.scan(keys.inbox)
            if (e.value.get("message") or {}).get("chat_id") == chat_id
        ]
        found.entries["outbox"] = [
            e
            for e in await kv.scan(keys.outbox)
            if (e.value.get("payload") or {}).get("chat_id") == chat_id
        ]
        got = await kv.get_many([keys.flow + chat_id, keys.turn + chat_id])
        found.entries["flow"] = [e for k, e in got.items() if k.startswith(keys.flow)]
        found.entries["turn"] = [e for k, e in got.items() if k.startswith(keys.turn)]
        found.entries["log"] = await kv.scan(keys.log_of(chat_id))
        sent = {
            keys.mid_of(str(e.value["message_id"])): e.value.get("key")
            for e in found.entries["outbox"]
            if e.value.get("message_id")
        }
        named = await kv.get_many(list(sent))
        found.names = [e for k, e in named.items() if e.value.get("key") == sent[k]]
        return found

    def _in_flight(self, found: _Found) -> list[str]:
        """The keys of the chat's records in flight: held by this engine, or leased live by
        another replica."""
        now = self._basis.clock.now()
        return [
            e.key
            for kind in ("inbox", "outbox", "turn")
            for e in found.entries[kind]
            if e.key in self._leases.held or self._leases.state(e.value, now) == "live"
        ]

    async def _delete(self, found: _Found, deleted: dict[RecordKind, set[str]]) -> bool:
        """Delete what was found, a chunk a commit; ``False`` when a record changed since
        it was read (what was deleted before that stays deleted, and is counted)."""
        ops: list[tuple[RecordKind, Entry]] = [
            (kind, e) for kind, entries in found.entries.items() for e in entries
        ]
        for i in range(0, len(ops), _CHUNK):
            chunk = ops[i : i + _CHUNK]
            try:
                await self._basis.kv.commit(
                    [Delete(e.key, expect=e.version) for _, e in chunk], label=Write.CHAT_ERASE
                )
            except VersionConflictError:
                return False
            for kind, e in chunk:
                deleted[kind].add(e.key)
        for i in range(0, len(found.names), _CHUNK):
            names = found.names[i : i + _CHUNK]
            try:
                await self._basis.kv.commit(
                    [Delete(e.key, expect=e.version) for e in names], label=Write.CHAT_ERASE
                )
            except VersionConflictError:
                return False
        return True

    def _receipt(self, chat_id: str, note: str, tally: _Tally, *, dry_run: bool) -> ErasureReceipt:
        return ErasureReceipt(
            chat_id=chat_id,
            scope=self._basis.keys.scope,
            ts=self._basis.clock.now(),
            instance=self._basis.instance_id,
            note=note,
            dry_run=dry_run,
            deleted=Erased(**{kind: len(k) for kind, k in tally.deleted.items()}),
            discarded=list(tally.discarded),
            dead=sorted(tally.dead.values(), key=lambda d: (d.kind, d.dead_ts or 0.0, d.id)),
        )


def _describe(keys: ScopeKeys, found: _Found, tally: _Tally) -> None:
    """What the receipt says of the records found: the sends discarded unsent, the dead."""
    discarded, dead = tally.discarded, tally.dead
    for e in found.entries["outbox"]:
        state = e.value.get("state")
        key = e.key[len(keys.outbox) :]
        if state in _DISCARDED and not e.value.get("inflight"):
            discarded[key] = None
        elif state == OutboxState.DEAD:
            dead["outbox:" + key] = _dead("outbox", key, e.value)
    for e in found.entries["inbox"]:
        if e.value.get("state") == InboxState.DEAD:
            ident = e.key[len(keys.inbox) :]
            dead["inbox:" + ident] = _dead("inbox", ident, e.value)


def _dead(kind: str, ident: str, value: Json) -> DeadRecord:
    error = value.get("error")
    reason = error.get("reason") if isinstance(error, dict) else None
    ts = value.get("updated")
    return DeadRecord(
        kind=kind,
        id=ident,
        reason=str(reason) if reason is not None else None,
        dead_ts=float(ts) if isinstance(ts, int | float) else None,
    )
