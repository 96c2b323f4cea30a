"""Flow checkpoints: the journal record of a chat's conversation flow, and its view.

A persistent flow's checkpoint lives under ``<scope>/flow/<chat id>``, one per chat::

    {"flow", "version", "run", "chat_id", "args", "origin": {"base", "n"},
     "steps": [{"kind": "answer"|"timeout"|"cancel", "ask", "src", "text", "message"}],
     "asks": [question fingerprint, ...], "data": {...}, "status", "state", "deadline",
     "restart", "parked", "result", "created", "updated"}

``steps`` are the inputs the flow consumed, in order: each answer (its inbound id in
``src``, its text, and the journaled inbound when it carried media), each refused answer
too (a replay takes the same path), each timeout and cancel. ``ask`` is the ordinal of the
``conv.ask`` a step fed and ``asks`` the fingerprint of each ask reached: a replay that
meets another question, or ends where a step was recorded, has diverged. ``status`` is
``active`` while the flow waits, else how it ended (``botmesh.state.events.FlowStatus``);
``state`` is ``active`` or ``done`` (the record's life, as retention reads it); ``data``
is ``conv.state`` as the last turn left it. An active record's ``due`` index score is
its pending ask's ``deadline`` (or now, for a ``restart`` the sweeper runs), so the
sweeper finds it. An ended record is kept until
retention (its ``state`` is ``done``), so a redelivered last answer is recognised.

``Checkpoints`` reads and writes them: alone (``flow.checkpoint``: a start outside a handler,
a timeout fired by the sweeper, an operator's restart or drop), or as the write a turn fed by
an inbound returns, which lands in that inbound's ``inbox.mark_done`` commit.

Sends of a flow are keyed by the segment they belong to: the sends made before the first
step under ``origin`` (``<inbound id>:<n>``, continuing the starting handler's sequence, or
``flow:<run>:0:<n>``), those made after step ``k`` under that step's ``src``:
``<inbound id>:<n>`` for an answer or cancel, ``flow:<run>:<k>:<n>`` for a timeout.
"""

from __future__ import annotations

import hashlib
import uuid
from dataclasses import dataclass
from typing import Any

from botmesh.state.errors import VersionConflictError
from botmesh.state.kv import DurableKv, Entry, Put, handover
from botmesh.state.records import Json
from botmesh.state.retention import PurgeAt
from botmesh.state.writes import Write

__all__ = [
    "ACTIVE",
    "Checkpoints",
    "FlowRecord",
    "ended_record",
    "fresh_record",
    "question_fp",
]

#: The ``status`` of a flow waiting for an answer.
ACTIVE = "active"


def fresh_record(
    flow: str,
    version: int,
    chat_id: str,
    args: Json,
    now: float,
    *,
    origin: str | None = None,
    n: int = 0,
) -> Json:
    """A new run of ``flow`` in ``chat_id``, not started yet: its first sends are keyed from
    ``origin`` (the inbound that started it), else from the run id."""
    run = uuid.uuid4().hex[:16]
    return {
        "flow": flow,
        "version": version,
        "run": run,
        "chat_id": chat_id,
        "args": args,
        "origin": {"base": origin if origin is not None else f"flow:{run}:0", "n": n},
        "steps": [],
        "asks": [],
        "data": {},
        "status": ACTIVE,
        "state": ACTIVE,
        "deadline": None,
        "created": now,
        "updated": now,
    }


def ended_record(value: Json, status: str, now: float, result: Any = None) -> Json:
    """``value`` ended with ``status``: no deadline, ``state`` done (retention purges it)."""
    ended = {**value, "status": status, "state": "done", "deadline": None, "updated": now}
    ended.pop("restart", None)
    ended.pop("parked", None)
    if result is not None:
        ended["result"] = result
    return ended


def question_fp(text: str | None) -> str:
    """The fingerprint of a question (its text; ``""`` for an ask that sends nothing)."""
    return hashlib.sha256((text or "").encode()).hexdigest()[:16]


def _due(record: Json, now: float) -> float | None:
    """When the sweeper looks at an active checkpoint: now for a restart, else its pending
    ask's deadline (``None``: it has none)."""
    if record.get("restart"):
        return now
    deadline = record.get("deadline")
    return float(deadline) if deadline is not None else None


class Checkpoints:
    """The flow checkpoints of one scope in the journal, under ``<scope>/flow/``."""

    def __init__(self, kv: DurableKv, *, prefix: str, purge_at: PurgeAt) -> None:
        self._kv = kv
        self._prefix = prefix
        self._purge_at = purge_at

    def key(self, chat_id: str) -> str:
        """The key of the chat's checkpoint."""
        return self._prefix + chat_id

    async def get(self, key: str) -> Entry | None:
        return await self._kv.get(key)

    def op(self, key: str, record: Json, *, expect: int | None, now: float) -> Put:
        """The write of ``record`` as the checkpoint under ``key``, a compare-and-set on
        version ``expect`` (``None``: over whatever is there). An active record is due as
        ``_due`` says (never while parked); an ended one is purged with retention."""
        active = record["status"] == ACTIVE
        due = _due(record, now) if active and not record.get("parked") else None
        purge = None if active else self._purge_at(now)
        return handover(key, record, expect=expect, due=due, purge=purge)

    async def write(self, key: str, record: Json, *, expect: int | None, now: float) -> int:
        """``op`` committed alone (``flow.checkpoint``); returns the record's version.
        ``VersionConflictError`` when the record is not at version ``expect``."""
        [version] = await self._kv.commit(
            [self.op(key, record, expect=expect, now=now)], label=Write.FLOW_CHECKPOINT
        )
        return version

    async def write_over(self, entry: Entry, record: Json, now: float) -> bool:
        """``record`` over the checkpoint ``entry`` read; False when a message (or another
        replica) moved the flow first."""
        try:
            await self.write(entry.key, record, expect=entry.version, now=now)
        except VersionConflictError:
            return False
        return True


@dataclass(frozen=True, slots=True)
class FlowRecord:
    """A read-only view of a chat's flow checkpoint (``app.durability.flows()``)."""

    chat_id: str
    flow: str
    version: int
    run: str
    status: str
    #: Inputs consumed so far (answers, refused answers, timeouts, cancels).
    steps: int
    #: When the pending ask times out (seconds since the epoch), if it has a timeout.
    deadline: float | None
    args: Json
    state: Json
    updated: float
    #: Why the flow is parked (its checkpoint refused by this code), if it is.
    parked: str | None
    #: The journal version of the record.
    record_version: int

    @classmethod
    def from_value(cls, value: Json, record_version: int) -> FlowRecord:
        return cls(
            chat_id=value["chat_id"],
            flow=value["flow"],
            version=int(value.get("version", 1)),
            run=value["run"],
            status=value["status"],
            steps=len(value.get("steps", ())),
            deadline=value.get("deadline"),
            args=value.get("args", {}),
            state=value.get("data", {}),
            updated=float(value.get("updated", 0.0)),
            parked=value.get("parked"),
            record_version=record_version,
        )
