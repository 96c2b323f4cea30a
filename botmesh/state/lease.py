"""Leases and fencing tokens.

A claim writes ``lease = {owner, boot, until}`` and raises the record's ``token`` by one,
in one compare-and-set. The holder keeps a ``Held``: the token and the version it last
wrote. Every later write of the holder is a compare-and-set on that version; when it
fails, the record is read again: another token there means the lease was taken over and
the write is refused (``FencedError``, counted in ``staleLeases``); the same token means
the holder's own concurrent write (a heartbeat) landed first, and the write is retried.

``Leases`` keeps what this engine holds, writes as a holder (``write``) or as anyone with
a compare-and-set on a version it read (``write`` of an ``Entry``), and extends leases
that are a third or more through (``heartbeat_once``).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from botmesh.state.basis import Basis
from botmesh.state.errors import DurabilityError, FencedError, VersionConflictError
from botmesh.state.kv import Entry, Op, handover
from botmesh.state.records import Json
from botmesh.state.writes import Write

__all__ = ["Held", "LeaseState", "Leases"]

log = logging.getLogger("botmesh.lease")


#: ``free``: no lease; ``live``: held and not expired; ``expired``: held, past ``until``;
#: ``orphan``: held by this instance id under an earlier boot, or by another instance in a
#: partitioned journal this instance owns (reclaimable at once).
LeaseState = Literal["free", "live", "expired", "orphan"]


@dataclass(slots=True)
class Held:
    """A lease this engine holds on one record."""

    key: str
    token: int
    version: int
    value: Json
    lease: float
    until: float
    fenced: bool = False


class Leases:
    """The leases one engine holds, and its fenced writes."""

    def __init__(self, basis: Basis) -> None:
        self._basis = basis
        self.held: dict[str, Held] = {}

    def lease(self, now: float, seconds: float) -> Json:
        """A lease of ``seconds`` for this instance and boot."""
        return {
            "owner": self._basis.instance_id,
            "boot": self._basis.boot,
            "until": now + seconds,
        }

    def state(self, value: Json, now: float) -> LeaseState:
        lease = value.get("lease")
        if not lease:
            return "free"
        if lease.get("owner") == self._basis.instance_id:
            if lease.get("boot") != self._basis.boot:
                return "orphan"
        elif self._basis.exclusive:  # a partitioned journal: its owner is the only writer
            return "orphan"
        if lease.get("until", 0.0) <= now:
            return "expired"
        return "live"

    def this_boot(self, value: Json) -> bool:
        """Leased by this very instance and boot (whether or not still held here)."""
        lease = value.get("lease") or {}
        return (
            lease.get("owner") == self._basis.instance_id and lease.get("boot") == self._basis.boot
        )

    def claimed(self, value: Json, now: float, seconds: float) -> Json:
        """A copy of ``value`` leased to this instance under the next fencing token."""
        new = dict(value)
        new["token"] = int(value.get("token", 0)) + 1
        new["lease"] = self.lease(now, seconds)
        new["updated"] = now
        return new

    async def write(
        self,
        target: Held | Entry,
        value: Json,
        label: Write,
        due: float | None = None,
        purge: float | None = None,
        *,
        extra: Sequence[Op] = (),
        before: Sequence[Op] = (),
    ) -> bool:
        """Write ``value`` over ``target``.

        A ``Held`` record is written as its holder: ``FencedError`` when it was taken over.
        An ``Entry`` is written with a compare-and-set on its version: ``False`` when
        someone wrote it first (the caller leaves it to them). ``extra`` operations join
        the same commit after the record, ``before`` ones ahead of it (on Kafka the
        changelog gets them in that order). For a ``Held`` a conflict on one of them raises
        ``VersionConflictError`` naming it, for the caller to settle; for an ``Entry`` any
        conflict gives ``False``.
        """
        if isinstance(target, Entry):
            try:
                await self._basis.kv.commit(
                    [
                        *before,
                        handover(target.key, value, expect=target.version, due=due, purge=purge),
                        *extra,
                    ],
                    label=label,
                )
            except VersionConflictError:
                return False
            return True
        await self._write_held(target, value, label, due, purge, extra=extra, before=before)
        return True

    async def _write_held(
        self,
        held: Held,
        value: Json,
        label: Write,
        due: float | None,
        purge: float | None,
        *,
        extra: Sequence[Op] = (),
        before: Sequence[Op] = (),
    ) -> None:
        kv = self._basis.kv
        for _ in range(8):
            try:
                versions = await kv.commit(
                    [
                        *before,
                        handover(held.key, value, expect=held.version, due=due, purge=purge),
                        *extra,
                    ],
                    label=label,
                )
                version = versions[len(before)]
            except VersionConflictError as exc:
                if exc.key != held.key:
                    raise
                entry = await kv.get(held.key)
                current = entry.value.get("token") if entry is not None else None
                if entry is None or current != held.token:
                    raise self._fenced(held, label, current) from None
                held.version = entry.version  # our own heartbeat landed first
                continue
            held.version = version
            held.value = value
            lease = value.get("lease")
            if lease:
                held.until = lease["until"]
            return
        raise DurabilityError(f"{held.key}: too many concurrent writes by this holder")

    def _fenced(self, held: Held, label: Write, current: int | None) -> FencedError:
        held.fenced = True
        self.held.pop(held.key, None)
        self._basis.metrics.stale_leases += 1
        log.warning(
            "stale completion of %s refused (%s): token %s, record at %s",
            held.key,
            label,
            held.token,
            current,
        )
        return FencedError(held.key, held.token, current)

    async def reclaim(self, held: Held, seconds: float) -> None:
        """Take a fresh fencing token on a record we hold, as a new attempt (before a
        provider call)."""
        now = self._basis.clock.now()
        new = self.claimed(held.value, now, seconds)
        new["state"] = "pending"
        new["inflight"] = True
        new["attempts"] = int(held.value.get("attempts", 0)) + 1
        await self.write(held, new, Write.OUTBOX_CLAIM, due=now + seconds)
        held.token = new["token"]

    def _heartbeat_label(self, key: str) -> Write:
        if key.startswith(self._basis.keys.inbox):
            return Write.INBOX_HEARTBEAT
        if key.startswith(self._basis.keys.outbox):
            return Write.OUTBOX_HEARTBEAT
        return Write.TURN_HEARTBEAT

    async def heartbeat_once(self, now: float) -> int:
        """Extend every lease held here that is a third or more through; returns how many."""
        extended = 0
        for held in list(self.held.values()):
            if held.fenced or held.until - now > held.lease * 2 / 3:
                continue
            lease = held.value.get("lease")
            if not lease:
                continue
            new = dict(held.value)
            new["lease"] = {**lease, "until": now + held.lease}
            label = self._heartbeat_label(held.key)
            try:
                [version] = await self._basis.kv.commit(
                    [handover(held.key, new, expect=held.version, due=now + held.lease)],
                    label=label,
                )
            except VersionConflictError:
                entry = await self._basis.kv.get(held.key)
                if entry is None or entry.value.get("token") != held.token:
                    held.fenced = True
                continue  # else the holder itself wrote meanwhile; next tick
            except Exception as exc:
                log.warning("heartbeat of %s failed: %s", held.key, exc)
                continue
            if self.held.get(held.key) is held:
                held.version = version
                held.value = new
                held.until = now + held.lease
                extended += 1
        return extended
