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
from botmesh.console.pages import View, timeline
from botmesh.console.render import conceal
from botmesh.state.keys import scope_id
from botmesh.state.kv import Entry
from botmesh.state.messages import OutboxState, Receipt
from botmesh.streams.journal_db import encode_entry
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
