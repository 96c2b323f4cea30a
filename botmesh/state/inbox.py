"""The inbox: every inbound is journaled before its handlers run and marked done after.

::

    (journal) ──> pending ──(handlers settled)──> done ──(retention)──> purged
                    │  ▲
      (runs charged │  │ replay_inbound / lease expired
       >= max)      ▼  │
                    dead

``Inbox.handle`` returns an ``Outcome`` or raises: ``JournalUnavailableError`` when the
inbound could not be journaled (fail closed: nothing ran; the caller must not
acknowledge it) or when its handlers ran but ``done`` could not be written (a retry
settles it without running them again). Every transition is a compare-and-set write under
a ``Write`` label. Writes the dispatch hook returns (a flow's checkpoint) land in the same
commit as ``done``; when that commit fails the record is released and its handlers run
again (``_mark_done_with``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from contextvars import ContextVar
from enum import StrEnum
from typing import TypeAlias

from botmesh.state.backoff import GiveUp
from botmesh.state.common import Common
from botmesh.state.config import InboxConfig
from botmesh.state.errors import (
    BadRecord,
    FencedError,
    JournalUnavailableError,
    Reason,
    VersionConflictError,
)
from botmesh.state.events import DeadEvent, ErrorEvent
from botmesh.state.kv import Entry, Op, handover
from botmesh.state.lease import Held
from botmesh.state.media_replay import journaled, rehydrated
from botmesh.state.messages import Inbound
from botmesh.state.ports import Provider
from botmesh.state.records import (
    InboxState,
    Json,
    decode_inbound,
    encode_error,
    encode_inbound,
    error_of,
    revise,
)
from botmesh.state.turns import Turns
from botmesh.state.writes import Write

__all__ = ["Dispatch", "Inbox", "Outcome", "rerunning"]

log = logging.getLogger("botmesh.inbox")

#: True while the dispatch hook runs for a done inbound delivered again (``Inbox._rerun``).
_RERUN: ContextVar[bool] = ContextVar("botmesh_inbox_rerun", default=False)


#: Runs the handlers of one inbound; may return journal writes that must land with its
#: ``done`` (a flow checkpoint): the engine's ``hooks.dispatch``.
Dispatch: TypeAlias = Callable[[Inbound], Awaitable[Sequence[Op] | None]]


def rerunning() -> bool:
    """Whether the inbound being dispatched now ran before and runs again (an offset
    replay of a done message, or an operator's ``replay_inbound`` or redrive): it must take
    the path it took the first time, not a new one (a chat's flow must not take it as an
    answer when the handlers had it)."""
    return _RERUN.get()


class Outcome(StrEnum):
    """What became of an inbound that ``handle()`` accepted. Every outcome may be
    acknowledged to the transport; a failure raises instead."""

    #: Journaled, handlers ran, marked done.
    HANDLED = "handled"
    #: Already done, in progress here or held by another live instance: nothing ran.
    DUPLICATE = "duplicate"
    #: Dead in the journal (``inbox.max_attempts`` runs charged): nothing ran.
    DEAD = "dead"
    #: Its handlers ran, but another holder took the record over meanwhile and finishes it.
    FENCED = "fenced"
    #: The journal was down and ``fail_open`` dispatched it anyway, unjournaled.
    UNJOURNALED = "unjournaled"
    #: Done already, and delivered again from the place it was journaled from (an offset
    #: replay, or a redelivery after a crash): its handlers ran again, its sends were
    #: answered from the outbox (their receipts published again); nothing was written.
    REPLAYED = "replayed"
    #: Journaled, but its chat's turn stayed held by another replica (``botmesh.state.turns``):
    #: nothing ran yet; it is pending, and the sweeper runs it once the turn is free.
    DEFERRED = "deferred"


def new_value(message: Json, now: float, lease: Json, source: str | None = None) -> Json:
    """A new record, journaled and claimed in the same write (attempt 1 charged)."""
    value: Json = {
        "id": message["id"],
        "state": InboxState.PENDING,
        "attempts": 1,
        "token": 1,
        "lease": lease,
        "message": message,
        "created": now,
        "updated": now,
    }
    if source is not None:
        value["source"] = source
    return value


def replay_value(value: Json, now: float) -> Json:
    """An operator's replay: pending again with a fresh attempt budget, marked
    ``operator_replay`` so that its run, after a crash too, is a rerun (``rerunning``): a
    chat's flow does not take this old message as the answer to its pending ask."""
    return revise(
        value,
        now,
        state=InboxState.PENDING,
        lease=None,
        error=None,
        attempts=0,
        published=None,
        failed_first=None,
        operator_replay=True,
    )


class Inbox:
    """Journals inbounds, runs their handlers (``dispatch``), marks them done."""

    def __init__(
        self,
        common: Common,
        *,
        config: InboxConfig,
        fail_open: bool,
        provider: Provider,
        turns: Turns | None,
        dispatch: Dispatch,
    ) -> None:
        self._common = common
        self._prefix = common.keys.inbox
        self._media_refs = config.media_refs
        self._max_attempts = config.max_attempts
        self._fail_open = fail_open
        self._provider = provider
        self._turns = turns
        self._dispatch = dispatch
        self._inflight: set[str] = set()
        #: Records whose handlers ran but whose ``done`` did not land (retried on redelivery).
        self._undone: dict[str, Held] = {}
        self._lease = config.lease
        self._retries = config.retry_policy()

    async def handle(self, message: Inbound, *, source: str | None = None) -> Outcome:
        """Journal ``message`` (fail closed), run the handlers, mark it done.

        ``source`` names the place the transport read it from (on Kafka
        ``topic:partition:offset``); it is journaled with the record. A message that is done
        already and comes again from that same place is a replay of the transport (offsets
        reset, or redelivered after a crash): its handlers run again and its sends are
        answered from the outbox (``Outcome.REPLAYED``). The same message from another place
        (produced twice, a webhook retried) stays a duplicate and runs nothing."""
        if not isinstance(message, Inbound):
            raise BadRecord(
                Reason.WRONG_TYPE,
                f"handle() takes a botmesh.Inbound, got {type(message).__name__}: build one "
                "with Inbound(id=..., chat_id=..., ...)",
                "message",
            )
        mid = message.id
        if not mid:
            raise BadRecord(
                Reason.WRONG_TYPE,
                "an inbound needs an id, stable across redeliveries (the channel's message "
                "id): Inbound(id=..., chat_id=..., ...)",
            )
        if mid in self._inflight:
            self._common.metrics.inbound_duplicates += 1
            return Outcome.DUPLICATE
        self._inflight.add(mid)
        try:
            return await self._handle(message, source)
        finally:
            self._inflight.discard(mid)

    async def _handle(self, message: Inbound, source: str | None) -> Outcome:
        key = self._prefix + message.id
        if key in self._undone:
            return await self._mark_done(self._undone[key], message.id)
        now = self._common.clock.now()
        try:
            kept = journaled(message, self._provider, media_refs=self._media_refs)
            encoded = encode_inbound(kept)
        except (TypeError, ValueError) as exc:
            raise BadRecord(Reason.WRONG_TYPE, f"the inbound cannot be journaled: {exc}") from exc
        value = new_value(encoded, now, self._common.leases.lease(now, self._lease), source)
        try:
            [version] = await self._common.kv.commit(
                [handover(key, value, expect=0, due=now + self._lease)],
                label=Write.INBOX_JOURNAL,
            )
        except VersionConflictError:
            return await self._redelivered(key, message, source)
        except Exception as exc:
            return await self._not_journaled(message, exc)
        self._common.metrics.inbound_journaled += 1
        return await self.run(Held(key, 1, version, value, self._lease, now + self._lease), message)

    async def _not_journaled(self, message: Inbound, exc: Exception) -> Outcome:
        if isinstance(exc, FencedError):  # another holder owns it: never run it here
            log.info("inbound %s not journaled, not dispatched: %s", message.id, exc)
            raise exc
        if self._fail_open:
            log.warning(
                "inbound %s not journaled (%s); dispatched anyway (fail_open)", message.id, exc
            )
            await self._common.emit(ErrorEvent(exc, "inbox.journal", message.id))
            await self._dispatch(message)
            return Outcome.UNJOURNALED
        log.error("inbound %s not journaled, not dispatched (fail closed): %s", message.id, exc)
        if isinstance(exc, JournalUnavailableError):
            raise exc
        raise JournalUnavailableError(f"inbound {message.id!r} not journaled: {exc}") from exc

    async def _redelivered(self, key: str, message: Inbound, source: str | None) -> Outcome:
        entry = await self._common.kv.get(key)
        state = entry.value.get("state") if entry is not None else InboxState.DONE
        leases = self._common.leases
        if entry is not None and state == InboxState.PENDING and key not in leases.held:
            now = self._common.clock.now()
            if leases.state(entry.value, now) != "live" or leases.this_boot(entry.value):
                return await self.replay(entry, now)
        if (
            entry is not None
            and state == InboxState.DONE
            and source is not None
            and entry.value.get("source") == source
        ):
            return await self._rerun(message, entry)
        if (
            entry is not None
            and state == InboxState.DEAD
            and source is not None
            and entry.value.get("source") not in (None, source)
        ):
            return await self._redrive(entry, source)
        self._common.metrics.inbound_duplicates += 1
        return Outcome.DEAD if state == InboxState.DEAD else Outcome.DUPLICATE

    async def _redrive(self, entry: Entry, source: str) -> Outcome:
        """A dead inbound produced again to its transport from elsewhere (an operator
        re-producing its dead letter to the inbound topic): replayed with a fresh attempt
        budget, as ``replay_inbound`` would, and journaled under its new source."""
        now = self._common.clock.now()
        value = {**replay_value(entry.value, now), "source": source}
        try:
            [version] = await self._common.kv.commit(
                [handover(entry.key, value, expect=entry.version, due=now)],
                label=Write.INBOX_REPLAY,
            )
        except VersionConflictError:
            return Outcome.DUPLICATE
        log.info("inbound %s redriven from %s (it was dead)", value["id"], source)
        return await self.replay(Entry(entry.key, value, version, due=now), now)

    async def _rerun(self, message: Inbound, entry: Entry) -> Outcome:
        """A done message delivered again by its transport from where it was journaled:
        its handlers run again; the record stays done (its sends are answered from the
        outbox, so nothing is written unless a handler took another path). They get the
        input of the run that completed the record: the journaled message when that run
        was a replay (its media rebuilt from the reference), so they take the same path."""
        self._common.metrics.inbound_replayed += 1
        if entry.value.get("replayed"):
            try:
                message = rehydrated(decode_inbound(entry.value["message"]), self._provider)
            except Exception as exc:  # as the replay that completed it would have failed
                log.warning("inbound %s: journaled message unreadable: %s", message.id, exc)
        token = _RERUN.set(True)
        try:
            await self._dispatch(message)
        finally:
            _RERUN.reset(token)
        return Outcome.REPLAYED

    async def run(self, held: Held, message: Inbound, *, wait: bool = True) -> Outcome:
        """Run the handlers of a record we hold, then mark it done. With chat turns, the
        chat's turn is taken first (waited for when ``wait``) and released with the
        mark-done; a turn that stays held elsewhere leaves the record pending
        (``Outcome.DEFERRED``)."""
        self._common.leases.held[held.key] = held
        turn: Held | None = None
        try:
            # -- chat turns (botmesh.state.turns) --------------------------------------------------
            if self._turns is not None:
                turn = await self._turns.take(message.chat_id, message.id, wait=wait)
                if turn is None:
                    self._common.leases.held.pop(held.key, None)
                    stepped = await self._turns.step_aside(held)
                    return Outcome.DEFERRED if stepped else Outcome.FENCED
                self._common.leases.held[turn.key] = turn
            # ---------------------------------------------------------------------------------
            timings = self._common.timings
            if timings is None:
                riders = await self._dispatch(message)
            else:
                started = time.perf_counter()
                try:
                    riders = await self._dispatch(message)
                finally:
                    timings.handler(time.perf_counter() - started)
        except BaseException as exc:
            if turn is not None and self._turns is not None:  # a crash leaves it to expire
                await self._turns.give_back(turn, written=isinstance(exc, Exception))
            raise
        finally:
            self._common.leases.held.pop(held.key, None)
            if turn is not None:
                self._common.leases.held.pop(turn.key, None)
        if riders:  # a flow turn: its checkpoint lands with done, or the turn runs again
            return await self._mark_done_with(held, message.id, riders, turn)
        return await self._mark_done(held, message.id, turn)

    async def _mark_done(self, held: Held, inbound_id: str, turn: Held | None = None) -> Outcome:
        now = self._common.clock.now()
        done = revise(held.value, now, state=InboxState.DONE, lease=None, error=None)
        try:
            await self._write_done(held, done, now, turn)
        except FencedError as exc:
            self._undone.pop(held.key, None)
            await self._common.emit(ErrorEvent(exc, "inbox.mark_done", inbound_id))
            return Outcome.FENCED
        except Exception as exc:
            if turn is not None and self._turns is not None:
                self._turns.released(turn)  # the retry marks it done alone; the turn lapses
            self._undone[held.key] = held
            log.warning("inbound %s handled but not marked done: %s", inbound_id, exc)
            raise JournalUnavailableError(
                f"inbound {inbound_id!r} was handled but not marked done ({exc}); "
                "handle it again to settle it (its handlers do not run again)"
            ) from exc
        self._undone.pop(held.key, None)
        return Outcome.HANDLED

    async def _write_done(
        self, held: Held, done: Json, now: float, turn: Held | None, riders: Sequence[Op] = ()
    ) -> None:
        """Mark done, with ``riders`` (a flow checkpoint) in the same commit; with a chat
        turn, release it in that commit too (``botmesh.state.turns``)."""
        purge = self._common.retention.purge_at(now)
        if turn is None or self._turns is None:
            await self._common.leases.write(
                held, done, Write.INBOX_MARK_DONE, purge=purge, extra=riders
            )
            return
        for _ in range(4):
            release = self._turns.release_op(turn, now)
            try:
                await self._common.leases.write(
                    held, done, Write.INBOX_MARK_DONE, purge=purge, extra=[*riders, release]
                )
            except VersionConflictError as exc:
                if exc.key != turn.key:
                    raise
                await self._turns.recheck(turn)  # our heartbeat landed first, or FencedError
                continue
            self._turns.released(turn)
            return
        raise JournalUnavailableError(f"{turn.key}: too many concurrent writes by this holder")

    # -- flow turns: the checkpoint rides on done (issue 12) -----------------------------

    async def _mark_done_with(
        self, held: Held, inbound_id: str, riders: Sequence[Op], turn: Held | None
    ) -> Outcome:
        """Mark a flow turn's inbound done in the same commit as the writes its handlers
        returned (the flow checkpoint, a compare-and-set on the version the turn read).
        When that commit fails (the flow moved under us: another replica's turn; or the
        journal), nothing of it landed: the inbound is released, not done, and its turn
        runs again from the checkpoint (its sends answered from the outbox). It is never
        parked as "handlers ran, only done missing": a flow turn must run again."""
        now = self._common.clock.now()
        done = revise(held.value, now, state=InboxState.DONE, lease=None, error=None)
        try:
            await self._write_done(held, done, now, turn, riders)
        except FencedError as exc:
            await self._common.emit(ErrorEvent(exc, "inbox.mark_done", inbound_id))
            return Outcome.FENCED
        except Exception as exc:
            if turn is not None and self._turns is not None:
                await self._turns.give_back(turn, written=True)
            return await self._release(held, inbound_id, exc)
        self._undone.pop(held.key, None)
        return Outcome.HANDLED

    async def _release(self, held: Held, inbound_id: str, exc: Exception) -> Outcome:
        """A flow turn whose checkpoint did not land: give the record up (pending, no
        lease, due now) so it is replayed, then raise: the transport must not acknowledge
        it. If even the release fails, the lease expires and the sweeper replays it."""
        now = self._common.clock.now()
        retry = revise(held.value, now, state=InboxState.PENDING, lease=None)
        try:
            await self._common.leases.write(held, retry, Write.INBOX_MARK_RETRY, due=now)
        except Exception as release_exc:
            log.warning("inbound %s not released (%s); its lease expires", inbound_id, release_exc)
        self._common.wake.set()
        log.warning("inbound %s: flow checkpoint not written (%s); released", inbound_id, exc)
        raise JournalUnavailableError(
            f"inbound {inbound_id!r}: its flow checkpoint could not be written ({exc}); the "
            "inbound was released and is replayed (handle it again, or the sweeper does)"
        ) from exc

    async def replay(self, entry: Entry, now: float) -> Outcome:
        """Take a pending record (restart, expired lease, operator) and run it again, or
        dead-letter it once ``inbox.max_attempts`` runs were charged."""
        value = entry.value
        attempts = int(value.get("attempts", 0))
        # -- chat turns (botmesh.state.turns): a chat whose turn is held runs nothing now --------
        chat = (value.get("message") or {}).get("chat_id")
        if self._turns is not None and isinstance(chat, str) and await self._turns.busy(chat):
            return Outcome.DUPLICATE
        if attempts >= self._max_attempts:
            error = encode_error(
                "AttemptsExhausted",
                f"{attempts} runs were charged without completing "
                f"(inbox.max_attempts={self._max_attempts})",
                retryable=False,
                reason=Reason.ATTEMPTS_EXHAUSTED,
            )
            if value.get("error"):
                error["last"] = value["error"]
            await self._dead(entry, error)
            return Outcome.DEAD
        claimed = self._common.leases.claimed(value, now, self._lease)
        # replayed: the run that completes it gets the journaled message (see _rerun)
        claimed.update(attempts=attempts + 1, state=InboxState.PENDING, replayed=True)
        try:
            [version] = await self._common.kv.commit(
                [handover(entry.key, claimed, expect=entry.version, due=now + self._lease)],
                label=Write.INBOX_CLAIM,
            )
        except VersionConflictError:
            return Outcome.DUPLICATE
        held = Held(entry.key, claimed["token"], version, claimed, self._lease, now + self._lease)
        self._common.metrics.inbound_replayed += 1
        try:
            message = rehydrated(decode_inbound(claimed["message"]), self._provider)
        except Exception as exc:
            await self._failed_before_handlers(held, exc)
            return Outcome.DEAD if held.value["state"] == InboxState.DEAD else Outcome.DUPLICATE
        if not value.get("operator_replay"):
            return await self.run(held, message, wait=False)
        token = _RERUN.set(True)  # an old message run again: never a flow's new answer
        try:
            return await self.run(held, message, wait=False)
        finally:
            _RERUN.reset(token)

    async def _failed_before_handlers(self, held: Held, exc: Exception) -> None:
        now = self._common.clock.now()
        attempts = int(held.value.get("attempts", 0))
        log.warning(
            "inbound %s failed before its handlers (attempt %d): %s", held.key, attempts, exc
        )
        decision = self._retries.decide(exc, attempts, self._common.rng)
        if isinstance(decision, GiveUp):
            await self._dead(held, error_of(exc, decision.reason))
            return
        error = error_of(exc, Reason.HANDLE_FAILED)
        first = held.value.get("failed_first", now)
        retry = revise(
            held.value, now, state=InboxState.PENDING, lease=None, error=error, failed_first=first
        )
        await self._common.leases.write(
            held, retry, Write.INBOX_MARK_RETRY, due=now + decision.delay
        )

    async def _dead(self, target: Held | Entry, error: Json) -> None:
        now = self._common.clock.now()
        first = target.value.get("failed_first", now)
        dead = revise(
            target.value, now, state=InboxState.DEAD, lease=None, error=error, failed_first=first
        )
        publisher = self._common.publisher
        copied = publisher is not None and publisher.dead_letters
        rides = copied and publisher is not None and publisher.rides
        due = None
        if copied and not rides:  # its dead letter goes out; copied again until acked
            dead["published"] = False
            due = now + self._lease
        # riding with the record, the dead letter commits with it (``Publisher.ride``)
        back = publisher.ride_inbound(target.key, dead) if rides and publisher else None
        try:
            written = await self._common.leases.write(target, dead, Write.INBOX_MARK_DEAD, due=due)
        except BaseException:
            if back is not None:
                back()
            raise
        if not written:
            if back is not None:
                back()
            return
        if isinstance(target, Held):
            target.value = dead
        self._common.metrics.inbound_dead += 1
        log.error("inbound %s dead-lettered: %s", dead["id"], error["message"])
        if copied and not rides and publisher is not None:
            await publisher.publish_inbound(dead)
        await self._common.emit(
            DeadEvent("inbox", dead["id"], Reason(error["reason"]), error["message"])
        )
