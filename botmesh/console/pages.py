"""The console's pages, as HTML strings from the data the server gathered (no I/O here):
the overview, a chat's timeline, the campaigns and the scheduled sends, the dead letters
and an action on them, a replay's plan, the login and the refusals. Every dynamic value
goes through ``render.e``."""

from __future__ import annotations

import json
import shlex
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from botmesh.console.index import (
    CampaignView,
    FlowView,
    InboundView,
    ScheduledView,
    SendView,
    Timeline,
)
from botmesh.console.render import (
    DEFAULT_SERIES,
    Row,
    chart,
    conceal,
    e,
    form,
    hidden,
    link,
    page,
    table,
    text_of,
    when,
)
from botmesh.state.errors import Reason
from botmesh.state.message_log import LoggedMessage
from botmesh.state.messages import OutboxState
from botmesh.streams.config import group_instance_id
from botmesh.streams.ops.dlq import COMMANDS, command_kind
from botmesh.streams.ops.operator import ReplayResult, Status
from botmesh.streams.ops.tail import TopicProgress
from botmesh.topics.dead_letters import DeadLetter
from botmesh.topics.status_records import WorkerMetrics

__all__ = ["View"]

#: The commands each dead-letter kind takes.
KIND_COMMANDS: dict[str, tuple[str, ...]] = {
    "outbox": ("retry", "discard"),
    "inbound": ("replay",),
    "requests": (),
}


@dataclass(frozen=True, slots=True)
class View:
    """What every page shows around its body: who, whether actions are on, the index."""

    prefix: str
    who: str | None
    csrf: str | None
    read_only: str | None  # why actions are off, or None
    show_texts: bool
    progress: Sequence[TopicProgress] = ()
    names: Mapping[str, str] = field(default_factory=dict)  # topic -> what it is, for people
    follower_error: str | None = None
    chats: int = 0

    @property
    def can_act(self) -> bool:
        return self.read_only is None and self.who is not None


def frame(view: View, title: str, body: str) -> str:
    """``body`` in the page: the header, the read-only banner, the index's progress."""
    nav = (
        f"<strong>botmesh console</strong><span>prefix <code>{e(view.prefix)}</code></span>"
        '<nav><a href="/" data-testid="nav-overview">Overview</a>'
        '<a href="/timeline" data-testid="nav-timeline">Timeline</a>'
        '<a href="/campaigns" data-testid="nav-campaigns">Campaigns</a>'
        '<a href="/dead-letters" data-testid="nav-dead-letters">Dead letters</a>'
        '<a href="/replay" data-testid="nav-replay">Replay</a></nav>'
    )
    if view.who is not None:
        nav += f'<span data-testid="whoami">signed in as {e(view.who)}</span>' + form(
            "/logout",
            '<button type="submit" data-testid="logout">sign out</button>',
            csrf=view.csrf,
        )
    elif view.read_only is None:
        nav += '<a href="/login" data-testid="nav-login">sign in</a>'
    banner = ""
    if view.read_only is not None:
        banner = (
            f'<p class="banner" data-testid="readonly-banner">read-only: {e(view.read_only)}</p>'
        )
    return page(title, body, nav=nav, banner=banner, progress=_progress(view))


def _progress(view: View) -> str:
    parts = []
    for p in view.progress:
        name = view.names.get(p.topic, p.topic)
        if not p.exists:
            parts.append(f"{e(name)}: not there yet")
            continue
        end = " (at its end)" if p.at_end else ""
        parts.append(f"{e(name)}: {p.read:,} of {p.span:,} offsets{end}")
    error = (
        f' <span class="error">Kafka: {e(view.follower_error)}</span>'
        if view.follower_error
        else ""
    )
    return (
        f'<p class="progress" data-testid="index-progress">index ({view.chats:,} chats): '
        f"{'; '.join(parts)}{error}</p>"
    )


def message(view: View, title: str, text: str, *, testid: str, kind: str = "error") -> str:
    """A page that says one thing (a refusal, an error) and what to do."""
    return frame(view, title, f'<p class="{kind}" data-testid="{e(testid)}">{e(text)}</p>')


# -- the overview ----------------------------------------------------------------------------


def _role(topic: str, prefix: str) -> str:
    return topic[len(prefix) + 1 :] if topic.startswith(prefix + ".") else topic


def _worker_status(m: WorkerMetrics | None) -> tuple[str, str]:
    if m is None:
        return "unknown", "no counters published yet"
    if m.ready is None:
        return "unknown", "its counters say nothing of readiness (an older worker)"
    if m.ready:
        return "ready", m.why
    if m.restoring:
        return "restoring", f"restoring {m.restoring} journal partitions: {m.why}"
    return "not ready", m.why


def overview(
    view: View,
    status: Status | None,
    error: str | None,
    *,
    inbound: str,
    workers: Mapping[str, WorkerMetrics],
    dead: Mapping[tuple[str, str], int],
    ambiguous: int,
    history: Sequence[WorkerMetrics],
    counters: Sequence[str],
    scheduled: int = 0,
    running: int = 0,
) -> str:
    body = []
    if error is not None:
        body.append(f'<p class="error" data-testid="error">{e(error)}</p>')
    if status is not None:
        body.append(_group(view, status, inbound, workers))
    body.append("<h2>Dead letters by kind and reason</h2>")
    body.append(_dead_counts(dead))
    if status is not None:
        body.append(_dead_topics(status))
    body.append(
        "<h2>Ambiguous sends</h2><p>sends a crash left in flight and "
        '<code>on_ambiguous="skip"</code> gave up (state <code>unknown</code>), in the journal '
        f'as indexed: <strong data-testid="ambiguous-count">{ambiguous:,}</strong></p>'
    )
    body.append(
        '<h2>Campaigns and scheduled sends</h2><p><strong data-testid="overview-scheduled">'
        f"{scheduled:,}</strong> send(s) scheduled for later, "
        f'<strong data-testid="overview-campaigns">{running:,}</strong> campaign(s) in '
        'progress: <a href="/campaigns">campaigns and scheduled sends</a></p>'
    )
    if status is not None:
        body.append("<h2>Sends parked on the retry tiers</h2>")
        body.append(_parked(status))
    body.append(_counters(history, workers, counters))
    return frame(view, "Overview", "".join(body))


def _dead_counts(dead: Mapping[tuple[str, str], int]) -> str:
    """The table of dead letters counted by kind and reason."""
    return table(
        ["kind", "reason", "dead letters"],
        (
            (
                [e(kind), e(reason), (f"{n:,}", {"class": "n"})],
                {"data-testid": "dead-count", "data-kind": kind, "data-reason": reason},
            )
            for (kind, reason), n in dead.items()
        ),
        testid="dead-counts",
    )


def _dead_topics(status: Status) -> str:
    """The table of records held on each dead-letter topic."""
    return table(
        ["topic", "records (end minus start)"],
        (
            ([e(d.topic), ("missing" if d.records is None else f"{d.records:,}", {})], {})
            for d in status.dead_letters
        ),
    )


def _parked(status: Status) -> str:
    """The table of sends parked on each retry tier."""
    return table(
        ["tier", "topic", "parked"],
        (
            (
                [
                    e(t.tier),
                    e(t.topic),
                    ("missing" if t.parked is None else f"{t.parked:,}", {"class": "n"}),
                ],
                {"data-testid": "parked-count", "data-tier": t.tier},
            )
            for t in status.parked
        ),
    )


def _group(view: View, status: Status, inbound: str, workers: Mapping[str, WorkerMetrics]) -> str:
    g = status.group
    return (
        f"<h2>Workers</h2><p>group <code>{e(g.group)}</code>: "
        f'<span data-testid="group-state">{e(g.state)}</span>, {len(g.members)} member(s); '
        "ready or not as each worker last published it on the metrics topic</p>"
        + table(
            ["instance id", f"partitions of {inbound}", "status", "published", "client"],
            _worker_rows(status, inbound, workers),
            testid="workers",
            empty="no worker in the group",
        )
        + f'<h2>Lag per partition</h2><p>total <strong data-testid="total-lag">'
        f"{status.total_lag:,}</strong> (end offset minus the group's committed offset)</p>"
        + table(
            ["topic", "partition", "committed", "end", "lag", "owner"],
            _lag_rows(view, status),
            testid="lags",
        )
    )


def _worker_rows(status: Status, inbound: str, workers: Mapping[str, WorkerMetrics]) -> list[Row]:
    """A row per member of the group, with its status as the worker last published it."""
    by_id = {group_instance_id(k): m for k, m in workers.items()}
    rows: list[Row] = []
    for m in status.group.members:
        who = m.instance_id or m.member_id
        published = by_id.get(m.instance_id or "")
        state, why = _worker_status(published)
        mine = ", ".join(str(p) for p in m.partitions.get(inbound, ()))
        every = "; ".join(f"{t} {','.join(map(str, ps))}" for t, ps in m.partitions.items())
        rows.append(
            (
                [
                    (e(who), {"data-testid": "worker-instance"}),
                    (e(mine) or "none", {"data-testid": "worker-partitions", "title": every}),
                    (
                        f'<span class="state-{e(state.replace(" ", "-"))}">{e(state)}</span> '
                        f"{e(why)}",
                        {"data-testid": "worker-status", "data-status": state},
                    ),
                    e(when(published.ts) if published else "-"),
                    e(f"{m.client_id} on {m.host.lstrip('/')}"),
                ],
                {"data-testid": "worker-row", "data-instance": who},
            )
        )
    return rows


def _lag_rows(view: View, status: Status) -> list[Row]:
    """A row per partition the group reads, with its committed offset, end and lag."""
    return [
        (
            [
                e(_role(x.topic, view.prefix)),
                (str(x.partition), {"class": "n"}),
                ("-" if x.committed is None else str(x.committed), {"class": "n"}),
                (str(x.end), {"class": "n"}),
                (
                    str(x.lag),
                    {
                        "class": "n",
                        "data-testid": "lag-cell",
                        "data-topic": _role(x.topic, view.prefix),
                        "data-partition": x.partition,
                    },
                ),
                e(x.owner or "-"),
            ],
            {},
        )
        for x in status.lags
    ]


def counter_series(
    history: Sequence[WorkerMetrics], names: Sequence[str]
) -> dict[str, list[tuple[float, int]]]:
    """Each counter of ``names`` summed over the workers at each record's time (each
    worker's last record counts until its next)."""
    latest: dict[str, Mapping[str, int]] = {}
    out: dict[str, list[tuple[float, int]]] = {n: [] for n in names}
    for m in sorted(history, key=lambda m: m.ts):
        latest[m.instance] = m.counters
        for n in names:
            out[n].append((m.ts, sum(c.get(n, 0) for c in latest.values())))
    return out


def _counters(
    history: Sequence[WorkerMetrics], workers: Mapping[str, WorkerMetrics], chosen: Sequence[str]
) -> str:
    known = list(dict.fromkeys(n for m in history for n in m.counters)) or list(DEFAULT_SERIES)
    names = [n for n in chosen if n in known] or [n for n in DEFAULT_SERIES if n in known]
    boxes = "".join(
        f'<label><input type="checkbox" name="counter" value="{e(n)}"'
        f"{' checked' if n in names else ''}> {e(n)}</label> "
        for n in known
    )
    picker = form(
        "/",
        f'{boxes}<button type="submit">show</button>',
        method="get",
        testid="counters-form",
    )
    total: dict[str, int] = {}
    for m in workers.values():
        for n, v in m.counters.items():
            total[n] = total.get(n, 0) + v
    rows = (
        (
            [
                e(n),
                *((str(w.counters.get(n, 0)), {"class": "n"}) for w in workers.values()),
                (str(v), {"class": "n"}),
            ],
            {"data-testid": "counter-row", "data-counter": n},
        )
        for n, v in total.items()
    )
    return (
        "<h2>The engine's counters over time</h2><p>summed over the workers, from the "
        "metrics topic (each worker counts from its start)</p>"
        + chart(counter_series(history, names))
        + picker
        + table(["counter", *workers, "sum"], rows, testid="counters", empty="none yet")
    )


# -- a chat's timeline ----------------------------------------------------------------------


def timeline(view: View, chat_id: str | None, found: Timeline | None) -> str:
    ask = form(
        "/timeline",
        f'<label>chat id <input name="chat_id" data-testid="timeline-chat" '
        f'value="{e(chat_id or "")}" required></label>'
        '<button type="submit" data-testid="timeline-submit">show</button>',
        method="get",
        testid="timeline-form",
    )
    if chat_id is None or found is None:
        return frame(view, "A chat's timeline", ask)
    if found.empty:
        body = (
            f'<p class="hidden" data-testid="timeline-empty">nothing indexed for chat '
            f"<code>{e(chat_id)}</code> (yet: see how far the index has read above)</p>"
        )
    else:
        entries = [_item(view, item) for _, item in found.items]
        entries += [
            f'<div class="entry" data-testid="timeline-entry" data-kind="receipt" '
            f'data-key="{e(k)}" data-state="{e(r.state)}">receipt of <code>{e(k)}</code> '
            f"(the journal holds the send no more): {_receipt(r)}</div>"
            for k, r in found.orphans
        ]
        body = "".join(entries) + _message_log(view, found.messages)
    return frame(
        view,
        f"Chat {chat_id}",
        ask + f'<div data-testid="timeline" data-chat="{e(chat_id)}">{body}</div>',
    )


def _message_log(view: View, messages: Sequence[LoggedMessage]) -> str:
    """The chat's message log (``botmesh.state.message_log``), newest first."""
    if not messages:
        return ""
    rows: list[Row] = []
    for m in reversed(messages):
        media = f" + {m.media.kind} {m.media.name or m.media.mime or ''}" if m.media else ""
        part = f" part {m.part}/{m.parts}" if m.parts > 1 else ""
        cells = [
            e(when(m.sent_at)),
            f"<code>{e(m.key)}</code>{e(part)}",
            e(m.channel or "-"),
            f'<code data-testid="logged-message-id">{e(m.message_id or "-")}</code>',
            text_of(m.text, view.show_texts) + e(media),
        ]
        rows.append((cells, {"data-testid": "logged-message", "data-key": m.key}))
    return (
        f'<h2>Message log</h2><p class="hidden">{len(messages)} message(s) sent, one per '
        "part the channel accepted</p>"
        + table(("sent", "key", "channel", "message id", "text"), rows, testid="message-log")
    )


def _item(view: View, item: InboundView | SendView | FlowView | DeadLetter) -> str:
    if isinstance(item, InboundView):
        return _inbound(view, item)
    if isinstance(item, SendView):
        return _send(view, item)
    if isinstance(item, FlowView):
        return _flow(view, item)
    return (
        f'<div class="entry" data-testid="timeline-entry" data-kind="dead-letter" '
        f'data-state="dead" data-key="{e(item.send_key or item.inbound_id or "")}">'
        f"{e(when(item.dead_ts))} dead letter on <code>{e(item.topic)}:{item.partition}:"
        f"{item.offset}</code> (the journal holds its record no more): reason "
        f'<span data-testid="dead-reason">{e(item.reason)}</span></div>'
    )


def _state(state: str, testid: str) -> str:
    return f'<strong class="state-{e(state)}" data-testid="{e(testid)}">{e(state)}</strong>'


def _inbound(view: View, m: InboundView) -> str:
    sends = "".join(_send(view, s) for s in m.sends) or ('<p class="hidden">no send</p>')
    extra = f" error: {e(m.error)}" if m.error else ""
    dead = (
        f' dead letter: <span data-testid="dead-reason">{e(m.dead_letter.reason)}</span>'
        if m.dead_letter is not None
        else ""
    )
    return (
        f'<div class="entry" data-testid="timeline-entry" data-kind="inbound" '
        f'data-id="{e(m.id)}" data-state="{e(m.state)}">'
        f"{e(when(m.created))} <strong>inbound</strong> <code>{e(m.id)}</code> "
        f"{_state(m.state, 'inbound-state')}, {m.attempts} attempt(s), read at "
        f"<code>{e(m.source or '-')}</code>: {text_of(m.text, view.show_texts)}{extra}{dead}"
        f'<div class="sends">{sends}</div></div>'
    )


def _receipt(r: Any) -> str:
    delivery = getattr(r, "delivery", None)
    what = f"{r.state}, {delivery}" if delivery else str(r.state)
    return (
        f'<span data-testid="send-receipt" data-state="{e(r.state)}" '
        f'data-delivery="{e(delivery or "")}">{e(what)} '
        f"{e(r.message_id or '')} at {e(when(r.ts))}</span>"
    )


def _send(view: View, s: SendView) -> str:
    receipts = ", ".join(_receipt(r) for r in s.receipts) or '<span class="hidden">none</span>'
    part = f" part {s.part}/{s.parts}" if s.parts > 1 else ""
    error = f" last error: {e(s.error)}" if s.error else ""
    ambiguous = " (ambiguous)" if s.ambiguous else ""
    media = " + media" if s.media else ""
    return (
        f'<div class="entry" data-testid="timeline-entry" data-kind="send" '
        f'data-key="{e(s.key)}" data-state="{e(s.state)}">'
        f"{e(when(s.created))} <strong>{e(_what(s))}</strong> "
        f'<code data-testid="send-key">{e(s.key)}</code>{e(part)} '
        f"{_state(s.state, 'send-state')}{e(ambiguous)}, "
        f'<span data-testid="send-attempts">{s.attempts}</span> attempt(s), provider id '
        f'<code data-testid="send-message-id">{e(s.message_id or "-")}</code>: '
        f"{text_of(s.text, view.show_texts)}{e(media)}{_send_outcome(s)}{error}"
        f"{_delivery(s)}"
        f"{_send_times(s)}<div>receipts: {receipts}</div></div>"
    )


def _what(s: SendView) -> str:
    """A send, or an edit or a delete of a message (``botmesh.state.edits``)."""
    if s.op is not None:
        return f"{s.op} of {s.target}"
    return "send"


def _delivery(s: SendView) -> str:
    """How far a sent message got, as the channel's status webhooks said."""
    if s.delivery is None:
        return ""
    code = f" (channel code {s.delivery_code})" if s.delivery_code else ""
    return (
        f'<div>delivery: <span data-testid="send-delivery" data-delivery="{e(s.delivery)}">'
        f"{e(s.delivery)}</span>{e(code)}</div>"
    )


def _send_times(s: SendView) -> str:
    """When a scheduled send goes out, and the deadline it must be delivered by."""
    times = []
    if s.at is not None:
        times.append(
            f'scheduled for <span data-testid="send-at" data-at="{s.at}">{e(when(s.at))}'
            "</span> UTC (not before)"
        )
    if s.deadline is not None:
        times.append(
            f'deadline <span data-testid="send-deadline" data-deadline="{s.deadline}">'
            f"{e(when(s.deadline))}</span> UTC (not delivered by then: dead, expired)"
        )
    return f"<div>{'; '.join(times)}</div>" if times else ""


def _send_outcome(s: SendView) -> str:
    """Why a send is dead (an expired one: its deadline passed first), or that it was
    cancelled before it went out."""
    if s.dead_reason == Reason.EXPIRED:
        return (
            ' dead reason: <span data-testid="send-dead-reason">expired</span> (not '
            "delivered by its deadline: never sent)"
        )
    if s.dead_reason:
        return f' dead reason: <span data-testid="send-dead-reason">{e(s.dead_reason)}</span>'
    if s.state == OutboxState.CANCELLED:
        return " (cancelled before it went out: never sent)"
    return ""


def _flow(view: View, f: FlowView) -> str:
    steps = "".join(
        f"<li>{e(s.get('kind', '?'))}: {text_of(s.get('text'), view.show_texts)}</li>"
        for s in f.steps
    )
    parked = f" parked: {e(f.parked)}" if f.parked else ""
    deadline = f", answer due by {e(when(f.deadline))}" if f.deadline else ""
    return (
        f'<div class="entry" data-testid="timeline-entry" data-kind="flow" '
        f'data-state="{e(f.status)}"><span data-testid="flow-checkpoint">{e(when(f.updated))} '
        f"<strong>flow checkpoint</strong> <code>{e(f.flow)}</code> run <code>{e(f.run)}</code>"
        f" {_state(f.status, 'flow-status')}, {len(f.steps)} step(s){deadline}{parked}</span>"
        f"<ol>{steps}</ol></div>"
    )


# -- campaigns and scheduled sends -----------------------------------------------------------

#: A campaign's counts, in the order of the columns (the states of ``CampaignStatus``).
CAMPAIGN_COUNTS = ("pending", "sent", "dead", "expired", "unknown", "cancelled")


def campaigns(
    view: View,
    found: Sequence[CampaignView],
    scheduled: Sequence[ScheduledView],
    *,
    waiting: int,
    due: int,
    now: float,
) -> str:
    """The campaigns (newest first) with their counts by state and progress, then the
    sends scheduled for later (soonest first, ``scheduled`` the first of ``waiting``)."""
    head = (
        "<p>Each campaign (<code>botmesh broadcast</code>, <code>app.broadcast</code>) as the "
        "journal holds its sends, one per recipient (keyed <code>campaign:&lt;id&gt;:&lt;chat"
        "&gt;</code>, a split text counted once): <em>pending</em> has not gone out yet "
        "(scheduled, waiting its turn or a retry), <em>expired</em> died when its deadline "
        "passed, <em>cancelled</em> was cancelled before it went out. The campaign whose "
        "sends were written last comes first.</p>"
    )
    rows = [_campaign_row(c) for c in found]
    return frame(
        view,
        "Campaigns and scheduled sends",
        head
        + table(
            ["campaign", *CAMPAIGN_COUNTS, "total", "progress", "first written", "last written"],
            rows,
            testid="campaigns",
            empty="no campaign in the journal",
        )
        + _scheduled(scheduled, waiting=waiting, due=due, now=now),
    )


def _campaign_row(c: CampaignView) -> Row:
    """A campaign's counts by state, and its progress: settled of total, as a bar."""
    status = c.status
    total = status.total
    counts = [
        (f"{getattr(status, name):,}", {"class": "n", "data-testid": f"campaign-{name}"})
        for name in CAMPAIGN_COUNTS
    ]
    percent = status.settled * 100 // total if total else 0
    bar = "".join(
        f'<span class="bar-{name}" style="width:{getattr(status, name) * 100 / total:.3f}%" '
        f'title="{name} {getattr(status, name)}"></span>'
        for name in CAMPAIGN_COUNTS[1:]
        if total and getattr(status, name)
    )
    progress = (
        f'<span class="bar" data-testid="campaign-bar">{bar}</span> '
        f"{status.settled:,} of {total:,} settled ({percent}%)"
    )
    return (
        [
            (f"<code>{e(c.campaign)}</code>", {"data-testid": "campaign-id"}),
            *counts,
            (f"{total:,}", {"class": "n", "data-testid": "campaign-total"}),
            (
                progress,
                {
                    "class": "meter",
                    "data-testid": "campaign-progress",
                    "data-settled": status.settled,
                    "data-total": total,
                    "data-percent": percent,
                },
            ),
            e(when(c.created)),
            e(when(c.updated)),
        ],
        {"data-testid": "campaign-row", "data-campaign": c.campaign},
    )


def _ahead(seconds: float) -> str:
    """``in 1h 02m``, ``in 3m 05s``, ``in 12s``."""
    s = max(0, int(seconds))
    if s >= 86400:
        return f"in {s // 86400}d {s % 86400 // 3600}h"
    if s >= 3600:
        return f"in {s // 3600}h {s % 3600 // 60:02d}m"
    if s >= 60:
        return f"in {s // 60}m {s % 60:02d}s"
    return f"in {s}s"


def _scheduled(scheduled: Sequence[ScheduledView], *, waiting: int, due: int, now: float) -> str:
    """The sends waiting for a later time, soonest first, each with its chat's timeline."""
    more = waiting - len(scheduled)
    summary = (
        f'<p data-testid="scheduled-summary"><strong data-testid="scheduled-count">'
        f"{waiting:,}</strong> send(s) wait for a later time (pending or failed, with a "
        "scheduled time ahead: <code>--at</code>, <code>--delay</code>, <code>at=</code>)"
    )
    if more > 0:
        summary += (
            f'; the {len(scheduled):,} soonest listed, <span data-testid="scheduled-more">'
            f"{more:,}</span> more not listed"
        )
    summary += (
        f'. <span data-testid="scheduled-due">{due:,}</span> more have their time passed and '
        "go out at the channel's pace (or wait for a retry).</p>"
    )
    rows: list[Row] = []
    for s in scheduled:
        chat = link("/timeline", {"chat_id": s.chat_id})
        deadline = when(s.deadline) if s.deadline is not None else "-"
        rows.append(
            (
                [
                    (e(when(s.at)), {"data-testid": "scheduled-at", "data-at": s.at}),
                    e(_ahead(s.at - now)),
                    (e(deadline), {"data-testid": "scheduled-deadline"}),
                    f'<a href="{e(chat)}" data-testid="scheduled-chat">{e(s.chat_id)}</a>',
                    (f"<code>{e(s.key)}</code>", {"data-testid": "scheduled-key"}),
                    _state(s.state, "scheduled-state"),
                    (str(s.attempts), {"class": "n"}),
                ],
                {"data-testid": "scheduled-row", "data-key": s.key, "data-chat": s.chat_id},
            )
        )
    return (
        "<h2>Scheduled sends</h2>"
        + summary
        + table(
            ["due (UTC)", "", "deadline (UTC)", "chat", "key", "state", "attempts"],
            rows,
            testid="scheduled",
            empty="no send scheduled for later",
        )
    )


# -- dead letters ---------------------------------------------------------------------------

#: The filter's fields, as the forms name them.
FILTER_FIELDS = ("kind", "reason", "chat_id", "key", "since", "until")


def _value_of(letter: DeadLetter, show: bool) -> str:
    body = letter.body()
    if body is None:
        return f"<{len(letter.value)} bytes, not UTF-8>"
    if isinstance(body, str):
        return body if show else f"hidden ({len(body)} chars: not JSON)"
    return json.dumps(body if show else conceal(body), indent=2, ensure_ascii=False)


def dead_letters(
    view: View,
    letters: Sequence[DeadLetter],
    kinds: Mapping[str, str],
    fields: Mapping[str, str],
    error: str | None,
) -> str:
    options = "".join(
        f'<option value="{e(k)}"{" selected" if fields.get("kind") == k else ""}>{e(k)}</option>'
        for k in ("", "inbound", "outbox", "requests")
    )
    inputs = "".join(
        f'<label>{e(name.replace("_", " "))} <input name="{e(name)}" '
        f'data-testid="dlq-filter-{e(name)}" value="{e(fields.get(name, ""))}"></label>'
        for name in FILTER_FIELDS[1:]
    )
    filters = form(
        "/dead-letters",
        f'<label>kind <select name="kind" data-testid="dlq-filter-kind">{options}</select>'
        f'</label>{inputs}<button type="submit" data-testid="dlq-filter-submit">filter</button>',
        method="get",
        testid="dlq-filter",
    )
    body = [filters, "<p>since/until: ISO 8601 (2026-12-03T10:00:00Z) or Unix seconds</p>"]
    if error is not None:
        body.append(f'<p class="error" data-testid="error">{e(error)}</p>')
    if view.can_act and letters:
        body.append(_bulk(view, letters, kinds, fields))
    elif not view.can_act and view.read_only is None:
        body.append('<p><a href="/login">sign in</a> to retry, replay or discard.</p>')
    rows = [_letter_row(view, d, kinds[d.topic]) for d in letters]
    body.append(
        table(
            ["dead at (UTC)", "kind", "where", "chat", "key / inbound id", "reason", "error",
             "headers and value", ""],
            rows,
            testid="dlq-table",
            empty="no dead letters match",
        )
    )  # fmt: skip
    return frame(view, "Dead letters", "".join(body))


def _filter_inputs(fields: Mapping[str, str]) -> str:
    return "".join(hidden(k, fields[k]) for k in FILTER_FIELDS if fields.get(k))


def _bulk(
    view: View, letters: Sequence[DeadLetter], kinds: Mapping[str, str], fields: Mapping[str, str]
) -> str:
    present = {kinds[d.topic] for d in letters}
    buttons = []
    for command in COMMANDS:
        if command_kind(command) not in present:
            continue
        n = sum(1 for d in letters if kinds[d.topic] == command_kind(command))
        buttons.append(
            form(
                "/dead-letters/action",
                hidden("command", command)
                + _filter_inputs({**fields, "kind": ""})
                + f'<button type="submit" data-testid="dlq-bulk-{e(command)}">{e(command)} '
                f"the {n} {e(command_kind(command))} dead letter(s) listed</button>",
                csrf=view.csrf,
                inline=True,
            )
        )
    return f"<p>Every one listed (a dry run first): {' '.join(buttons)}</p>"


def _letter_row(view: View, d: DeadLetter, kind: str) -> tuple[list[Any], dict[str, object]]:
    ident = d.send_key or d.inbound_id or ""
    error = " ".join(x for x in (d.headers.get("error.class"), d.headers.get("error.message")) if x)
    headers = table(
        ["header", "value"],
        (([e(k), e(v)], {}) for k, v in d.headers.items()),
        testid="dlq-headers",
    )
    details = (
        "<details><summary>show</summary>"
        f'{headers}<pre data-testid="dlq-value">{e(_value_of(d, view.show_texts))}</pre>'
        "</details>"
    )
    actions = ""
    if view.can_act:
        actions = " ".join(
            form(
                "/dead-letters/action",
                hidden("command", c)
                + hidden("key", ident)
                + f'<button type="submit" data-testid="dlq-action-{e(c)}">{e(c)}</button>',
                csrf=view.csrf,
                inline=True,
            )
            for c in KIND_COMMANDS[kind]
            if ident
        )
    where = f"{d.topic}:{d.partition}:{d.offset}"
    return (
        [
            e(when(d.dead_ts)),
            e(kind),
            f"<code>{e(where)}</code>",
            e(d.chat_id or ""),
            f"<code>{e(ident)}</code>",
            e(d.reason),
            e(error[:200]),
            details,
            actions,
        ],
        {
            "data-testid": "dlq-row",
            "data-kind": kind,
            "data-key": ident,
            "data-reason": d.reason,
            "data-chat": d.chat_id or "",
            "data-where": where,
        },
    )


def cli_line(words: Sequence[str]) -> str:
    return shlex.join(["botmesh", *words])


#: The columns of an action's plan and of its results.
ACTION_HEAD = ("target", "chat", "outcome", "state", "detail", "worker")


def action(
    view: View,
    command: str,
    fields: Mapping[str, str],
    report_results: Sequence[Mapping[str, Any]],
    summary: str,
    *,
    dry_run: bool,
    nothing: bool,
    control: str,
) -> str:
    """A dry run with its confirmation, or what the owners answered."""
    words = ["dlq", command]
    for name in ("chat_id", "key", "reason", "since", "until"):
        if fields.get(name):
            words += [f"--{name.replace('_', '-')}", fields[name]]
    back = '<p><a href="/dead-letters" data-testid="action-back">back to the dead letters</a></p>'
    if nothing:
        text = f'<p class="error" data-testid="action-summary">{e(summary)}</p>'
        return frame(
            view,
            f"{command}: nothing to do",
            f'<div data-testid="action-result">{text}</div>{back}',
        )
    if dry_run:
        body = _dry_run(
            view,
            command,
            fields,
            words=words,
            report_results=report_results,
            summary=summary,
            control=control,
        )
        return frame(view, f"{command}: dry run", body)
    body = (
        f'<div data-testid="action-result"><p class="ok" data-testid="action-summary">'
        f"{e(summary)}</p><p>as <code>{e(cli_line(words))}</code> does: the owners' answers "
        f"from <code>{e(control)}.results</code></p>"
        + table(ACTION_HEAD, _result_rows(report_results), testid="action-results")
        + "</div>"
        + back
    )
    return frame(view, f"{command}: done", body)


def _result_rows(report_results: Sequence[Mapping[str, Any]]) -> Iterator[Row]:
    """A row per dead letter an action would touch or touched, with its outcome."""
    return (
        (
            [
                f"<code>{e(r.get('target') or '')}</code>",
                e(r.get("chat_id") or ""),
                f'<span class="state-{e(r["outcome"])}">{e(r["outcome"])}</span>',
                e(r.get("state") or ""),
                e(r.get("detail") or ""),
                e(r.get("worker") or ""),
            ],
            {
                "data-testid": "action-result-row",
                "data-target": r.get("target") or "",
                "data-outcome": r["outcome"],
                "data-state": r.get("state") or "",
            },
        )
        for r in report_results
    )


def _dry_run(
    view: View,
    command: str,
    fields: Mapping[str, str],
    *,
    words: Sequence[str],
    report_results: Sequence[Mapping[str, Any]],
    summary: str,
    control: str,
) -> str:
    """A dry run's plan, with the form that confirms it."""
    confirm = form(
        "/dead-letters/action",
        hidden("command", command)
        + _filter_inputs(fields)
        + hidden("confirm", "yes")
        + f'<button type="submit" data-testid="action-confirm">yes, {e(command)} '
        f"through the chats' owners</button>",
        csrf=view.csrf,
    )
    return (
        f'<div data-testid="action-dry-run"><p data-testid="action-summary">{e(summary)}</p>'
        f"<p>as <code>{e(cli_line([*words, '--dry-run']))}</code> says; nothing was done. "
        f"Confirm to ask each chat's owner through <code>{e(control)}</code>:</p>"
        + table(ACTION_HEAD, _result_rows(report_results), testid="action-plan")
        + confirm
        + '<p><a href="/dead-letters" data-testid="action-cancel">cancel</a></p></div>'
    )


# -- replay ---------------------------------------------------------------------------------


def replay(
    view: View,
    fields: Mapping[str, str],
    result: ReplayResult | None,
    error: str | None,
    words: Sequence[str],
) -> str:
    body = [
        "<p>The offsets <code>botmesh replay</code> would set for the worker group, with its "
        "refusals. Nothing changes here: run the command shown to apply it.</p>",
        _replay_form(fields),
    ]
    if error is not None:
        body.append(f'<p class="error" data-testid="replay-error">{e(error)}</p>')
    if result is not None:
        body.append(_replay_plan(view, result, words))
    return frame(view, "Replay", "".join(body))


def _replay_form(fields: Mapping[str, str]) -> str:
    """The form that asks for a replay: the mode, its value, the topics and partitions."""
    mode = fields.get("mode", "")
    modes = "".join(
        f'<label><input type="radio" name="mode" value="{m}"'
        f'{" checked" if mode == m else ""} data-testid="replay-mode-{m}"> {label}</label>'
        for m, label in (
            ("from-offset", "--from-offset N"),
            ("from-time", "--from-time TIME"),
            ("to-earliest", "--to-earliest"),
        )
    )
    topics = fields.get("topic", "inbound").split(",")
    boxes = "".join(
        f'<label><input type="checkbox" name="topic" value="{t}"'
        f'{" checked" if t in topics else ""} data-testid="replay-topic-{t}"> {t}</label>'
        for t in ("inbound", "requests")
    )
    return form(
        "/replay",
        f'{modes}<br><label>N or TIME <input name="value" data-testid="replay-value" '
        f'value="{e(fields.get("value", ""))}"></label>{boxes}'
        f'<label>partitions <input name="partition" data-testid="replay-partition" '
        f'value="{e(fields.get("partition", ""))}" placeholder="all, or 0,2"></label>'
        '<button type="submit" data-testid="replay-submit">plan</button>',
        method="get",
        testid="replay-form",
    )


def _replay_plan(view: View, result: ReplayResult, words: Sequence[str]) -> str:
    """The offsets a replay would set, with the refusal a real run would meet."""
    head = (
        f"<p>as <code>{e(cli_line([*words, '--dry-run']))}</code> says, for group "
        f"<code>{e(result.group)}</code> to {e(result.target)}:</p>"
    )
    if result.refused is not None:
        head += (
            f'<p class="error" data-testid="replay-refusal">the real run would be refused: '
            f"{e(result.refused)}</p>"
        )
    rows = (
        (
            [
                e(m.topic),
                (str(m.partition), {"class": "n"}),
                (
                    "-" if m.current is None else str(m.current),
                    {"class": "n", "data-testid": "replay-current"},
                ),
                (str(m.new), {"class": "n", "data-testid": "replay-new"}),
                (str(m.records), {"class": "n"}),
                e(f"{m.start}-{m.end}"),
            ],
            {
                "data-testid": "replay-move",
                "data-topic": _role(m.topic, view.prefix),
                "data-partition": m.partition,
            },
        )
        for m in result.moves
    )
    return head + table(
        ["topic", "partition", "committed", "new", "read again", "retained"],
        rows,
        testid="replay-moves",
    )


# -- login ----------------------------------------------------------------------------------


def login(view: View, error: str | None, next_path: str) -> str:
    problem = f'<p class="error" data-testid="login-error">{e(error)}</p>' if error else ""
    ask = form(
        "/login",
        hidden("next", next_path)
        + '<label>token <input type="password" name="token" data-testid="login-token" '
        'autocomplete="current-password" required></label>'
        '<button type="submit" data-testid="login-submit">sign in</button>',
        testid="login-form",
    )
    return frame(
        view,
        "Sign in",
        problem + "<p>One of the console's tokens (<code>--token-file</code>, "
        "<code>BOTMESH_CONSOLE_TOKEN</code>) lets you retry, replay and discard dead "
        "letters. Scripts send <code>Authorization: Bearer &lt;token&gt;</code> instead.</p>" + ask,
    )
