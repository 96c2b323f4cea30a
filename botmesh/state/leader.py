"""Leader-only provider sessions (``provider_session="leader"``).

Some transports allow one live session at a time (a WhatsApp Web socket): with several
replicas on one shared journal, exactly one of them may call the provider. That replica
holds the leadership lease, one record ``<scope>/leader`` in the journal::

    {"owner": <instance id>, "boot": <boot id>, "token": <fencing token>, "until": <epoch s>}

The lease is taken and renewed by compare-and-set on the record's version (``tick``, from
the scheduler's timer every third of the lease and at the start of each sweeper pass); a
new holder raises ``token`` by one. A standby reads the record at each tick and takes it
once ``until`` passed (a dead leader: one lease at most) or at once when the leader
released it at a clean stop (``release``: ``until`` set to 0). An instance finding a lease
of its own earlier boot takes it at once, as the inbox does.

The leader stops calling the provider a quarter of the lease before it ends
(``may_send``): a leader that missed its renewals (a long pause) refuses instead of
sending, before a standby can take over. A standby's delivery attempt is refused with
``ProviderNotLeaderError`` before the provider is called (``check``); the send stays
journaled, uncharged, for the leader's sweeper. A provider with ``open_session()`` /
``close_session()`` (``SessionHooks``) has them called when this replica gains or loses the
lease.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from botmesh.state.basis import Basis
from botmesh.state.config import DurabilityConfig
from botmesh.state.errors import ConfigError, ProviderNotLeaderError, VersionConflictError
from botmesh.state.kv import Entry, handover
from botmesh.state.ports import Provider, SessionHooks
from botmesh.state.records import Json
from botmesh.state.writes import Write

__all__ = ["Leadership"]

log = logging.getLogger("botmesh.leader")

#: The leader stops calling the provider this fraction of the lease before it ends.
MARGIN = 0.25
#: The leader renews once this fraction of the lease has passed.
RENEW_AFTER = 1 / 3


class Leadership:
    """The leadership lease of one engine (``provider_session="leader"``)."""

    def __init__(
        self,
        basis: Basis,
        *,
        lease: float,
        provider: Provider,
        rebuild_tails: Callable[[], Awaitable[None]],
    ) -> None:
        self._basis = basis
        self.key = basis.keys.leader
        self.lease = lease
        self._provider = provider
        #: Rebuilds the outbox's per-chat order when this replica takes the session
        #: (``ChatOrder.rebuild_tails``: the standby's chains are the journal's now).
        self._rebuild_tails = rebuild_tails
        #: The version of the record this engine last wrote as the leader (0: not leader).
        self._version = 0
        self._token = 0
        #: Until when this engine holds the lease (as it last wrote it); 0 when it does not.
        self._until = 0.0
        #: The holder and lease end last read, for the standby's refusals.
        self._holder: str | None = None
        self._holder_until: float | None = None
        self._session_open = False

    @staticmethod
    def wanted(config: DurabilityConfig, *, exclusive: bool) -> bool:
        """Whether the engine has a leadership lease: ``provider_session="leader"``;
        refused on a partitioned journal (``exclusive``)."""
        if config.provider_session != "leader":
            return False
        if exclusive:
            raise ConfigError(
                "provider_session",
                "'leader' needs one journal shared by every replica (sqlite, postgres, "
                "redis); the Kafka worker's journal is split by partition, so the lease "
                "has no single home there. Run the bot with `botmesh run` on a shared "
                "SQL or Redis journal, or run one worker",
            )
        return True

    @property
    def is_leader(self) -> bool:
        return self._version > 0

    def may_send(self, now: float) -> bool:
        """Whether the provider may be called now: the lease is ours and not within its
        safety margin of ending."""
        return self._version > 0 and now < self._until - self.lease * MARGIN

    def check(self, now: float) -> None:
        """Raise ``ProviderNotLeaderError`` unless ``may_send(now)``; counted."""
        if self.may_send(now):
            return
        self._basis.metrics.provider_not_leader += 1
        if self._version > 0:  # ours, but too close to its end: renewals were missed
            raise ProviderNotLeaderError(self._basis.instance_id, self._until)
        raise ProviderNotLeaderError(self._holder, self._holder_until)

    async def ensure(self) -> None:
        """Right before a provider call: renew the lease if it is due (a long sweeper pass
        must not starve the renewals), then ``check``."""
        if self._version > 0:
            await self.tick()
        self.check(self._basis.clock.now())

    async def tick(self, now: float | None = None) -> bool:
        """Take, renew or watch the lease; returns whether this engine leads now. A journal
        error leaves the state as it was (a leader then stops at its margin)."""
        now = self._basis.clock.now() if now is None else now
        if self._version > 0 and now < self._until - self.lease * (1 - RENEW_AFTER):
            return True  # held, not a third through
        try:
            await self._tick(now)
        except Exception as exc:
            log.warning("leadership lease of %s not checked: %s", self.key, exc)
        return self._version > 0

    async def _tick(self, now: float) -> None:
        entry = await self._basis.kv.get(self.key)
        value = entry.value if entry is not None else {}
        mine = (
            value.get("owner") == self._basis.instance_id and value.get("boot") == self._basis.boot
        )
        if self._version > 0 and not (mine and value.get("token") == self._token):
            await self._lost(value)
        if (mine and self._version > 0) or self._free(value, now):
            await self._take(entry, now)
            return
        self._holder = value.get("owner")
        self._holder_until = value.get("until")

    def _free(self, value: Json, now: float) -> bool:
        if not value:
            return True
        if value.get("owner") == self._basis.instance_id and value.get("boot") != self._basis.boot:
            return True  # this instance's earlier boot: taken at once
        return float(value.get("until", 0.0)) <= now

    async def _take(self, entry: Entry | None, now: float) -> None:
        renew = self._version > 0
        token = self._token if renew else int((entry.value if entry else {}).get("token", 0)) + 1
        until = now + self.lease
        value: Json = {
            "owner": self._basis.instance_id,
            "boot": self._basis.boot,
            "token": token,
            "until": until,
            "updated": now,
        }
        expect = entry.version if entry is not None else 0
        try:
            [version] = await self._basis.kv.commit(
                [handover(self.key, value, expect=expect)], label=Write.LEADER_LEASE
            )
        except VersionConflictError:
            if renew:
                await self._lost(None)
            return  # another replica took it first; read again at the next tick
        self._version, self._token, self._until = version, token, until
        self._holder, self._holder_until = self._basis.instance_id, until
        if not renew:
            log.info("%s took the provider session (token %d)", self._basis.instance_id, token)
            await self._open_session()
            await self._rebuild_tails()  # the standby's chains are the journal's now
            self._basis.wake.set()  # deliver what the standbys left

    async def _lost(self, value: Json | None) -> None:
        self._version, self._until = 0, 0.0
        holder = value.get("owner") if value else None
        log.warning("%s lost the provider session to %s", self._basis.instance_id, holder)
        await self._close_session()

    async def release(self) -> None:
        """At a clean stop: end the lease now, so a standby takes the session at once."""
        if self._version == 0:
            return
        now = self._basis.clock.now()
        value = {
            "owner": self._basis.instance_id,
            "boot": self._basis.boot,
            "token": self._token,
            "until": 0.0,
            "updated": now,
        }
        version, self._version, self._until = self._version, 0, 0.0
        try:
            await self._basis.kv.commit(
                [handover(self.key, value, expect=version)], label=Write.LEADER_LEASE
            )
        except Exception as exc:  # it lapses on its own
            log.warning("provider session not released (it ends with its lease): %s", exc)
        await self._close_session()

    async def _open_session(self) -> None:
        provider = self._provider
        if isinstance(provider, SessionHooks) and not self._session_open:
            self._session_open = True
            try:
                await provider.open_session()
            except Exception as exc:  # its sends fail and are retried as any failure
                log.warning("%s: open_session() failed: %s", provider.name, exc)

    async def _close_session(self) -> None:
        provider = self._provider
        if isinstance(provider, SessionHooks) and self._session_open:
            self._session_open = False
            try:
                await provider.close_session()
            except Exception as exc:
                log.warning("%s: close_session() failed: %s", provider.name, exc)
