"""The ops console without a broker: what a page shows is escaped, texts are hidden unless
asked for, and an action needs a token, a session's CSRF token, and actions on. The index
is fed records encoded as the worker encodes them (``encode_entry``, ``encode_receipt``,
the dead letters' own headers); the app runs in aiohttp's test server, its follower never
started (every request here is answered before Kafka would be asked)."""

from __future__ import annotations

import re
import time
from collections.abc import AsyncIterator

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from botmesh.console import Console, ConsoleConfig, Tokens
from botmesh.console.auth import SESSION_COOKIE, Sessions, csrf_ok
from botmesh.console.index import Index
from botmesh.console.pages import CAMPAIGN_COUNTS, View, campaigns, overview, timeline
from botmesh.console.render import conceal
from botmesh.state.campaigns import tally
from botmesh.state.keys import scope_id
from botmesh.state.kv import Entry
from botmesh.state.messages import OutboxState, Receipt
from botmesh.streams.journal_db import decode_entry, encode_entry
from botmesh.streams.ops.tail import Record
from botmesh.topics import Catalog, encode_receipt
from botmesh.topics.dead_letters import outbox_dead_letter

TOKEN = "alice:0123456789abcdef-secret"
EVIL = "<script>alert(1)</script>"
SCOPE = scope_id("t", "e", "console-test", "c")


def journal(cat: Catalog, chat: str, text: str, *, dead: bool = False) -> list[Record]:
    """An inbound of ``chat`` and its reply, as the worker's changelog holds them."""
    now = time.time()
    inbound = {
        "id": "m1",
        "state": "done",
        "attempts": 1,
        "message": {"v": 1, "id": "m1", "chat_id": chat, "text": text},
        "created": now,
        "updated": now,
        "source": f"{cat.inbound}:0:7",
    }
    send: dict[str, object] = {
        "key": "m1:1",
        "state": "dead" if dead else "sent",
        "attempts": 1,
        "payload": {"chat_id": chat, "text": f"echo {text}"},
        "inbound_id": "m1",
        "created": now + 0.1,
        "updated": now + 0.2,
    }
    if dead:
        send["error"] = {"type": "PermanentSendError", "message": "no", "reason": "send-refused"}
    else:
        send["message_id"] = "prov-1"
    out = []
    for n, (key, value) in enumerate(((f"{SCOPE}/in/m1", inbound), (f"{SCOPE}/out/m1:1", send))):
        raw = encode_entry(Entry(key, value, 1))
        out.append(Record(cat.changelog("journal"), 0, n, now, key.encode(), raw))
    return out


def receipt(cat: Catalog, chat: str) -> Record:
    r = Receipt(key="m1:1", chat_id=chat, message_id="prov-1", state=OutboxState.SENT, ts=1.0)
    return Record(cat.sent, 0, 0, 1.0, chat.encode(), encode_receipt(r))


def view(show: bool) -> View:
    return View(prefix="bm", who=None, csrf=None, read_only=None, show_texts=show)


def test_a_chat_id_and_texts_with_markup_are_escaped() -> None:
    cat = Catalog("bm")
    index = Index(cat)
    index.apply([*journal(cat, EVIL, EVIL), receipt(cat, EVIL)])
    found = index.timeline(EVIL)
    assert not found.empty
    for show in (True, False):
        html = timeline(view(show), EVIL, found)
        assert "<script>" not in html
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html  # the chat id, escaped
    shown = timeline(view(True), EVIL, found)
    assert "echo &lt;script&gt;" in shown
    hidden = timeline(view(False), EVIL, found)
    assert "echo &lt;script&gt;" not in hidden
    assert hidden.count("hidden (25 chars)") == 1 and "hidden (30 chars)" in hidden


def test_the_timeline_links_a_send_to_its_inbound_receipt_and_dead_letter() -> None:
    cat = Catalog("bm")
    index = Index(cat)
    index.apply([*journal(cat, "c1", "hi"), receipt(cat, "c1")])
    [(_, inbound)] = index.timeline("c1").items
    [send] = inbound.sends  # type: ignore[union-attr]
    assert (send.key, send.state, send.message_id) == ("m1:1", "sent", "prov-1")
    assert [r.state for r in send.receipts] == ["sent"]
    index.apply([receipt(cat, "c1")])  # a copy of the receipt: one kept
    [(_, inbound)] = index.timeline("c1").items
    assert len(inbound.sends[0].receipts) == 1  # type: ignore[union-attr]

    index.apply(journal(cat, "c2", "x", dead=True))
    [(_, inbound)] = index.timeline("c2").items
    assert inbound.sends[0].dead_reason == "send-refused"  # type: ignore[union-attr]
    tombstone = Record(cat.changelog("journal"), 0, 9, 0.0, f"{SCOPE}/out/m1:1".encode(), None)
    index.apply([tombstone])  # the journal forgot the send (c2's: the last write of the key)
    [(_, inbound)] = index.timeline("c2").items
    assert inbound.sends == ()  # type: ignore[union-attr]


def test_the_timeline_shows_a_sends_delivery_states_and_an_edit() -> None:
    cat = Catalog("bm")
    index = Index(cat)
    records = journal(cat, "c1", "hi")
    send = decode_entry(b"", records[1].value or b"")
    assert send is not None
    failed = {**send.value, "delivery": {"state": "failed", "code": "131047", "ts": 2.0}}
    edit = {
        **send.value,
        "key": "m1:2",
        "op": "edit",
        "target": "prov-1",
        "message_id": "prov-1",
    }
    for n, (key, value) in enumerate(((f"{SCOPE}/out/m1:1", failed), (f"{SCOPE}/out/m1:2", edit))):
        raw = encode_entry(Entry(key, value, 2))
        records.append(Record(cat.changelog("journal"), 0, 10 + n, 2.0, key.encode(), raw))
    steps = [None, "delivered", "delivered", "failed"]  # a copy of "delivered": one kept
    for n, step in enumerate(steps):
        r = Receipt(
            key="m1:1",
            chat_id="c1",
            message_id="prov-1",
            state=OutboxState.SENT,
            ts=1.0 + n,
            delivery=step,  # type: ignore[arg-type]
        )
        records.append(Record(cat.sent, 0, n, 1.0, b"c1", encode_receipt(r)))
    index.apply(records)
    [(_, inbound)] = index.timeline("c1").items
    sent, changed = inbound.sends  # type: ignore[union-attr]
    assert [r.delivery for r in sent.receipts] == [None, "delivered", "failed"]
    assert (sent.delivery, sent.delivery_code) == ("failed", "131047")
    assert (changed.op, changed.target) == ("edit", "prov-1")
    html = timeline(view(False), "c1", index.timeline("c1"))
    assert 'data-testid="send-delivery" data-delivery="failed"' in html
    assert "channel code 131047" in html and "edit of prov-1" in html
    assert html.count('data-delivery="delivered"') == 1


def test_a_flow_checkpoint_shows_its_status_and_hides_its_answers() -> None:
    cat = Catalog("bm")
    index = Index(cat)
    flow = {
        "flow": "signup",
        "run": "r1",
        "chat_id": "c1",
        "status": "active",
        "steps": [{"kind": "answer", "src": "m1", "text": "my secret answer"}],
        "data": {"email": "a@example.com"},
        "deadline": 2e9,
        "updated": 1.0,
    }
    key = f"{SCOPE}/flow/c1"
    raw = encode_entry(Entry(key, flow, 1))
    index.apply([Record(cat.changelog("journal"), 0, 0, 1.0, key.encode(), raw)])
    html = timeline(view(False), "c1", index.timeline("c1"))
    assert 'data-kind="flow" data-state="active"' in html and "signup" in html
    assert "my secret answer" not in html and "a@example.com" not in html
    assert "hidden (16 chars)" in html
    assert "my secret answer" in timeline(view(True), "c1", index.timeline("c1"))


def test_a_sign_in_goes_back_to_this_site_only() -> None:
    from botmesh.console.server import _local

    assert _local("/timeline?chat_id=1") == "/timeline?chat_id=1"
    for elsewhere in ("//evil.example/", "/\\evil.example", "https://evil.example", ""):
        assert _local(elsewhere) == "/"


def test_dead_letters_are_counted_by_kind_and_reason_and_texts_concealed() -> None:
    cat = Catalog("bm")
    index = Index(cat)
    value = {
        "key": "m1:1",
        "payload": {"chat_id": "c1", "text": "secret words"},
        "error": {"reason": "send-refused", "type": "X", "message": "no"},
        "attempts": 2,
    }
    key, body, headers = outbox_dead_letter(value, f"{cat.inbound}:0:3")
    index.apply([Record(cat.outbox_dlq, 0, 0, 1.0, key, body, tuple(headers))])
    assert index.dead_counts() == {("outbox", "send-refused"): 1}
    [letter] = index.dead_letters()
    assert (letter.send_key, letter.chat_id) == ("m1:1", "c1")
    assert conceal(letter.body())["text"] == "hidden (12 chars)"


def test_tokens_and_csrf() -> None:
    tokens = Tokens.parse(f"# ops\n{TOKEN}\n0123456789abcdefXYZ\n", "--token-file t")
    assert tokens.who("0123456789abcdef-secret") == "alice"
    assert (tokens.who("0123456789abcdefXYZ") or "").startswith("operator-")
    assert tokens.who("wrong-token-0123456789") is None and tokens.who("") is None
    with pytest.raises(ValueError, match="at least 16 characters"):
        Tokens.parse("bob:short", "--token-file t")
    with pytest.raises(ValueError, match="holds no token"):
        Tokens.parse("# nothing\n\n", "BOTMESH_CONSOLE_TOKEN")
    sessions = Sessions()
    session = sessions.open("alice")
    other = sessions.open("bob")
    assert csrf_ok(session, session.csrf)
    assert not csrf_ok(session, other.csrf)
    assert not csrf_ok(session, "")
    assert not csrf_ok(None, session.csrf)
    assert sessions.get(session.id, now=session.until + 1) is None  # expired


@pytest.fixture
async def client() -> AsyncIterator[TestClient[web.Request, web.Application]]:
    config = ConsoleConfig(bootstrap="127.0.0.1:1", prefix="bm", tokens=Tokens.parse(TOKEN, "test"))
    console = Console(config)  # never started: nothing here reaches Kafka
    async with TestClient(TestServer(console.app())) as c:
        yield c


def _csrf(html: str) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', html)
    assert found, html
    return found[1]


async def test_an_action_needs_a_token_and_the_sessions_csrf(
    client: TestClient[web.Request, web.Application],
) -> None:
    action = {"command": "retry", "key": "m1:1"}
    anonymous = await client.post("/dead-letters/action", data=action)
    assert anonymous.status == 401
    assert 'data-testid="action-refused"' in await anonymous.text()
    bearer = await client.post(
        "/dead-letters/action", data=action, headers={"Authorization": "Bearer not-it"}
    )
    assert bearer.status == 401

    wrong = await client.post("/login", data={"token": "not-a-token-of-ours"})
    assert wrong.status == 401 and 'data-testid="login-error"' in await wrong.text()
    signed = await client.post(
        "/login", data={"token": "0123456789abcdef-secret"}, allow_redirects=False
    )
    assert signed.status == 303
    cookie = signed.cookies[SESSION_COOKIE]
    assert "httponly" in cookie.output().lower() and "samesite=strict" in cookie.output().lower()
    page = await client.get("/timeline")
    assert 'data-testid="whoami">signed in as alice' in await page.text()
    csrf = _csrf(await page.text())
    forged = await client.post("/dead-letters/action", data={**action, "csrf": "forged"})
    assert forged.status == 403
    assert "CSRF token" in await forged.text()
    missing = await client.post("/dead-letters/action", data=action)
    assert missing.status == 403
    cross = await client.post(
        "/dead-letters/action",
        data={**action, "csrf": csrf},
        headers={"Origin": "https://evil.example"},
    )
    assert cross.status == 403
    bad = await client.post(
        "/dead-letters/action", data={"command": "explode", "csrf": csrf}
    )  # past the checks: the command is refused, naming it
    assert bad.status == 400 and "unknown command &#x27;explode&#x27;" in await bad.text()


async def test_read_only_has_no_sign_in_and_refuses_every_post() -> None:
    for config in (
        ConsoleConfig(bootstrap="127.0.0.1:1", prefix="bm"),  # no token
        ConsoleConfig(
            bootstrap="127.0.0.1:1",
            prefix="bm",
            tokens=Tokens.parse(TOKEN, "test"),
            read_only=True,
        ),
    ):
        async with TestClient(TestServer(Console(config).app())) as c:
            page = await (await c.get("/dead-letters")).text()
            assert 'data-testid="readonly-banner"' in page
            assert "dlq-action-" not in page and "nav-login" not in page
            headers = {"Authorization": "Bearer 0123456789abcdef-secret"}
            refused = await c.post("/dead-letters/action", data={}, headers=headers)
            assert refused.status == 403 and "read-only" in await refused.text()
            assert (await c.post("/login", data={"token": "x"})).status == 403


async def test_the_pages_say_a_bad_input_and_carry_the_safety_headers(
    client: TestClient[web.Request, web.Application],
) -> None:
    bad = await client.get("/dead-letters", params={"since": "yesterday"})
    assert bad.status == 400
    assert "since &#x27;yesterday&#x27; is not a time" in await bad.text()
    plan = await client.get("/replay", params={"mode": "from-offset", "value": "-3"})
    assert plan.status == 400
    assert "--from-offset &#x27;-3&#x27;: give a whole number" in await plan.text()
    assert "default-src 'none'" in plan.headers["Content-Security-Policy"]
    assert plan.headers["X-Frame-Options"] == "DENY"
    # a browser posts the page's own forms with its real Origin (under no-referrer: "null",
    # refused as another site's; tests/kafka/test_console_browser.py signs in for real)
    assert plan.headers["Referrer-Policy"] == "same-origin"
    empty = await client.get("/timeline", params={"chat_id": EVIL})
    text = await empty.text()
    assert 'data-testid="timeline-empty"' in text and "<script>" not in text


# -- campaigns and scheduled sends -------------------------------------------------------------


def outbox(
    cat: Catalog,
    key: str,
    chat: str,
    state: str,
    *,
    at: float | None = None,
    deadline: float | None = None,
    reason: str | None = None,
    updated: float = 1000.0,
    part: int = 1,
) -> Record:
    """A send's record under ``key`` (part ``part``) as the worker's changelog holds it."""
    value: dict[str, object] = {
        "key": key,
        "state": state,
        "attempts": 0 if state == "pending" else 1,
        "payload": {"chat_id": chat, "text": "spring sale"},
        "created": updated - 1,
        "updated": updated,
    }
    if part != 1:
        value.update(part=part, parts=part)
    if at is not None:
        value["at"] = at
    if deadline is not None:
        value["deadline"] = deadline
    if reason is not None:
        value["error"] = {"type": "X", "message": "no", "retryable": False, "reason": reason}
    journal_key = f"{SCOPE}/out/{key if part == 1 else f'{key}#{part}'}"
    raw = encode_entry(Entry(journal_key, value, 1))
    return Record(cat.changelog("journal"), 0, 0, updated, journal_key.encode(), raw)


def campaign_records(cat: Catalog, campaign: str, updated: float = 1000.0) -> list[Record]:
    """A campaign of 10 recipients, one or more in every state, and two records that are not
    its sends' first parts (a second part, another campaign's look-alike key)."""
    states = [
        ("pending", None), ("failed", None), ("sent", None), ("sent", None), ("sent", None),
        ("dead", "send-refused"), ("dead", "expired"), ("dead", "expired"), ("unknown", None),
        ("cancelled", None),
    ]  # fmt: skip
    out = [
        outbox(cat, f"campaign:{campaign}:u{i}", f"u{i}", state, reason=reason, updated=updated)
        for i, (state, reason) in enumerate(states)
    ]
    out.append(outbox(cat, f"campaign:{campaign}:u2", "u2", "pending", part=2, updated=updated))
    out.append(outbox(cat, f"campaign:{campaign}x:u0", "u0", "sent", updated=updated - 500))
    out.append(outbox(cat, "m1:1", "u0", "sent", updated=updated))  # not a campaign's
    return out


def campaigns_page(index: Index, now: float, limit: int = 500) -> str:
    listed, waiting, due = index.scheduled(now, limit)
    return campaigns(view(False), index.campaigns(), listed, waiting=waiting, due=due, now=now)


def cell(html: str, row: str, testid: str) -> str:
    """The text of the cell ``testid`` in the row whose ``<tr`` starts with ``row``."""
    start = html.index(row)
    found = re.search(rf'data-testid="{testid}"[^>]*>([^<]*)<', html[start:])
    assert found, (row, testid)
    return found[1]


def test_a_campaign_is_counted_by_state_as_the_library_counts_it() -> None:
    cat = Catalog("bm")
    index = Index(cat)
    records = campaign_records(cat, "spring")
    index.apply(records)
    [spring, other] = index.campaigns()
    status = spring.status
    assert (status.campaign, other.campaign) == ("spring", "springx")
    counts = (status.pending, status.sent, status.dead, status.expired, status.unknown,
              status.cancelled, status.total, status.settled)  # fmt: skip
    assert counts == (2, 3, 1, 2, 1, 1, 10, 8)
    values = [decode_entry(r.key or b"", r.value).value for r in records]  # type: ignore[union-attr]
    assert status == tally("spring", values)  # the console counts as the library does
    html = campaigns_page(index, now=2000.0)
    row = '<tr data-testid="campaign-row" data-campaign="spring">'
    shown = {n: cell(html, row, f"campaign-{n}") for n in (*CAMPAIGN_COUNTS, "total")}
    assert shown == {"pending": "2", "sent": "3", "dead": "1", "expired": "2", "unknown": "1",
                     "cancelled": "1", "total": "10"}  # fmt: skip
    assert 'data-settled="8" data-total="10" data-percent="80"' in html
    assert "8 of 10 settled (80%)" in html
    assert 'class="bar-sent" style="width:30.000%"' in html  # the bar: 3 of 10 sent
    # the journal forgets a sent one (retention), and a pending one goes out
    gone = Record(cat.changelog("journal"), 0, 9, 0.0, f"{SCOPE}/out/campaign:spring:u2".encode(),
                  None)  # fmt: skip
    index.apply([gone, outbox(cat, "campaign:spring:u0", "u0", "sent", updated=1001.0)])
    status = index.campaigns()[0].status
    assert (status.pending, status.sent, status.total) == (1, 3, 9)


def test_campaigns_are_listed_newest_first() -> None:
    cat = Catalog("bm")
    index = Index(cat)
    for campaign, updated in (("march", 3000.0), ("january", 1000.0), ("february", 2000.0)):
        index.apply(campaign_records(cat, campaign, updated))
    order = [c.campaign for c in index.campaigns()]
    # each with its look-alike "<campaign>x", written 500 s before it
    assert order == ["march", "marchx", "february", "februaryx", "january", "januaryx"]
    html = campaigns_page(index, now=5000.0)
    rows = re.findall(r'data-testid="campaign-row" data-campaign="([^"]+)"', html)
    assert rows == order
    # january's sends written again, later than any: it comes first
    index.apply([outbox(cat, "campaign:january:u0", "u0", "sent", updated=4000.0)])
    assert index.campaigns()[0].campaign == "january"


def test_scheduled_sends_are_listed_soonest_first_and_only_ahead() -> None:
    cat = Catalog("bm")
    index = Index(cat)
    now = 10_000.0
    index.apply(
        [
            outbox(cat, "remind-late", "c3", "pending", at=now + 7200, deadline=now + 9000),
            outbox(cat, "remind-soon", "c1", "failed", at=now + 60),
            outbox(cat, "campaign:spring:c2", "c2", "pending", at=now + 3600),
            outbox(cat, "remind-due", "c4", "pending", at=now - 10),  # its time passed
            outbox(cat, "remind-sent", "c5", "sent", at=now + 100),  # gone out: not waiting
            outbox(cat, "remind-off", "c6", "cancelled", at=now + 100),
            outbox(cat, "plain", "c7", "pending"),  # not scheduled
        ]
    )
    listed, waiting, due = index.scheduled(now, 500)
    assert [s.key for s in listed] == ["remind-soon", "campaign:spring:c2", "remind-late"]
    assert (waiting, due) == (3, 1)
    assert (listed[2].at, listed[2].deadline, listed[2].chat_id) == (now + 7200, now + 9000, "c3")
    assert listed[0].deadline is None and listed[0].state == "failed"
    html = campaigns_page(index, now)
    keys = re.findall(r'data-testid="scheduled-row" data-key="([^"]+)"', html)
    assert keys == ["remind-soon", "campaign:spring:c2", "remind-late"]
    late = '<tr data-testid="scheduled-row" data-key="remind-late"'
    assert cell(html, late, "scheduled-at") == "1970-01-01 04:46:40.000"  # now + 2 h
    assert cell(html, late, "scheduled-deadline") == "1970-01-01 05:16:40.000"
    assert '<a href="/timeline?chat_id=c3" data-testid="scheduled-chat">c3</a>' in html
    assert 'data-testid="scheduled-count">3<' in html and "scheduled-more" not in html
    assert 'data-testid="scheduled-due">1<' in html
    # bounded: the soonest 2 of 3, saying how many more
    assert [s.key for s in index.scheduled(now, 2)[0]] == ["remind-soon", "campaign:spring:c2"]
    assert 'data-testid="scheduled-more">1<' in campaigns_page(index, now, limit=2)
    # the soonest goes out: no longer scheduled; later, every time has passed
    index.apply([outbox(cat, "remind-soon", "c1", "sent", at=now + 60, updated=now + 61)])
    assert [s.key for s in index.scheduled(now, 500)[0]] == ["campaign:spring:c2", "remind-late"]
    assert index.scheduled(now + 8000, 500) == ([], 0, 3)


def test_hostile_chat_ids_and_keys_on_the_campaigns_page_are_escaped() -> None:
    cat = Catalog("bm")
    index = Index(cat)
    hostile = f'"><b>{EVIL}'
    index.apply(
        [
            outbox(cat, f"campaign:{EVIL}:{hostile}", hostile, "pending", at=9e9),
            outbox(cat, f"campaign:{EVIL}:x&y", "x&y", "pending", at=9e9 + 1, deadline=9e9 + 5),
        ]
    )
    [found] = index.campaigns()
    assert (found.campaign, found.status.pending) == (EVIL, 2)
    html = campaigns_page(index, now=time.time())
    assert "<script>" not in html and "<b>" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert 'data-campaign="&lt;script&gt;alert(1)&lt;/script&gt;"' in html
    assert "/timeline?chat_id=%22%3E%3Cb%3E%3Cscript%3Ealert%281%29%3C%2Fscript%3E" in html
    assert 'href="/timeline?chat_id=x%26y"' in html


def test_a_send_entry_shows_its_times_its_expiry_and_its_cancel() -> None:
    cat = Catalog("bm")
    index = Index(cat)
    index.apply(
        [
            outbox(cat, "later", "c1", "pending", at=7200.0, deadline=9000.0, updated=10.0),
            outbox(cat, "too-late", "c1", "dead", reason="expired", deadline=50.0, updated=20.0),
            outbox(cat, "called-off", "c1", "cancelled", at=7200.0, updated=30.0),
        ]
    )
    later, too_late, off = (item for _, item in index.timeline("c1").items)
    assert (later.at, later.deadline) == (7200.0, 9000.0)  # type: ignore[union-attr]
    html = timeline(view(False), "c1", index.timeline("c1"))
    assert 'data-testid="send-at" data-at="7200.0">1970-01-01 02:00:00.000<' in html
    assert 'data-testid="send-deadline" data-deadline="9000.0">1970-01-01 02:30:00.000<' in html
    expired = html[html.index('data-key="too-late"') :]
    assert 'data-testid="send-dead-reason">expired</span> (not delivered by its deadline' in (
        expired
    )
    cancelled = html[html.index('data-key="called-off"') :]
    assert 'data-testid="send-state">cancelled</strong>' in cancelled
    assert "cancelled before it went out: never sent" in cancelled
    assert (too_late.dead_reason, off.state) == ("expired", "cancelled")  # type: ignore[union-attr]


async def test_every_page_links_to_the_campaigns(
    client: TestClient[web.Request, web.Application],
) -> None:
    for path in ("/timeline", "/timeline?chat_id=c1", "/campaigns", "/dead-letters", "/replay",
                 "/login"):  # fmt: skip
        html = await (await client.get(path)).text()
        assert '<a href="/campaigns" data-testid="nav-campaigns">' in html, path
    # the overview (rendered here: served, it asks Kafka for the group first)
    html = overview(
        view(False),
        None,
        None,
        inbound="bm.inbound",
        workers={},
        dead={},
        ambiguous=0,
        history=[],
        counters=[],
        scheduled=3,
        running=2,
    )
    assert 'data-testid="nav-campaigns"' in html
    assert 'data-testid="overview-scheduled">3<' in html
    assert 'data-testid="overview-campaigns">2<' in html


async def test_the_campaigns_page_is_served_from_the_index() -> None:
    config = ConsoleConfig(bootstrap="127.0.0.1:1", prefix="bm")
    console = Console(config)  # never started: its index fed here
    later = time.time() + 3600
    console.index.apply(
        [
            *campaign_records(console.cat, "spring"),
            outbox(console.cat, "campaign:autumn:a1", "a1", "pending", at=later),
        ]
    )
    async with TestClient(TestServer(console.app())) as c:
        response = await c.get("/campaigns")
        html = await response.text()
    assert response.status == 200
    assert re.findall(r'data-testid="campaign-row" data-campaign="([^"]+)"', html) == [
        "autumn", "spring", "springx",
    ]  # fmt: skip
    assert re.findall(r'data-testid="scheduled-row" data-key="([^"]+)"', html) == [
        "campaign:autumn:a1"
    ]
