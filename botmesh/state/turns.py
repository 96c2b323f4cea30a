"""Chat turns: two replicas that receive messages of one chat never run its handlers at the
same time.

A chat's turn is one record ``<scope>/turn/<chat id>`` in the journal, leased like an inbox
record (``botmesh.state.lease``: owner, boot, expiry, and a fencing token raised by each new
holder)::

    inbound journaled ──> turn taken (compare-and-set) ──> handlers run (turn heartbeated)
                                    │                         ──> done + turn released,
                     held elsewhere │                             in one commit
                                    ▼
            waited for (short backoff, up to ``inbox.turn_wait``), then the inbound is
            left pending for the sweeper, its attempt not charged (``Outcome.DEFERRED``)

The turn is released in the same commit that marks the inbound done, so no other replica
can start the chat's next message before this one is recorded as handled. A holder that
died leaves its turn leased; it is taken over once the lease expired (``inbox.lease``,
kept alive by the heartbeat while handlers run), under a new token: the stale holder's
release, joined to its mark-done, then fails, and it stops (``Outcome.FENCED``) instead
of finishing. Within one process the turn also serializes the chat's concurrent inbounds.

Turns are on by default when the journal is shared by several processes (sqlite,
postgres, redis) and not partitioned; on the Kafka worker the partition already serializes
a chat. ``inbox.chat_turns=False`` turns them off (sticky routing, for speed). A free
turn record is purged with the done records (``retention``): a chat idle that long starts
again at token 1 (a holder of a purged turn is long fenced: its version is gone).
"""

from __future__ import annotations

import asyncio
import logging
import time

from botmesh.state.common import Common
from botmesh.state.config import InboxConfig
from botmesh.state.errors import FencedError, VersionConflictError
from botmesh.state.kv import DurableKv, Put, handover
from botmesh.state.lease import Held
from botmesh.state.records import Json, revise
from botmesh.state.writes import Write

__all__ = ["Turns"]

log = logging.getLogger("botmesh.turns")

#: First and longest pause between two looks at a turn held elsewhere (seconds).
FIRST_PAUSE = 0.01
LONGEST_PAUSE = 0.25


class Turns:
    """The chat turns one engine holds and takes."""

    def __init__(
        self,
        common: Common,
        *,
        config: InboxConfig,
        poll: float,
    ) -> None:
        self._common = common
        self.prefix = common.keys.turn
        self._lease = config.lease
        self._wait = config.turn_wait
        self._poll = poll
        #: Chat id -> the turn this engine holds (one inbound of the chat at a time).
        self._mine: dict[str, Held] = {}
        #: Chats whose turn this engine is taking now (set before the first await).
        self._taking: set[str] = set()

    @staticmethod
    def wanted(config: InboxConfig, kv: DurableKv, *, exclusive: bool) -> bool:
        """Whether the engine takes chat turns (see the module docstring)."""
        if exclusive:
            return False
        on = config.chat_turns
        if on is None:
            on = bool(getattr(kv, "shared", False))
        return on

    async def take(self, chat_id: str, inbound_id: str, *, wait: bool) -> Held | None:
        """Take the chat's turn for ``inbound_id``; ``None`` when it stays held elsewhere
        (after waiting up to ``inbox.turn_wait`` when ``wait``)."""
        deadline = time.monotonic() + (self._wait if wait else 0.0)
        pause = FIRST_PAUSE
        while True:
            held = await self._try(chat_id, inbound_id)
            if held is not None:
                return held
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            await asyncio.sleep(min(pause, left))
            pause = min(pause * 2, LONGEST_PAUSE)

    async def busy(self, chat_id: str) -> bool:
        """Whether the chat's turn is held now, here or by another live instance (the
        sweeper then leaves the chat's pending inbound for a later pass)."""
        if chat_id in self._mine or chat_id in self._taking:
            return True
        entry = await self._common.kv.get(self.prefix + chat_id)
        if entry is None:
            return False
        leases = self._common.leases
        now = self._common.clock.now()
        return leases.state(entry.value, now) == "live" and not leases.this_boot(entry.value)

    async def _try(self, chat_id: str, inbound_id: str) -> Held | None:
        if chat_id in self._mine or chat_id in self._taking:
            return None  # this engine runs the chat, or is taking its turn right now
        self._taking.add(chat_id)
        try:
            return await self._take(chat_id, inbound_id)
        finally:
            self._taking.discard(chat_id)

    async def _take(self, chat_id: str, inbound_id: str) -> Held | None:
        key = self.prefix + chat_id
        entry = await self._common.kv.get(key)
        now = self._common.clock.now()
        value: Json = entry.value if entry is not None else {"chat_id": chat_id, "token": 0}
        live = entry is not None and self._common.leases.state(value, now) == "live"
        if live and not self._common.leases.this_boot(value):
            return None  # another live instance runs this chat's handlers
        # (ours, of this boot, yet not held here: a release that did not land; taken again)
        taken = self._common.leases.claimed(value, now, self._lease)
        taken.update(inbound=inbound_id, state="held")
        try:
            [version] = await self._common.kv.commit(
                [handover(key, taken, expect=entry.version if entry is not None else 0)],
                label=Write.TURN_TAKE,
            )
        except VersionConflictError:
            return None
        held = Held(key, taken["token"], version, taken, self._lease, now + self._lease)
        self._mine[chat_id] = held
        return held

    def release_op(self, turn: Held, now: float) -> Put:
        """The write that releases ``turn``, joined to the inbound's mark-done commit."""
        value = revise(turn.value, now, lease=None, inbound=None, state="done")
        return handover(
            turn.key, value, expect=turn.version, purge=self._common.retention.purge_at(now)
        )

    def released(self, turn: Held) -> None:
        """The release landed (or the turn is given up): the chat is free here."""
        chat = turn.key[len(self.prefix) :]
        if self._mine.get(chat) is turn:
            del self._mine[chat]

    async def give_back(self, turn: Held, *, written: bool) -> None:
        """The run ended without marking its inbound done: the chat is free here, and in
        the journal too when ``written`` (best effort; else its lease lapses)."""
        self.released(turn)
        if not written:
            return
        try:
            await self._common.kv.commit(
                [self.release_op(turn, self._common.clock.now())], label=Write.TURN_RELEASE
            )
        except Exception as exc:
            log.warning("turn %s not released (its lease lapses): %s", turn.key, exc)

    async def recheck(self, turn: Held) -> None:
        """The release's compare-and-set failed: our own heartbeat landed first (the
        version moves on, retry), or another instance took the turn (``FencedError``)."""
        entry = await self._common.kv.get(turn.key)
        current = entry.value.get("token") if entry is not None else None
        if entry is None or current != turn.token:
            self.released(turn)
            self._common.metrics.stale_leases += 1
            log.warning(
                "turn %s was taken over (token %s, now %s): this run stops",
                turn.key,
                turn.token,
                current,
            )
            raise FencedError(turn.key, turn.token, current)
        turn.version = entry.version
        turn.value = entry.value

    async def step_aside(self, held: Held) -> bool:
        """The chat's turn stays held elsewhere: the inbound ``held`` goes back to pending,
        its attempt not charged, due again after a short pause (the sweeper takes it).
        False when it was taken over meanwhile."""
        now = self._common.clock.now()
        attempts = max(int(held.value.get("attempts", 1)) - 1, 0)
        value = revise(held.value, now, lease=None, attempts=attempts)
        due = now + max(self._poll, 0.05)
        try:
            await self._common.leases.write(held, value, Write.INBOX_TURN_WAIT, due=due)
        except FencedError:
            return False
        log.info("inbound %s waits for its chat's turn (left to the sweeper)", held.key)
        self._common.wake.set()
        return True
