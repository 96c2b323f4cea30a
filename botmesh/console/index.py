"""What the console knows from following its topics: each chat's journal records, receipts
and dead letters, the dead letters of every kind, the ambiguous sends, and the counters the
workers published, over time.

:class:`Index` is fed batches of records (``botmesh.streams.ops.tail.Follower`` calls
:meth:`Index.apply` from its thread) and answers lookups under one lock, so a chat's
timeline is a dictionary read plus the sort of that chat's own records. Every record is
decoded with the project's own decoders: the journal's changelog values with
``JournalView`` and ``decode_entry`` (the last value of a key wins, a tombstone removes
it, a group record replaces its group), receipts with
``decode_receipt``, dead letters with ``read_dead_letter``, counters with
``decode_metrics``. A record that cannot be decoded is counted (``undecodable``) and
skipped.

The journal keys are ``<scope>/in/<inbound id>``, ``<scope>/out/<idempotency key>``,
``<scope>/flow/<chat id>`` and ``<scope>/log/<chat>/<position>`` (the message log:
``botmesh.state.message_log``; the others, a chat's turn and the provider's leader lease,
are not shown); the chat of a record is read from its value (``message.chat_id``,
``payload.chat_id``, ``chat_id``).

Besides each chat's records the index keeps two small tables of the outbox records, updated
with them: the campaigns' sends (a key ``campaign:<campaign id>:<chat id>``, first parts
only, each as the few fields ``botmesh.state.campaigns.tally`` counts by: key, state,
error reason, created, updated), and the scheduled sends (pending or failed, with an
``at``): a few hundred bytes a send, so a campaign's page and the list of scheduled sends are
a pass over their own table, never over the journal.
"""

from __future__ import annotations

import collections
import dataclasses
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import msgspec

from botmesh.state.campaigns import CampaignStatus, tally
from botmesh.state.errors import InvalidKeyError
from botmesh.state.keys import CAMPAIGN_PREFIX, check_campaign
from botmesh.state.message_log import LoggedMessage
from botmesh.state.messages import OutboxState
from botmesh.streams.journal_db import JournalView, decode, decode_entry
from botmesh.streams.ops.operator import is_ambiguous_send
from botmesh.streams.ops.tail import Record
from botmesh.streams.table_kv import TABLE_NAME
from botmesh.topics.catalog import Catalog
from botmesh.topics.dead_letters import DeadLetter, read_dead_letter
from botmesh.topics.records import decode_receipt
from botmesh.topics.status_records import WorkerMetrics, decode_metrics

__all__ = [
    "CampaignView",
    "FlowView",
    "InboundView",
    "Index",
    "ReceiptSeen",
    "ScheduledView",
    "SendView",
    "Timeline",
]

Json = dict[str, Any]

#: Points of the counters' history kept (every worker's records together).
HISTORY = 5000


@dataclass(frozen=True, slots=True)
class ReceiptSeen:
    """A receipt of a send as read from ``<prefix>.sent`` (copies dropped)."""

    state: str
    message_id: str | None
    ts: float
    offset: int
    #: the delivery state it reports (receipt version 2), else ``None``
    delivery: str | None = None


@dataclass(frozen=True, slots=True)
class SendView:
    """One send (one part of a split text) as the journal holds it."""

    key: str
    part: int
    parts: int
    state: str
    attempts: int
    message_id: str | None
    text: str | None
    media: bool
    inbound_id: str | None
    created: float
    updated: float
    ambiguous: bool
    #: why it is dead (the journaled error's reason, else its dead letter's)
    dead_reason: str | None
    error: str | None
    receipts: tuple[ReceiptSeen, ...]
    dead_letter: DeadLetter | None
    #: a scheduled send's time (epoch seconds; on its first part): not sent before
    at: float | None = None
    #: when it dies ``expired`` if not delivered by then (epoch seconds)
    deadline: float | None = None
    #: how far it got, as the channel's status webhooks said (``delivered``, ``read``,
    #: ``failed``), with the channel's code on ``failed``
    delivery: str | None = None
    delivery_code: str | None = None
    #: an edit or a delete of the channel's message ``target``, not a send
    op: str | None = None
    target: str | None = None


@dataclass(frozen=True, slots=True)
class ScheduledView:
    """A send waiting for its time: pending or failed, with an ``at`` (its first part)."""

    chat_id: str
    key: str
    at: float
    deadline: float | None
    state: str
    attempts: int
    created: float


@dataclass(frozen=True, slots=True)
class CampaignView:
    """A campaign as the journal holds its sends: its counts by state
    (``botmesh.state.campaigns.tally``), and when its sends were first and last written."""

    status: CampaignStatus
    created: float
    updated: float

    @property
    def campaign(self) -> str:
        return self.status.campaign


#: The states a send waits in (for its time, its turn or a retry).
WAITING = frozenset({OutboxState.PENDING, OutboxState.FAILED})


def campaign_of(key: str) -> str | None:
    """The campaign id of a send key ``campaign:<id>:<chat id>`` (what is between
    ``campaign:`` and the next ``:``), ``None`` for any other key."""
    if not key.startswith(CAMPAIGN_PREFIX):
        return None
    campaign, sep, _ = key[len(CAMPAIGN_PREFIX) :].partition(":")
    if not sep:
        return None
    try:
        return check_campaign(campaign)
    except InvalidKeyError:
        return None


def _slim(value: Mapping[str, Any]) -> Json:
    """What a campaign's tally and order read of a send's record."""
    slim: Json = {"key": value.get("key"), "state": value.get("state")}
    reason = (value.get("error") or {}).get("reason")
    if reason is not None:
        slim["error"] = {"reason": reason}
    created = float(value.get("created", 0.0))
    slim["created"] = created
    slim["updated"] = float(value.get("updated", created))
    return slim


def _scheduled(chat: str, ident: str, value: Mapping[str, Any]) -> ScheduledView | None:
    """The send as a scheduled one, if it waits (pending or failed) with an ``at``."""
    at = value.get("at")
    if at is None or value.get("state") not in WAITING:
        return None
    deadline = value.get("deadline")
    return ScheduledView(
        chat_id=chat,
        key=str(value.get("key", ident)),
        at=float(at),
        deadline=float(deadline) if deadline is not None else None,
        state=str(value.get("state")),
        attempts=int(value.get("attempts", 0)),
        created=float(value.get("created", 0.0)),
    )


@dataclass(frozen=True, slots=True)
class InboundView:
    """One inbound message as the journal holds it, with the sends its handlers made."""

    id: str
    state: str
    attempts: int
    text: str | None
    created: float
    updated: float
    source: str | None
    error: str | None
    sends: tuple[SendView, ...]
    dead_letter: DeadLetter | None


@dataclass(frozen=True, slots=True)
class FlowView:
    """The chat's flow checkpoint."""

    flow: str
    status: str
    run: str
    steps: tuple[Mapping[str, Any], ...]
    deadline: float | None
    parked: str | None
    updated: float


@dataclass(frozen=True, slots=True)
class Timeline:
    """A chat's records in time order: each item is an :class:`InboundView` (with its
    sends), a :class:`SendView` made outside a handler (a request, a flow's timeout), the
    :class:`FlowView`, or a :class:`~botmesh.topics.dead_letters.DeadLetter` the journal no
    longer holds a record for. ``orphans``: receipts of sends the journal no longer holds."""

    chat_id: str
    items: tuple[tuple[float, InboundView | SendView | FlowView | DeadLetter], ...]
    orphans: tuple[tuple[str, ReceiptSeen], ...]
    #: The chat's message log (what was sent, one entry per part), oldest first: it may
    #: reach further back than the sends above (``message_log.retention``).
    messages: tuple[LoggedMessage, ...] = ()

    @property
    def empty(self) -> bool:
        return not self.items and not self.orphans and not self.messages


@dataclass(slots=True)
class _Chat:
    """A chat's records; the journal's as their changelog values (decoded again when the
    chat is looked up: a few hundred bytes a record, not a few kilobytes of objects)."""

    inbound: dict[str, bytes] = field(default_factory=dict)
    sends: dict[str, bytes] = field(default_factory=dict)
    flow: bytes | None = None
    #: message log entries by their key after ``<scope>/log/`` (``<chat>/<position>``)
    logged: dict[str, bytes] = field(default_factory=dict)
    receipts: dict[str, dict[tuple[str, str | None, str | None], ReceiptSeen]] = field(
        default_factory=dict
    )
    dead: dict[tuple[str, int, int], DeadLetter] = field(default_factory=dict)


def _chat_of(kind: str, value: Mapping[str, Any]) -> str | None:
    if kind == "in":
        found = (value.get("message") or {}).get("chat_id")
    elif kind == "out":
        found = (value.get("payload") or {}).get("chat_id")
    else:
        found = value.get("chat_id")
    return str(found) if found not in (None, "") else None


def _error_text(value: Mapping[str, Any]) -> str | None:
    error = value.get("error")
    if not isinstance(error, Mapping):
        return None
    return " ".join(str(x) for x in (error.get("type"), error.get("message")) if x) or None


class Index:
    """The console's index of one prefix's topics (see the module docstring)."""

    def __init__(self, cat: Catalog) -> None:
        self.cat = cat
        self.changelog = cat.changelog(TABLE_NAME)
        self.dlq_kinds = {
            cat.inbound_dlq: "inbound",
            cat.outbox_dlq: "outbox",
            cat.requests_dlq: "requests",
        }
        self._lock = threading.Lock()
        self._chats: dict[str, _Chat] = {}
        #: journal key -> (chat, kind, id): where a tombstone removes from
        self._where: dict[str, tuple[str, str, str]] = {}
        #: The journal's groups (``JournalView``): a group record changes several keys.
        self._view = JournalView(keep=False)
        self._ambiguous: set[str] = set()
        #: campaign id -> journal key -> its first part's record, slimmed (``_slim``)
        self._campaigns: dict[str, dict[str, Json]] = {}
        #: journal key -> the send waiting for its time
        self._scheduled: dict[str, ScheduledView] = {}
        self._letters: dict[tuple[str, int, int], DeadLetter] = {}
        self._workers: dict[str, WorkerMetrics] = {}
        self._history: collections.deque[WorkerMetrics] = collections.deque(maxlen=HISTORY)
        #: records read per topic, and those that could not be decoded
        self.read: collections.Counter[str] = collections.Counter()
        self.undecodable: collections.Counter[str] = collections.Counter()

    @property
    def topics(self) -> list[str]:
        """The topics the index is built from, in the order it reads them."""
        return [self.changelog, self.cat.sent, *self.dlq_kinds, self.cat.metrics]

    # -- feeding it ------------------------------------------------------------------------

    def apply(self, records: Iterable[Record]) -> None:
        with self._lock:
            for r in records:
                self.read[r.topic] += 1
                try:
                    if r.topic == self.changelog:
                        self._journal(r)
                    elif r.topic == self.cat.sent:
                        self._receipt(r)
                    elif r.topic in self.dlq_kinds:
                        self._dead_letter(r)
                    elif r.topic == self.cat.metrics:
                        self._metrics(r)
                except Exception:  # a record of another shape: counted, never fatal
                    self.undecodable[r.topic] += 1

    def _chat(self, chat: str) -> _Chat:
        found = self._chats.get(chat)
        if found is None:
            found = self._chats[chat] = _Chat()
        return found

    def _journal(self, r: Record) -> None:
        if r.key is None:
            return
        for key, raw in self._view.apply(r.key, r.value):
            self._record(r.topic, key, raw)

    def _record(self, topic: str, key: str, raw: bytes | None) -> None:
        if raw is None:
            self._forget(key)
            return
        entry = decode(key, raw)
        parts = key.split("/", 2)
        if len(parts) != 3 or parts[1] not in ("in", "out", "flow", "log"):
            return
        kind, ident = parts[1], parts[2]
        chat = _chat_of(kind, entry.value)
        if chat is None:
            self.undecodable[topic] += 1
            return
        where = self._where.get(key)
        if where is not None and where[0] != chat:
            self._forget(key)
        self._where[key] = (chat, kind, ident)
        records = self._chat(chat)
        if kind == "in":
            records.inbound[ident] = raw
        elif kind == "out":
            records.sends[ident] = raw
            self._outbox(key, ident, chat, entry.value)
        elif kind == "log":
            records.logged[ident] = raw
        else:
            records.flow = raw

    def _outbox(self, key: str, ident: str, chat: str, value: Mapping[str, Any]) -> None:
        """The send's place in the ambiguous sends, the campaigns and the scheduled sends."""
        if is_ambiguous_send(key, value):
            self._ambiguous.add(key)
        else:
            self._ambiguous.discard(key)
        campaign = campaign_of(ident)
        if campaign is not None and value.get("part", 1) == 1:
            self._campaigns.setdefault(campaign, {})[key] = _slim(value)
        scheduled = _scheduled(chat, ident, value)
        if scheduled is not None:
            self._scheduled[key] = scheduled
        else:
            self._scheduled.pop(key, None)

    def _forget(self, key: str) -> None:
        where = self._where.pop(key, None)
        self._ambiguous.discard(key)
        self._scheduled.pop(key, None)
        if where is None:
            return
        chat, kind, ident = where
        campaign = campaign_of(ident) if kind == "out" else None
        if campaign is not None and campaign in self._campaigns:
            sends = self._campaigns[campaign]
            sends.pop(key, None)
            if not sends:
                del self._campaigns[campaign]
        records = self._chats.get(chat)
        if records is None:
            return
        if kind == "in":
            records.inbound.pop(ident, None)
        elif kind == "out":
            records.sends.pop(ident, None)
        elif kind == "log":
            records.logged.pop(ident, None)
        else:
            records.flow = None

    def _receipt(self, r: Record) -> None:
        receipt = decode_receipt(r.value)
        delivery = None if receipt.delivery is None else str(receipt.delivery)
        seen = ReceiptSeen(
            str(receipt.state), receipt.message_id, receipt.ts, r.offset, delivery=delivery
        )
        by_key = self._chat(receipt.chat_id).receipts.setdefault(receipt.key, {})
        by_key.setdefault((seen.state, seen.message_id, delivery), seen)

    def _dead_letter(self, r: Record) -> None:
        letter = read_dead_letter(
            r.topic, r.partition, r.offset, int(r.timestamp * 1000), r.key, r.value, r.headers
        )
        where = (r.topic, r.partition, r.offset)
        self._letters[where] = letter
        if letter.chat_id:
            self._chat(letter.chat_id).dead[where] = letter

    def _metrics(self, r: Record) -> None:
        instance = (r.key or b"").decode(errors="replace")
        found = decode_metrics(r.key or b"", r.value)
        if found is None:
            self._workers.pop(instance, None)
            return
        self._workers[instance] = found
        self._history.append(found)

    # -- reading it ------------------------------------------------------------------------

    @property
    def chats(self) -> int:
        with self._lock:
            return len(self._chats)

    def ambiguous(self) -> int:
        with self._lock:
            return len(self._ambiguous)

    def campaigns(self) -> list[CampaignView]:
        """Every campaign the journal holds a send of, its counts by state, the one whose
        sends were written last first."""
        with self._lock:
            held = {c: list(sends.values()) for c, sends in self._campaigns.items()}
        found = [
            CampaignView(
                status=tally(campaign, values),
                created=min(v["created"] for v in values),
                updated=max(max(v["created"], v["updated"]) for v in values),
            )
            for campaign, values in held.items()
            if values
        ]
        found.sort(key=lambda c: (-c.updated, c.campaign))
        return found

    def scheduled(self, now: float, limit: int) -> tuple[list[ScheduledView], int, int]:
        """The sends waiting for a time after ``now``, soonest first: the first ``limit``
        of them, how many there are in all, and how many more wait with their time passed
        (due: going out at the channel's pace, or waiting a retry)."""
        with self._lock:
            waiting = list(self._scheduled.values())
        ahead = [s for s in waiting if s.at > now]
        ahead.sort(key=lambda s: (s.at, s.chat_id, s.key))
        return ahead[:limit], len(ahead), len(waiting) - len(ahead)

    def workers(self) -> dict[str, WorkerMetrics]:
        """The last counters (and readiness) each worker published, by instance id."""
        with self._lock:
            return dict(self._workers)

    def history(self) -> list[WorkerMetrics]:
        """Every record of the counters read (up to ``HISTORY``), oldest first."""
        with self._lock:
            return list(self._history)

    def dead_letters(self) -> list[DeadLetter]:
        """Every dead letter read, in topic, partition and offset order."""
        with self._lock:
            letters = list(self._letters.values())
        order = list(self.dlq_kinds)
        letters.sort(key=lambda d: (order.index(d.topic), d.partition, d.offset))
        return letters

    def dead_counts(self) -> dict[tuple[str, str], int]:
        """Dead letters by (kind, reason)."""
        counts: collections.Counter[tuple[str, str]] = collections.Counter()
        for d in self.dead_letters():
            counts[(self.dlq_kinds[d.topic], d.reason or "-")] += 1
        return dict(sorted(counts.items()))

    def timeline(self, chat_id: str) -> Timeline:
        """The chat's records in time order (see :class:`Timeline`)."""
        with self._lock:
            records = self._chats.get(chat_id)
            if records is None:
                return Timeline(chat_id, (), ())
            inbound = _values(records.inbound)
            sends = _values(records.sends)
            flow = _value(records.flow) if records.flow is not None else None
            receipts = {k: tuple(v.values()) for k, v in records.receipts.items()}
            dead = list(records.dead.values())
            logged = [records.logged[k] for k in sorted(records.logged)]
        found = _timeline(
            chat_id, inbound=inbound, sends=sends, flow=flow, receipts=receipts, dead=dead
        )
        messages = tuple(m for raw in logged if (m := _logged(raw)) is not None)
        return dataclasses.replace(found, messages=messages)


def _value(raw: bytes) -> Json:
    entry = decode_entry(b"", raw)
    assert entry is not None
    return entry.value


def _logged(raw: bytes) -> LoggedMessage | None:
    """A message log entry; ``None`` for one of another shape (another version's)."""
    try:
        return msgspec.convert(_value(raw), LoggedMessage)
    except msgspec.ValidationError:
        return None


def _values(raws: Mapping[str, bytes]) -> dict[str, Json]:
    return {k: _value(v) for k, v in raws.items()}


def _send_view(
    key: str,
    value: Mapping[str, Any],
    receipts: Mapping[str, tuple[ReceiptSeen, ...]],
    letter: DeadLetter | None,
) -> SendView:
    payload = value.get("payload") or {}
    error = value.get("error") or {}
    state = str(value.get("state", ""))
    reason = error.get("reason") if state == "dead" else None
    at, deadline = value.get("at"), value.get("deadline")
    delivery = value.get("delivery") or {}
    return SendView(
        key=key,
        part=int(value.get("part", 1)),
        parts=int(value.get("parts", 1)),
        state=state,
        attempts=int(value.get("attempts", 0)),
        message_id=value.get("message_id"),
        text=payload.get("text"),
        media=payload.get("media") is not None,
        inbound_id=value.get("inbound_id"),
        created=float(value.get("created", 0.0)),
        updated=float(value.get("updated", 0.0)),
        ambiguous=bool(value.get("ambiguous")),
        dead_reason=reason or (letter.reason if letter is not None else None),
        error=_error_text(value),
        receipts=tuple(sorted(receipts.get(key, ()), key=lambda s: s.offset)),
        dead_letter=letter,
        at=float(at) if at is not None else None,
        deadline=float(deadline) if deadline is not None else None,
        delivery=delivery.get("state"),
        delivery_code=delivery.get("code"),
        op=value.get("op"),
        target=value.get("target"),
    )


def _timeline(
    chat_id: str,
    *,
    inbound: Mapping[str, Json],
    sends: Mapping[str, Json],
    flow: Json | None,
    receipts: Mapping[str, tuple[ReceiptSeen, ...]],
    dead: list[DeadLetter],
) -> Timeline:
    dead_sends = {d.send_key: d for d in dead if d.send_key}
    dead_inbound = {d.inbound_id: d for d in dead if not d.send_key and d.inbound_id}
    views = [_send_view(k, v, receipts, dead_sends.get(k)) for k, v in sends.items()]
    by_inbound: dict[str, list[SendView]] = collections.defaultdict(list)
    items: list[tuple[float, InboundView | SendView | FlowView | DeadLetter]] = []
    for view in views:
        if view.inbound_id is not None and view.inbound_id in inbound:
            by_inbound[view.inbound_id].append(view)
        else:
            items.append((view.created, view))
    for ident, value in inbound.items():
        message = value.get("message") or {}
        created = float(value.get("created", message.get("ts") or 0.0))
        mine = sorted(by_inbound.get(ident, ()), key=lambda s: (s.created, s.key))
        seen = InboundView(
            id=ident,
            state=str(value.get("state", "")),
            attempts=int(value.get("attempts", 0)),
            text=message.get("text"),
            created=created,
            updated=float(value.get("updated", created)),
            source=value.get("source"),
            error=_error_text(value),
            sends=tuple(mine),
            dead_letter=dead_inbound.get(ident),
        )
        items.append((created, seen))
    if flow is not None:
        flow_view = FlowView(
            flow=str(flow.get("flow", "")),
            status=str(flow.get("status", "")),
            run=str(flow.get("run", "")),
            steps=tuple(s for s in flow.get("steps", ()) if isinstance(s, Mapping)),
            deadline=flow.get("deadline"),
            parked=flow.get("parked"),
            updated=float(flow.get("updated", 0.0)),
        )
        items.append((flow_view.updated, flow_view))
    for d in dead:  # dead letters of records the journal does not hold (any more)
        if (d.send_key and d.send_key in sends) or (
            not d.send_key and d.inbound_id and d.inbound_id in inbound
        ):
            continue
        items.append((d.dead_ts, d))
    orphans = [(k, r) for k, rs in receipts.items() if k not in sends for r in rs]
    items.sort(key=lambda pair: pair[0])
    return Timeline(chat_id, tuple(items), tuple(sorted(orphans, key=lambda o: o[1].ts)))
