"""The flow runner: a bot's conversation flows in their chats, turn by turn.

A message of a chat with an active flow is that flow's turn (``route``); ``start`` begins
one in a handler's chat, ``start_outside`` in any chat; the sweeper times a pending ask out
(``due`` for a journaled flow, ``sweep`` for one kept in memory). Each turn replays the
flow against its checkpoint (``conversation.py``) and keeps the new checkpoint: a
persistent flow's rides on the inbound's ``inbox.mark_done`` write (one commit), through
the turn's ``riders``; an in-memory flow's stays in this process.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from botmesh._bot.conversation import (
    Conversation,
    Diverged,
    FlowSends,
    TurnResult,
    drive,
    json_args,
    opening_sends,
)
from botmesh._bot.flow import Flow
from botmesh._bot.parts import Host, Slot, Turn
from botmesh.state.checkpoints import ACTIVE, ended_record, fresh_record
from botmesh.state.errors import FlowDivergedError, FlowVersionError
from botmesh.state.events import ErrorEvent, FlowEndedEvent
from botmesh.state.inbox import rerunning
from botmesh.state.kv import Entry, copy_json
from botmesh.state.records import Json

__all__ = ["FlowRunner"]

log = logging.getLogger("botmesh.flows")


class FlowRunner:
    """Runs the turns of a bot's flows for one runtime: routing, replay, checkpoints."""

    def __init__(self, host: Host, flows: dict[str, Flow[Any]]) -> None:
        self._host = host
        self._flows = flows
        self._sends = FlowSends(host)
        #: Checkpoints kept in memory: non-persistent flows (and every flow without a journal).
        self._memory: dict[str, Json] = {}
        self._any_journaled = any(f.persistent for f in self._flows.values())

    # -- loading and storing ------------------------------------------------------------

    def _key(self, chat_id: str) -> str:
        engine = self._host.engine
        return engine.checkpoints.key(chat_id) if engine is not None else "flow/" + chat_id

    async def load(self, chat_id: str) -> Slot:
        key = self._key(chat_id)
        mem = self._memory.get(chat_id)
        if mem is not None and mem["status"] == ACTIVE:
            return Slot(key, mem, 0, False)
        engine = self._host.engine
        if engine is not None and self._any_journaled:
            entry = await engine.checkpoints.get(key)
            if entry is not None:
                return Slot(key, entry.value, entry.version, True)
            return Slot(key, None, 0, True)
        return Slot(key, mem, 0, False)

    def _persistent(self, record: Json) -> bool:
        flow = self._flows.get(record["flow"])
        return self._host.engine is not None and (flow is None or flow.persistent)

    def store(self, turn: Turn, slot: Slot, record: Json) -> None:
        """Keep ``record`` as the chat's checkpoint: journaled ones ride on the inbound's
        done write (``turn.riders``), in-memory ones are kept at once."""
        chat = record["chat_id"]
        if self._persistent(record):
            engine = self._host.engine
            assert engine is not None
            now = engine.clock.now()
            # compare-and-set on the version this turn read (unknown when the chat's flow
            # was an in-memory one: then the write replaces whatever is there)
            expect = slot.version if slot.journaled else None
            turn.riders[slot.key] = engine.checkpoints.op(slot.key, record, expect=expect, now=now)
            self._memory.pop(chat, None)
        else:
            self._memory[chat] = record
            if slot.journaled and slot.record is not None and slot.record["status"] == ACTIVE:
                # a journaled flow replaced by an in-memory one: end it in the journal too
                engine = self._host.engine
                assert engine is not None
                now = engine.clock.now()
                gone = ended_record(slot.record, "cancelled", now)
                turn.riders[slot.key] = engine.checkpoints.op(
                    slot.key, gone, expect=slot.version, now=now
                )
        slot.record = record

    # -- routing: a message of a chat -----------------------------------------------------

    async def route(self, turn: Turn) -> bool:
        """Give ``turn.message`` to its chat's active flow; True when the flow took it (the
        handlers do not run), False when it goes to the handlers."""
        message = turn.message
        slot = await self.load(message.chat_id)
        turn.flow = slot
        record = slot.record
        if record is None:
            return False
        if any(s.get("src") == message.id for s in record["steps"]):
            return True  # consumed already: a redelivery of a done turn writes nothing
        if record["status"] != ACTIVE:
            return False
        if record["origin"]["base"] == message.id:
            # the message that started this flow, run again: its done mark was lost while the
            # checkpoint its turn wrote was kept (on the Kafka journal they are two records,
            # and a kill can fall between them). Its handlers run again; ``start`` finds the
            # flow started by it already, and its sends are answered from the outbox
            return False
        if rerunning():
            # a message run again (a done one delivered again by an offset replay after a
            # crash, or an operator's replay_inbound or redrive of an old one) that is not
            # one of the flow's steps: the handlers had it the first time (the message that
            # started this flow among them: ``start`` finds the flow started already), or
            # it never ran (dead), so the handlers have it now; it is not an answer
            return False
        flow = self._flows.get(record["flow"])
        problem = _refusal(flow, record)
        if problem is not None:
            return await self._incompatible(turn, slot, flow, problem)
        assert flow is not None
        text = message.text
        if text is not None and text.strip() in flow.cancel:
            step: Json = {"kind": "cancel", "src": message.id, "text": text.strip()}
        else:
            step = {"kind": "answer", "src": message.id, "text": text}
            if message.media is not None:
                step["message"] = self._sends.journaled(message)
        outcome = await self._turn(flow, record, step)
        if isinstance(outcome, Diverged):
            err = FlowDivergedError(flow.name, message.chat_id, _diverged_text(flow, outcome))
            return await self._incompatible(turn, slot, flow, err)
        self.store(turn, slot, outcome.record)
        await self._ended(flow, outcome)
        return True

    async def _incompatible(
        self, turn: Turn, slot: Slot, flow: Flow[Any] | None, err: FlowVersionError
    ) -> bool:
        record = slot.record
        assert record is not None
        policy = flow.on_incompatible if flow is not None else "refuse"
        host = self._host
        now = host.now()
        await host.emit(ErrorEvent(err, "flow", turn.message.id))
        if policy == "refuse" or flow is None:
            log.error("%s (the message goes to the handlers)", err)
            return False
        if policy == "drop":
            self.store(turn, slot, ended_record(record, "dropped", now))
            await host.emit(FlowEndedEvent(record["flow"], record["chat_id"], "dropped", None, err))
            return False
        await host.emit(FlowEndedEvent(record["flow"], record["chat_id"], "dropped", None, err))
        await self._start(turn, slot, flow, record["args"], replace=False)
        return True

    # -- starting -----------------------------------------------------------------------

    async def start(self, turn: Turn, flow: Flow[Any] | str, args: Mapping[str, Any]) -> None:
        """``ctx.start_flow``: start ``flow`` in the message's chat (replacing an active
        flow there: it ends ``cancelled``); its first question goes out now."""
        resolved = self.resolve(flow)
        slot = turn.flow if turn.flow is not None else await self.load(turn.message.chat_id)
        turn.flow = slot
        record = slot.record
        if (
            record is not None
            and record["status"] == ACTIVE
            and record["flow"] == resolved.name
            and record["origin"]["base"] == turn.message.id
            and not record.get("restart")
        ):
            return  # this very message started it already (a redelivery): nothing new
        await self._start(turn, slot, resolved, dict(args), replace=True)

    async def _start(
        self, turn: Turn, slot: Slot, flow: Flow[Any], args: Json, *, replace: bool
    ) -> None:
        host = self._host
        old = slot.record
        if replace and old is not None and old["status"] == ACTIVE:
            await host.emit(FlowEndedEvent(old["flow"], old["chat_id"], "cancelled"))
        record = fresh_record(
            flow.name,
            flow.version,
            turn.message.chat_id,
            json_args(flow, args),
            host.now(),
            origin=turn.message.id,
            n=turn.sends,
        )
        sends, outcome = await self._run_start(flow, record)
        turn.sends += sends
        self.store(turn, slot, outcome.record)
        await self._ended(flow, outcome)

    async def _run_start(self, flow: Flow[Any], record: Json) -> tuple[int, TurnResult]:
        conv = Conversation(self._sends, flow, record, None, self._host.now())
        outcome = await self._drive(flow, conv)
        assert not isinstance(outcome, Diverged)  # nothing recorded: nothing to diverge from
        return opening_sends(conv), outcome

    async def start_outside(
        self, chat_id: str, flow: Flow[Any] | str, args: Mapping[str, Any]
    ) -> None:
        """``app.start_flow``: start ``flow`` in ``chat_id`` outside a handler (a reminder,
        an operator). A persistent flow's record is written first (``flow.checkpoint``,
        marked to be started), then its start runs: after a crash in between, the sweeper
        runs it, its sends (``flow:<run>:0:<n>``) answered from the outbox."""
        resolved = self.resolve(flow)
        slot = await self.load(chat_id)
        old = slot.record
        now = self._host.now()
        record = fresh_record(
            resolved.name, resolved.version, chat_id, json_args(resolved, dict(args)), now
        )
        if old is not None and old["status"] == ACTIVE:
            await self._host.emit(FlowEndedEvent(old["flow"], chat_id, "cancelled"))
        engine = self._host.engine
        if resolved.persistent and engine is not None:
            record["restart"] = True
            self._memory.pop(chat_id, None)
            expect = slot.version if slot.journaled else None
            version = await engine.checkpoints.write(slot.key, record, expect=expect, now=now)
            await self.due(Entry(slot.key, record, version, due=now), now)
            return
        if slot.journaled and old is not None and old["status"] == ACTIVE and engine is not None:
            gone = ended_record(old, "cancelled", now)
            await engine.checkpoints.write(slot.key, gone, expect=slot.version, now=now)
        _, outcome = await self._run_start(resolved, record)
        self._memory[chat_id] = outcome.record
        await self._ended(resolved, outcome)

    def resolve(self, flow: Flow[Any] | str) -> Flow[Any]:
        if isinstance(flow, Flow):
            registered = self._flows.get(flow.name)
            if registered is not flow:
                raise ValueError(f"flow {flow.name!r} is not registered on this bot")
            return flow
        found = self._flows.get(flow)
        if found is None:
            names = ", ".join(sorted(self._flows)) or "none"
            raise ValueError(f"no flow named {flow!r} on this bot (registered: {names})")
        return found

    # -- the sweeper: timeouts and operator restarts -----------------------------------------

    async def due(self, entry: Entry, now: float) -> int:
        """A journaled checkpoint whose due time came: time its pending ask out, or run
        the start of an operator's restart. Written under ``flow.checkpoint``."""
        record = entry.value
        if record.get("status") != ACTIVE or record.get("parked"):
            return 0
        flow = self._flows.get(record["flow"])
        problem = _refusal(flow, record)
        outcome: TurnResult | Diverged
        if flow is not None and record.get("restart"):
            # a restart starts the flow under this code, whatever version it was
            fresh = {**record, "version": flow.version}
            fresh.pop("restart")
            problem = None
            outcome = (await self._run_start(flow, fresh))[1]
        elif problem is None and flow is not None:
            deadline = record.get("deadline")
            if deadline is None or deadline > now:
                return 0
            src = f"flow:{record['run']}:{len(record['steps']) + 1}"
            outcome = await self._turn(flow, record, {"kind": "timeout", "src": src})
        else:
            outcome = Diverged(str(problem))
        if isinstance(outcome, Diverged):
            err = problem or FlowDivergedError(
                record["flow"], record["chat_id"], _diverged_text(flow, outcome)
            )
            await self._host.emit(ErrorEvent(err, "flow"))
            if flow is not None and flow.on_incompatible == "drop":
                outcome = TurnResult(ended_record(record, "dropped", now), "dropped", None, err)
            else:  # parked until a message or an operator: the sweeper leaves it alone
                parked = {**record, "parked": str(err), "updated": now}
                return await self._write(entry, parked, now)
        acted = await self._write(entry, outcome.record, now)
        if acted and flow is not None:
            await self._ended(flow, outcome)
        return acted

    async def _write(self, entry: Entry, record: Json, now: float) -> int:
        engine = self._host.engine
        assert engine is not None
        # 0 when a message (or another replica) moved the flow first
        return int(await engine.checkpoints.write_over(entry, record, now))

    async def sweep(self, now: float) -> int:
        """Time out the pending asks of in-memory flows whose deadline passed."""
        acted = 0
        for chat, record in list(self._memory.items()):
            if record["status"] != ACTIVE:
                self._memory.pop(chat, None)
                continue
            deadline = record.get("deadline")
            flow = self._flows.get(record["flow"])
            if deadline is None or deadline > now or flow is None:
                continue
            src = f"flow:{record['run']}:{len(record['steps']) + 1}"
            outcome = await self._turn(flow, record, {"kind": "timeout", "src": src})
            if isinstance(outcome, Diverged):
                continue
            if self._memory.get(chat) is record:
                self._memory[chat] = outcome.record
            await self._ended(flow, outcome)
            acted += 1
        return acted

    # -- one turn -------------------------------------------------------------------------

    async def _turn(self, flow: Flow[Any], record: Json, step: Json) -> TurnResult | Diverged:
        """Replay ``record`` and feed ``step`` at the first ask past it."""
        work: Json = copy_json(record)
        work.pop("parked", None)
        conv = Conversation(self._sends, flow, work, step, self._host.now())
        return await self._drive(flow, conv)

    async def _drive(self, flow: Flow[Any], conv: Conversation) -> TurnResult | Diverged:
        outcome = await drive(flow, conv, self._host.now())
        if isinstance(outcome, TurnResult) and outcome.status == "failed":
            assert outcome.error is not None  # a failed flow raised it
            await self._host.emit(ErrorEvent(outcome.error, "flow", outcome.src))
        return outcome

    async def _ended(self, flow: Flow[Any], outcome: TurnResult) -> None:
        if outcome.status is None:
            return
        record = outcome.record
        await self._host.emit(
            FlowEndedEvent(
                flow.name, record["chat_id"], outcome.status, outcome.result, outcome.error
            )
        )


def _refusal(flow: Flow[Any] | None, record: Json) -> FlowVersionError | None:
    name, chat = record["flow"], record["chat_id"]
    if flow is None:
        return FlowVersionError(
            name,
            chat,
            "no flow of that name is registered on this bot; register it again, or "
            "drop the checkpoint: app.durability.drop_flow(chat_id)",
        )
    have = int(record.get("version", 1))
    if have != flow.version:
        return FlowVersionError(
            name,
            chat,
            f"the checkpoint was written by version {have}, this code is version "
            f"{flow.version}: restart it (app.durability.restart_flow(chat_id), or "
            "on_incompatible='restart') or drop it (drop_flow, on_incompatible='drop')",
        )
    return None


def _diverged_text(flow: Flow[Any] | None, div: Diverged) -> str:
    version = flow.version if flow is not None else "?"
    return (
        f"the code (version {version}) does not replay the checkpoint: {div.message}; bump "
        "the flow's version when you change its questions or their order, and restart or "
        "drop the checkpoint (app.durability.restart_flow / drop_flow)"
    )
