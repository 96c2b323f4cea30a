"""Dead letters for operators (``botmesh dlq``): read the dead-letter topics, pick records by
chat, key, reason or time, and act on them through the chats' owners.

Reading needs no consumer group (nothing is committed): each topic is read from its start
to the end offsets taken when the read began. Acting never touches a journal from here: each
action is a ``botmesh.topics.control.ControlRequest`` produced to ``<prefix>.control`` keyed by the
chat id, carried out by the worker that owns the chat, which answers on
``<prefix>.control.results``; :func:`ask_owners` waits for those answers. :func:`act` is
one command from the dead letters picked to the owners' answers, for ``botmesh dlq`` and
``botmesh console`` alike.

=============  ==================  ====================================================
command        dead letters of     what the owner does
=============  ==================  ====================================================
``retry``      ``outbox.dlq``      ``retry_send``: the send goes out again, once (a send
                                   recorded ``sent`` meanwhile is refused: nothing goes)
``replay``     ``inbound.dlq``     ``replay_inbound``: its handlers run again; a record the
                                   journal never held (it died before it was journaled)
                                   is produced again to ``<prefix>.inbound`` instead,
                                   where its id makes it one message
``discard``    ``outbox.dlq``      ``discard``: the journal forgets the send; one in
                                   flight (retried meanwhile, its provider call under
                                   way) is refused: wait until it settles, then again
=============  ==================  ====================================================
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import Consumer, KafkaException, Message, TopicPartition

from botmesh.streams.clients import (
    ONE_SHOT,
    AsyncProducer,
    metadata,
    partitions_of,
    read_to_end,
    reader,
    watermarks,
)
from botmesh.streams.connection import Brokers
from botmesh.topics import Catalog
from botmesh.topics.control import ControlRequest, ControlResult, decode_result, encode_control
from botmesh.topics.dead_letters import DeadLetter, read_dead_letter
from botmesh.topics.records import chat_key

__all__ = [
    "COMMANDS",
    "DECODE_REASONS",
    "KINDS",
    "ActionReport",
    "Filter",
    "act",
    "ask_owners",
    "command_kind",
    "command_target",
    "control_requests",
    "dlq_topic",
    "parse_when",
    "read_dead_letters",
    "reproduce",
    "unique",
]

#: The dead-letter topics by the name the CLI gives them.
KINDS: tuple[str, ...] = ("inbound", "outbox", "requests")

#: Reasons of records that could not be decoded: replaying them as they are would only
#: dead-letter them again (fix the record and produce it again).
DECODE_REASONS = frozenset(
    {"empty", "bad-json", "not-object", "unknown-version", "missing-chat-id", "wrong-type"}
)

#: ``progress(done, total)`` after each step of a long read or wait.
Progress = Callable[[int, int], None]

#: The commands that act on dead letters, and the control action each asks the owner for.
COMMANDS: dict[str, str] = {
    "retry": "retry_send",
    "replay": "replay_inbound",
    "discard": "discard",
}


def command_kind(command: str) -> str:
    """The dead letters ``command`` acts on: ``inbound`` (replay) or ``outbox``."""
    if command not in COMMANDS:
        raise ValueError(f"unknown command {command!r}: use one of {', '.join(COMMANDS)}")
    return "inbound" if command == "replay" else "outbox"


def command_target(command: str) -> Callable[[DeadLetter], str | None]:
    """What names a dead letter's record for ``command``: the inbound id (replay), else the
    send's idempotency key."""
    if command_kind(command) == "inbound":
        return lambda d: d.inbound_id
    return lambda d: d.send_key


def parse_when(value: str | None, option: str) -> float | None:
    """``--since`` / ``--until``: Unix seconds, or an ISO 8601 time (UTC unless it says
    otherwise); ``ValueError`` naming ``option`` and the forms it takes."""
    if value is None:
        return None
    try:
        return float(value)
    except ValueError:
        pass
    try:
        parsed = dt.datetime.fromisoformat(value)
    except ValueError:
        raise ValueError(
            f"{option} {value!r} is not a time: give Unix seconds or ISO 8601 "
            "(2026-12-03T10:00:00Z)"
        ) from None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=dt.UTC)
    return parsed.timestamp()


def dlq_topic(cat: Catalog, kind: str) -> str:
    """The dead-letter topic of ``kind`` (``inbound``, ``outbox`` or ``requests``)."""
    topics = {"inbound": cat.inbound_dlq, "outbox": cat.outbox_dlq, "requests": cat.requests_dlq}
    if kind not in topics:
        raise ValueError(f"unknown dead-letter kind {kind!r}: use one of {', '.join(KINDS)}")
    return topics[kind]


@dataclass(frozen=True, slots=True)
class Filter:
    """Which dead letters: all given criteria must hold (``None``: any)."""

    chat: str | None = None
    #: The send's idempotency key, or the inbound's id.
    key: str | None = None
    reason: str | None = None
    #: Dead at or after / before (Unix seconds).
    since: float | None = None
    until: float | None = None

    def match(self, letter: DeadLetter) -> bool:
        if self.chat is not None and letter.chat_id != self.chat:
            return False
        if self.key is not None and self.key not in (letter.send_key, letter.inbound_id):
            return False
        if self.reason is not None and letter.reason != self.reason:
            return False
        if self.since is not None and letter.dead_ts < self.since:
            return False
        return self.until is None or letter.dead_ts < self.until


async def read_dead_letters(
    bootstrap: Brokers,
    topics: Sequence[str],
    flt: Filter = Filter(),
    *,
    progress: Progress | None = None,
) -> list[DeadLetter]:
    """The dead letters of ``topics`` that match ``flt``, in topic, partition and offset
    order. Raises ``ConnectionError`` when the broker cannot be reached."""
    cluster = await metadata(bootstrap)  # ``ConnectionError`` naming the brokers
    tps = [(t, p) for t in topics for p in partitions_of(cluster, t)]
    if not tps:
        return []
    found = await asyncio.to_thread(_read, bootstrap, tps, flt, progress)
    found.sort(key=lambda d: (topics.index(d.topic), d.partition, d.offset))
    return found


def _read(
    bootstrap: Brokers, tps: list[tuple[str, int]], flt: Filter, progress: Progress | None
) -> list[DeadLetter]:
    found: list[DeadLetter] = []

    def take(m: Message) -> None:
        _, ts = m.timestamp()
        letter = read_dead_letter(
            str(m.topic()),
            int(m.partition() or 0),
            int(m.offset() or 0),
            ts,
            m.key(),
            m.value(),
            m.headers(),  # type: ignore[arg-type]  # (str, bytes) pairs
        )
        if flt.match(letter):
            found.append(letter)

    consumer = reader(bootstrap, "botmesh-dlq")
    try:
        spans = watermarks(consumer, tps)
        total = sum(end - start for start, end in spans.values())
        read_to_end(
            consumer,
            spans,
            take,
            progress=None if progress is None else (lambda done: progress(done, total)),
        )
    finally:
        consumer.close()
    return found


def unique(
    letters: Iterable[DeadLetter], key: Callable[[DeadLetter], str | None]
) -> list[DeadLetter]:
    """One dead letter per ``key`` (the latest copy: a dead record may be copied twice),
    leaving out those without one."""
    latest: dict[str, DeadLetter] = {}
    for letter in letters:
        k = key(letter)
        if k:
            latest[k] = letter
    return list(latest.values())


def control_requests(
    letters: Iterable[DeadLetter],
    action: str,
    target: Callable[[DeadLetter], str | None],
    *,
    by: str | None = None,
) -> list[ControlRequest]:
    """One control request per dead letter with a target and a chat; ``by`` (who asks, for
    the worker's log) defaults to ``botmesh-cli@<random>``."""
    by = by if by is not None else f"botmesh-cli@{uuid.uuid4().hex[:8]}"
    out = []
    for letter in letters:
        t, chat = target(letter), letter.chat_id
        if t and chat:
            out.append(
                ControlRequest(
                    id=uuid.uuid4().hex,
                    chat_id=chat,
                    action=action,  # type: ignore[arg-type]
                    target=t,
                    by=by,
                )
            )
    return out


async def ask_owners(
    bootstrap: Brokers,
    cat: Catalog,
    requests: Sequence[ControlRequest],
    *,
    wait_s: float = 30.0,
    progress: Progress | None = None,
) -> dict[str, ControlResult]:
    """Produce ``requests`` to the control topic (keyed by chat id, acks=all) and wait up to
    ``wait_s`` seconds for their results; request id -> result, for those answered.
    Raises ``LookupError`` when the control topic does not exist (no worker of this version
    ever ran), ``ConnectionError`` when the broker cannot be reached."""
    if not requests:
        return {}
    cluster = await metadata(bootstrap)  # ``ConnectionError`` naming the brokers
    for topic in (cat.control, cat.control_results):
        if not partitions_of(cluster, topic):
            raise LookupError(
                f"topic {topic!r} does not exist: start a worker of this version (it "
                f"creates it) or run `botmesh topics create --prefix {cat.prefix}`"
            )
    tps = [(cat.control_results, p) for p in partitions_of(cluster, cat.control_results)]
    consumer = reader(
        bootstrap, "botmesh-dlq", {"enable.partition.eof": False, "fetch.wait.max.ms": 100}
    )
    try:
        # the results of earlier requests are not ours: read from the end as it is now
        spans = await asyncio.to_thread(watermarks, consumer, tps)
        consumer.assign([TopicPartition(t, p, spans[(t, p)][1]) for t, p in tps])
        await _produce_requests(bootstrap, cat, requests)
        return await _answers(consumer, {r.id for r in requests}, wait_s, progress)
    finally:
        await asyncio.to_thread(consumer.close)


async def _produce_requests(
    bootstrap: Brokers, cat: Catalog, requests: Sequence[ControlRequest]
) -> None:
    """Each request to the control topic, keyed by its chat id, acknowledged by all."""
    producer = AsyncProducer(bootstrap, settings=ONE_SHOT)
    try:
        acks = [
            await producer.send(cat.control, encode_control(r), key=chat_key(r.chat_id))
            for r in requests
        ]
        await asyncio.gather(*acks)
    finally:
        await producer.close()


async def _answers(
    consumer: Consumer, wanted: set[str], wait_s: float, progress: Progress | None
) -> dict[str, ControlResult]:
    """The results ``consumer`` reads for the ``wanted`` request ids within ``wait_s``
    seconds; request id -> result, for those answered."""
    answered: dict[str, ControlResult] = {}
    polling: asyncio.Future[list[Message]] | None = None
    try:
        deadline = time.monotonic() + wait_s
        while wanted - answered.keys() and time.monotonic() < deadline:
            # shielded: the consumer is closed only once this call returned
            polling = asyncio.ensure_future(asyncio.to_thread(consumer.consume, 500, 0.5))
            for m in await asyncio.shield(polling):
                err = m.error()
                if err is not None:
                    if err.fatal():
                        raise KafkaException(err)
                    continue
                rid = (m.key() or b"").decode(errors="replace")
                if rid in wanted:
                    with contextlib.suppress(Exception):
                        answered[rid] = decode_result(m.value())
            if progress is not None:
                progress(len(answered), len(wanted))
    finally:
        if polling is not None:
            await asyncio.wait([polling])
    return answered


async def reproduce(bootstrap: Brokers, topic: str, letters: Sequence[DeadLetter]) -> int:
    """Produce each dead letter's key and value again to ``topic`` (acks=all), with a header
    ``redriven.from`` naming the dead letter; how many."""
    await metadata(bootstrap)  # the first contact: ``ConnectionError`` naming the brokers
    producer = AsyncProducer(bootstrap, settings=ONE_SHOT)
    try:
        acks = [
            await producer.send(
                topic,
                d.value,
                key=(d.key or "").encode() or None,
                headers=[("redriven.from", f"{d.topic}:{d.partition}:{d.offset}".encode())],
            )
            for d in letters
        ]
        await asyncio.gather(*acks)
    finally:
        await producer.close()
    return len(letters)


@dataclass(slots=True)
class ActionReport:
    """What one command did to the dead letters it was given: a row per record (``target``,
    ``chat_id``, ``outcome`` and, when the owner answered, ``state``, ``detail``,
    ``worker``), and a one-line summary."""

    command: str
    dry_run: bool
    results: list[dict[str, Any]] = field(default_factory=list)
    summary: str = ""
    #: no dead letter of the command's kind matched: nothing was asked
    nothing: bool = False

    @property
    def done(self) -> int:
        return sum(r["outcome"] in ("done", "produced again") for r in self.results)

    @property
    def unanswered(self) -> bool:
        """Some owner did not answer within the wait (no worker running?)."""
        return any(r["outcome"] == "no answer" for r in self.results)

    @property
    def complete(self) -> bool:
        """Every record was acted on (a dry run: every one would be)."""
        if self.nothing:
            return False
        if self.dry_run:
            return True
        return self.done == len(self.results)


async def act(
    bootstrap: Brokers,
    cat: Catalog,
    command: str,
    letters: Sequence[DeadLetter],
    *,
    dry_run: bool = False,
    wait_s: float = 30.0,
    by: str | None = None,
    progress: Progress | None = None,
) -> ActionReport:
    """``command`` (``retry``, ``replay`` or ``discard``) on ``letters`` (dead letters of its
    kind, as read from their topic): one record per target (the latest copy); a record
    that could not be decoded is refused (fix it and produce it again); with ``dry_run``
    say what would be done. Else ask each chat's owner through ``<prefix>.control`` and wait
    up to ``wait_s`` for the answers; a dead inbound the journal never held (it died before
    it was journaled) is produced again to ``<prefix>.inbound`` instead."""
    action = COMMANDS[command]
    ident = command_target(command)
    report = ActionReport(command, dry_run)
    picked = unique(letters, ident)
    undecodable = [d for d in picked if d.reason in DECODE_REASONS]
    picked = [d for d in picked if d.reason not in DECODE_REASONS]
    report.results = [
        {
            "target": ident(d),
            "chat_id": d.chat_id,
            "outcome": "refused",
            "detail": f"it could not be decoded ({d.reason}): fix it and produce it again",
        }
        for d in undecodable
    ]
    if not picked and not undecodable:
        report.nothing = True
        report.summary = f"no {command_kind(command)} dead letters match"
        return report
    if dry_run:
        report.results += [
            {"target": ident(d), "chat_id": d.chat_id, "outcome": "would " + command}
            for d in picked
        ]
        report.summary = f"dry run: {len(picked)} to {command}, nothing done"
        return report
    requests = control_requests(picked, action, ident, by=by)
    answers = await ask_owners(bootstrap, cat, requests, wait_s=wait_s, progress=progress)
    missing_record = _take_answers(report, picked, ident, requests, answers)
    if missing_record:
        await reproduce(bootstrap, cat.inbound, missing_record)
        report.results += [
            {
                "target": ident(d),
                "chat_id": d.chat_id,
                "outcome": "produced again",
                "detail": f"never journaled: produced again to {cat.inbound}",
            }
            for d in missing_record
        ]
    report.summary = f"{command}: {report.done} of {len(report.results)} done"
    return report


def _take_answers(
    report: ActionReport,
    picked: Sequence[DeadLetter],
    ident: Callable[[DeadLetter], str | None],
    requests: Sequence[ControlRequest],
    answers: Mapping[str, ControlResult],
) -> list[DeadLetter]:
    """A row of ``report`` per dead letter picked, with its owner's answer (or none); the
    dead inbound records an owner refused because its journal never held them, which are
    to be produced again to the inbound topic instead."""
    by_target = {r.target: r for r in requests}
    missing_record = []
    for d in picked:
        target = ident(d) or ""
        answer = answers.get(by_target[target].id) if target in by_target else None
        if answer is None:
            report.results.append({"target": target, "chat_id": d.chat_id, "outcome": "no answer"})
            continue
        if (
            COMMANDS[report.command] == "replay_inbound"
            and answer.outcome == "refused"
            and answer.state is None
        ):
            missing_record.append(d)  # never journaled: produced again to the inbound topic
            continue
        report.results.append(
            {
                "target": target,
                "chat_id": d.chat_id,
                "outcome": answer.outcome,
                "state": answer.state,
                "detail": answer.detail,
                "worker": answer.instance,
            }
        )
    return missing_record
