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
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Unpack

from botmesh._bot.flow import Flow
from botmesh._bot.parts import Host
from botmesh._bot.sends import SendOptions, outbound, timing_of
from botmesh.state.checkpoints import ended_record, question_fp
from botmesh.state.durations import Duration, parse_duration
from botmesh.state.errors import FlowCancelled, FlowInvalidAnswer, FlowTimeout
from botmesh.state.events import FlowStatus
from botmesh.state.keys import check_explicit, derived_key
from botmesh.state.media_replay import journaled, rehydrated
from botmesh.state.messages import Inbound, OutboxState, Receipt
from botmesh.state.records import Json, decode_inbound, encode_inbound, receipt_of

__all__ = [
    "Conversation",
    "Diverged",
    "FlowSends",
    "TurnResult",
    "drive",
    "is_json",
    "json_args",
    "opening_sends",
]

log = logging.getLogger("botmesh.flows")


class _Suspend(BaseException):
    """Stops a flow at an ask with nothing to answer it (never seen by flow code that
    catches ``Exception``)."""


class Diverged(BaseException):
    """The replay left the recorded path (carried out of the flow past its handlers)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


@dataclass(slots=True)
class TurnResult:
    """How one turn ended (``src``: the inbound a failed flow's error is about)."""

    record: Json
    status: FlowStatus | None = None  # None: suspended, waiting
    result: Any = None
    error: BaseException | None = None
    src: str | None = None


class Conversation:
    """What a flow gets: ``ask`` and ``say`` in its chat, its ``args`` and its ``state``.

    ``state`` is a small JSON dict saved with the checkpoint at the end of every turn and
    loaded as it was saved at the start of the next: a value computed once (a code drawn
    at random) is kept with ``conv.state.setdefault(...)``; do not accumulate in it (the
    flow re-runs from its start each turn). ``message`` is the inbound of the last answer.
    """

    def __init__(
        self,
        sends: FlowSends,
        flow: Flow[Any],
        record: Json,
        step: Json | None,
        now: float,
    ) -> None:
        self._replies = sends
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
            return await self._replies.replayed(key, self.chat_id, inbound_id)
        return await self._replies.send_live(
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
                raise Diverged(
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
            self.message = self._replies.inbound_of(step, self.chat_id)
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
                raise Diverged(
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


class FlowSends:
    """What a conversation's sends and answers are made of, on the runtime it runs in:
    a live send goes through the runtime's send path, a replayed one is answered from the
    outbox, a recorded answer's inbound is rebuilt from its journaled form."""

    def __init__(self, host: Host) -> None:
        self._host = host

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
        timing = timing_of(opts)
        return await self._host.submit(
            message, key, derived, inbound_id, inline=True, timing=timing
        )

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

    def journaled(self, message: Inbound) -> Json:
        """``message`` as a flow step journals it (its media as a reference)."""
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


async def drive(flow: Flow[Any], conv: Conversation, now: float) -> TurnResult | Diverged:
    """Run the flow coroutine once: suspended at an ask, ended, or diverged. A failed
    flow's error is the caller's to report (``TurnResult.src``: the inbound it is about)."""
    record = conv._record
    result: Any = None
    error: BaseException | None = None
    suspended = False
    try:
        result = await flow.fn(conv)
    except _Suspend:
        suspended = True
    except Diverged as div:
        return div
    except Exception as exc:
        error = exc
    if not suspended and (conv._cursor < len(conv._steps) or conv._input is not None):
        what = "returned" if error is None else f"raised {type(error).__name__}"
        return Diverged(f"the flow {what} where the checkpoint recorded an answer")
    try:
        record.update(data=_json_state(conv), updated=now)
    except TypeError as exc:
        suspended, error = False, exc
    if suspended:
        record["deadline"] = conv._deadline
        return TurnResult(record)
    status: FlowStatus = "done"
    if isinstance(error, FlowCancelled) or (error is None and conv.last_kind == "cancel"):
        status = "cancelled"
    elif isinstance(error, FlowTimeout) or (error is None and conv.last_kind == "timeout"):
        status = "timed_out"
    elif error is not None:
        status = "failed"
        log.warning("flow %s in chat %s failed: %s", flow.name, conv.chat_id, error)
    stored = result if error is None and is_json(result) else None
    src = _last_src(conv) if status == "failed" else None
    return TurnResult(ended_record(record, status, now, stored), status, result, error, src)


def opening_sends(conv: Conversation) -> int:
    """How many sends the turn made before its first recorded step: they continue the
    sequence of the handler that started the flow."""
    return conv._sends if conv._cursor == 0 else 0


def _last_src(conv: Conversation) -> str | None:
    if conv._cursor == 0:
        base: str = conv._record["origin"]["base"]
    else:
        base = conv._steps[conv._cursor - 1]["src"]
    return None if base.startswith("flow:") else base


def is_json(value: object) -> bool:
    if value is None or isinstance(value, str | int | float | bool):
        return True
    if isinstance(value, list | tuple):
        return all(is_json(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and is_json(v) for k, v in value.items())
    return False


def _json_state(conv: Conversation) -> Json:
    if not isinstance(conv.state, dict) or not is_json(conv.state):
        raise TypeError(
            f"flow {conv.flow!r}: conv.state must stay a JSON object (str keys; str, int, "
            "float, bool, None, lists and dicts), it is checkpointed"
        )
    return dict(conv.state)


def json_args(flow: Flow[Any], args: Json) -> Json:
    if not is_json(args):
        raise TypeError(f"start_flow({flow.name!r}, args=...): args must be JSON (they are kept)")
    return args
