"""Conversation flows: a flow is plain sequential async code that asks and waits.

::

    @bot.flow("signup", persistent=True, version=1)
    async def signup(conv: Conversation) -> dict[str, str] | None:
        name = await conv.ask("What is your name?")
        email = await conv.ask("Your email?", validate=lambda t: "@" in t, invalid="Again?")
        return {"name": name, "email": email}

    @bot.when(lambda m: m.text == "/signup")
    async def start(ctx: Context) -> None:
        await ctx.start_flow(signup)

How it runs: deterministic replay. A flow never stays suspended in memory between two
messages. Each turn (a message of the chat, a timeout fired by the sweeper, a start) runs
the flow coroutine again from its beginning against its checkpoint: each ``ask`` returns
the answer recorded for it (refused answers included, so the replay takes the same path)
and every send made before the new input is suppressed (it went out in an earlier turn);
at the first ask past the record, the turn's input (the message) is its answer and the flow
continues live, its sends keyed from that message, until the next ask with nothing to
answer it: there the coroutine is stopped (``_Suspend``, a ``BaseException`` that an
``except Exception`` in the flow cannot swallow) and the new checkpoint is written. A
persistent flow's checkpoint rides on the inbound's ``inbox.mark_done`` write (one
commit); a non-persistent flow's lives in this process only.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Unpack

from botmesh._bot.flow import Flow
from botmesh._bot.parts import Host, Slot, Turn
from botmesh._bot.sends import SendOptions, outbound
from botmesh.state.durations import Duration, parse_duration
from botmesh.state.errors import (
    FlowCancelled,
    FlowDivergedError,
    FlowInvalidAnswer,
    FlowTimeout,
    FlowVersionError,
)
from botmesh.state.events import ErrorEvent, FlowEndedEvent, FlowStatus
from botmesh.state.flows import ACTIVE, ended_record, fresh_record, question_fp
from botmesh.state.inbox import rerunning
from botmesh.state.keys import check_explicit, derived_key
from botmesh.state.kv import Entry, copy_json
from botmesh.state.media import journaled, rehydrated
from botmesh.state.messages import Inbound, OutboxState, Receipt
from botmesh.state.records import Json, decode_inbound, encode_inbound, receipt_of

__all__ = ["Conversation", "FlowRunner"]

log = logging.getLogger("botmesh.flows")


class _Suspend(BaseException):
    """Stops a flow at an ask with nothing to answer it (never seen by flow code that
    catches ``Exception``)."""


class _Diverged(BaseException):
    """The replay left the recorded path (carried out of the flow past its handlers)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


@dataclass(slots=True)
class _Result:
    """How one turn ended."""

    record: Json
    status: FlowStatus | None = None  # None: suspended, waiting
    result: Any = None
    error: BaseException | None = None


class Conversation:
    """What a flow gets: ``ask`` and ``say`` in its chat, its ``args`` and its ``state``.

    ``state`` is a small JSON dict saved with the checkpoint at the end of every turn and
    loaded as it was saved at the start of the next: a value computed once (a code drawn
    at random) is kept with ``conv.state.setdefault(...)``; do not accumulate in it (the
    flow re-runs from its start each turn). ``message`` is the inbound of the last answer.
    """

    def __init__(
        self,
        runner: FlowRunner,
        flow: Flow[Any],
        record: Json,
        step: Json | None,
        now: float,
    ) -> None:
        self._runner = runner
        self._flow = flow
        self._record = record
        self._steps: list[Json] = record["steps"]
        self._asks: list[str] = record["asks"]
        self._run: str = record["run"]
        self._input = step
        #: A turn without an input (a start) is live from its beginning.
        self._live = step is None
        self._cursor = 0
        self._ask_n = 0
        self._sends = 0  # sends of the current segment
        self._now = now
        self._deadline: float | None = None
        self.chat_id: str = record["chat_id"]
        self.args: Json = record["args"]
        self.state: Json = record["data"]
        self.message: Inbound | None = None
        self.last_kind: str | None = None

    @property
    def flow(self) -> str:
        return self._flow.name

    @property
    def replaying(self) -> bool:
        """True while the flow re-runs recorded steps (its sends are suppressed)."""
        return not self._live

    # -- sends ------------------------------------------------------------------------

    def _segment_key(self) -> tuple[str, str | None]:
        """The key of the next send of this segment, and the inbound it answers."""
        self._sends += 1
        if self._cursor == 0:
            origin = self._record["origin"]
            base, n = origin["base"], int(origin["n"]) + self._sends
        else:
            base, n = self._steps[self._cursor - 1]["src"], self._sends
        inbound = None if base.startswith("flow:") else base
        return derived_key(base, n), inbound

    async def say(self, text: str | None = None, **opts: Unpack[SendOptions]) -> Receipt:
        """Send to the flow's chat. While the flow replays recorded steps the send is not
        made again: the receipt comes from the outbox (or a stand-in when it was purged)."""
        key, inbound_id = self._segment_key()
        given = opts.get("idempotency_key")
        explicit = given is not None
        if given is not None:
            key = check_explicit(given)
        if not self._live:
            return await self._runner.replayed(key, self.chat_id, inbound_id)
        return await self._runner.send_live(
            self.chat_id, text=text, opts=opts, key=key, derived=not explicit, inbound_id=inbound_id
        )

    async def ask(
        self,
        text: str | None = None,
        *,
        validate: Callable[[str], bool] | None = None,
        parse: Callable[[str], Any] | None = None,
        invalid: str | None = None,
        timeout: Duration | None = None,  # noqa: ASYNC109 - a wait of the conversation
        max_tries: int | None = None,
        **opts: Unpack[SendOptions],
    ) -> Any:
        """Send ``text`` (when given) and wait for the chat's next message; return its text,
        or ``parse(text)``. An answer that ``validate`` refuses or ``parse`` cannot read
        (``ValueError``) gets ``invalid`` (when given) and the flow waits again, at the
        same step; after ``max_tries`` refused answers ``FlowInvalidAnswer`` is raised.
        ``timeout`` (``"10m"``, a ``timedelta``, milliseconds) raises ``FlowTimeout`` here
        when no answer came in time; a cancel command raises ``FlowCancelled``."""
        seconds = parse_duration(timeout, "conv.ask timeout") if timeout is not None else None
        if max_tries is not None and (isinstance(max_tries, bool) or max_tries < 1):
            raise ValueError(f"conv.ask max_tries must be an int >= 1, got {max_tries!r}")
        ordinal = self._ask_n
        self._ask_n += 1
        fp = question_fp(text)
        if ordinal < len(self._asks):
            if self._asks[ordinal] != fp and not self._live:
                raise _Diverged(
                    f"ask #{ordinal + 1} asks {text!r}, another question than the recorded one"
                )
            self._asks[ordinal] = fp
        else:
            self._asks.append(fp)
        if text is not None:
            await self.say(text, **opts)
        tries = 0
        while True:
            step = self._next(ordinal, seconds)
            kind = step["kind"]
            self.last_kind = kind
            if kind == "timeout":
                raise FlowTimeout(self.flow, self.chat_id, f"no answer to ask #{ordinal + 1}")
            if kind == "cancel":
                raise FlowCancelled(self.flow, self.chat_id, f"cancelled by {step['text']!r}")
            self.message = self._runner.inbound_of(step, self.chat_id)
            answer: str = step.get("text") or ""
            tries += 1
            try:
                ok = validate(answer) if validate is not None else True
                value = parse(answer) if ok and parse is not None else answer
            except ValueError:
                ok = False
            if ok:
                return value
            if max_tries is not None and tries >= max_tries:
                raise FlowInvalidAnswer(
                    self.flow, self.chat_id, f"{tries} answers to ask #{ordinal + 1} refused"
                )
            if invalid is not None:
                await self.say(invalid)

    def _next(self, ordinal: int, timeout: float | None) -> Json:
        if self._cursor < len(self._steps):
            step = self._steps[self._cursor]
            if step.get("ask") != ordinal:
                raise _Diverged(
                    f"recorded step {self._cursor + 1} answered ask #{step.get('ask', 0) + 1}, "
                    f"the code now waits at ask #{ordinal + 1}"
                )
            self._advance()
            return step
        if self._input is not None:
            step, self._input = {**self._input, "ask": ordinal}, None
            self._steps.append(step)
            self._advance()
            self._live = True
            return step
        self._deadline = None if timeout is None else self._now + timeout
        raise _Suspend

    def _advance(self) -> None:
        self._cursor += 1
        self._sends = 0


class FlowRunner:
    """Runs the turns of a bot's flows for one runtime: routing, replay, checkpoints."""

    def __init__(self, host: Host, flows: dict[str, Flow[Any]]) -> None:
        self._host = host
        self._flows = flows
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
                step["message"] = self._journaled(message)
        outcome = await self._turn(flow, record, step)
        if isinstance(outcome, _Diverged):
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
            _json_args(flow, args),
            host.now(),
            origin=turn.message.id,
            n=turn.sends,
        )
        sends, outcome = await self._run_start(flow, record)
        turn.sends += sends
        self.store(turn, slot, outcome.record)
        await self._ended(flow, outcome)

    async def _run_start(self, flow: Flow[Any], record: Json) -> tuple[int, _Result]:
        conv = Conversation(self, flow, record, None, self._host.now())
        outcome = await self._drive(flow, conv)
        assert not isinstance(outcome, _Diverged)  # nothing recorded: nothing to diverge from
        return (conv._sends if conv._cursor == 0 else 0), outcome

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
            resolved.name, resolved.version, chat_id, _json_args(resolved, dict(args)), now
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
        outcome: _Result | _Diverged
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
            outcome = _Diverged(str(problem))
        if isinstance(outcome, _Diverged):
            err = problem or FlowDivergedError(
                record["flow"], record["chat_id"], _diverged_text(flow, outcome)
            )
            await self._host.emit(ErrorEvent(err, "flow"))
            if flow is not None and flow.on_incompatible == "drop":
                outcome = _Result(ended_record(record, "dropped", now), "dropped", None, err)
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
            if isinstance(outcome, _Diverged):
                continue
            if self._memory.get(chat) is record:
                self._memory[chat] = outcome.record
            await self._ended(flow, outcome)
            acted += 1
        return acted

    # -- one turn -------------------------------------------------------------------------

    async def _turn(self, flow: Flow[Any], record: Json, step: Json) -> _Result | _Diverged:
        """Replay ``record`` and feed ``step`` at the first ask past it."""
        work: Json = copy_json(record)
        work.pop("parked", None)
        conv = Conversation(self, flow, work, step, self._host.now())
        return await self._drive(flow, conv)

    async def _drive(self, flow: Flow[Any], conv: Conversation) -> _Result | _Diverged:
        """Run the flow coroutine once: suspended at an ask, ended, or diverged."""
        record = conv._record
        now = self._host.now()
        result: Any = None
        error: BaseException | None = None
        suspended = False
        try:
            result = await flow.fn(conv)
        except _Suspend:
            suspended = True
        except _Diverged as div:
            return div
        except Exception as exc:
            error = exc
        if not suspended and (conv._cursor < len(conv._steps) or conv._input is not None):
            what = "returned" if error is None else f"raised {type(error).__name__}"
            return _Diverged(f"the flow {what} where the checkpoint recorded an answer")
        try:
            record.update(data=_json_state(conv), updated=now)
        except TypeError as exc:
            suspended, error = False, exc
        if suspended:
            record["deadline"] = conv._deadline
            return _Result(record)
        status: FlowStatus = "done"
        if isinstance(error, FlowCancelled) or (error is None and conv.last_kind == "cancel"):
            status = "cancelled"
        elif isinstance(error, FlowTimeout) or (error is None and conv.last_kind == "timeout"):
            status = "timed_out"
        elif error is not None:
            status = "failed"
            log.warning("flow %s in chat %s failed: %s", flow.name, conv.chat_id, error)
            await self._host.emit(ErrorEvent(error, "flow", _last_src(conv)))
        stored = result if error is None and _is_json(result) else None
        return _Result(ended_record(record, status, now, stored), status, result, error)

    async def _ended(self, flow: Flow[Any], outcome: _Result) -> None:
        if outcome.status is None:
            return
        record = outcome.record
        await self._host.emit(
            FlowEndedEvent(
                flow.name, record["chat_id"], outcome.status, outcome.result, outcome.error
            )
        )

    # -- sends ----------------------------------------------------------------------------

    async def send_live(
        self,
        chat_id: str,
        *,
        text: str | None,
        opts: SendOptions,
        key: str,
        derived: bool,
        inbound_id: str | None,
    ) -> Receipt:
        message = outbound(chat_id, text, opts)
        return await self._host.submit(message, key, derived, inbound_id, inline=True)

    async def replayed(self, key: str, chat_id: str, inbound_id: str | None) -> Receipt:
        """The receipt of a send an earlier turn made: from the outbox, else a stand-in
        (purged by retention, or no journal). Nothing is sent, nothing journaled."""
        engine = self._host.engine
        now = self._host.now()
        if engine is not None:
            entry = await engine.kv.get(engine.out_prefix + key)
            if entry is not None:
                return receipt_of(entry.value, now)
        return Receipt(
            key=key,
            chat_id=chat_id,
            message_id=None,
            state=OutboxState.SENT,
            inbound_id=inbound_id,
            ts=now,
        )

    def _journaled(self, message: Inbound) -> Json:
        engine = self._host.engine
        refs = engine.config.inbox.media_refs if engine is not None else True
        return encode_inbound(journaled(message, self._host.provider, media_refs=refs))

    def inbound_of(self, step: Json, chat_id: str) -> Inbound:
        """The inbound of a recorded answer (its media rebuilt from the journaled form)."""
        encoded = step.get("message")
        if encoded is not None:
            try:
                return rehydrated(decode_inbound(encoded), self._host.provider)
            except Exception as exc:  # the text is what the flow needs
                log.warning("flow answer %s: journaled message unreadable: %s", step["src"], exc)
        return Inbound(id=step["src"], chat_id=chat_id, text=step.get("text"))


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


def _diverged_text(flow: Flow[Any] | None, div: _Diverged) -> str:
    version = flow.version if flow is not None else "?"
    return (
        f"the code (version {version}) does not replay the checkpoint: {div.message}; bump "
        "the flow's version when you change its questions or their order, and restart or "
        "drop the checkpoint (app.durability.restart_flow / drop_flow)"
    )


def _last_src(conv: Conversation) -> str | None:
    if conv._cursor == 0:
        base: str = conv._record["origin"]["base"]
    else:
        base = conv._steps[conv._cursor - 1]["src"]
    return None if base.startswith("flow:") else base


def _is_json(value: object) -> bool:
    if value is None or isinstance(value, str | int | float | bool):
        return True
    if isinstance(value, list | tuple):
        return all(_is_json(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _is_json(v) for k, v in value.items())
    return False


def _json_state(conv: Conversation) -> Json:
    if not isinstance(conv.state, dict) or not _is_json(conv.state):
        raise TypeError(
            f"flow {conv.flow!r}: conv.state must stay a JSON object (str keys; str, int, "
            "float, bool, None, lists and dicts), it is checkpointed"
        )
    return dict(conv.state)


def _json_args(flow: Flow[Any], args: Json) -> Json:
    if not _is_json(args):
        raise TypeError(f"start_flow({flow.name!r}, args=...): args must be JSON (they are kept)")
    return args
