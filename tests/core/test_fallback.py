"""A send's fallback, exactly once: a WhatsApp send refused outside the 24-hour window
(``OutsideSessionWindowError``) goes out as the template (or through the channel) its
``Fallback`` names, once, under ``<key>~fallback``, and its receipt says so.

The real WhatsApp adapter talks HTTP to the local Graph fake (tests/providers/fakes/graph.py):
a chat in ``closed_windows`` refuses texts with 131047 and takes approved templates, as the
Cloud API does. Crashes are the journal wrapper's (``botmesh.testing.crashable``) at the
switch's own write (``outbox.fallback``) and around the fallback's provider call.
"""

from __future__ import annotations

import random
from collections.abc import AsyncIterator
from typing import Any

import pytest

from botmesh import Bot, DeadEvent, Fallback, FallbackEvent
from botmesh.journal import MemoryKv, Write
from botmesh.providers.whatsapp import WhatsAppProvider
from botmesh.state.errors import OutsideSessionWindowError, Reason
from botmesh.state.kv import DurableKv
from botmesh.testing import ManualClock, MockProvider, SimulatedCrash, crashable
from tests.kit import App, make_app, policy, settle
from tests.providers.fakes.graph import VERSION, GraphFake
from tests.providers.serve import serving

USER = "15551230001"
TEMPLATE = Fallback.template("hello_world", "en_US")


@pytest.fixture
async def graph() -> AsyncIterator[tuple[GraphFake, str]]:
    fake = GraphFake()
    fake.closed_windows.add(USER)
    async with serving(fake.app()) as base:
        yield fake, base


def _whatsapp(fake: GraphFake, base: str) -> WhatsAppProvider:
    return WhatsAppProvider(fake.whatsapp_token, fake.phone_number_id, api_url=f"{base}/{VERSION}")


def _bot(events: list[Any], **options: Any) -> Bot:
    bot = Bot("bot", durability=policy(**options))
    bot.on(FallbackEvent, events.append)
    bot.on(DeadEvent, events.append)
    return bot


async def _app(
    provider: Any,
    events: list[Any],
    *,
    kv: DurableKv | None = None,
    clock: ManualClock | None = None,
    fallbacks: dict[str, Any] | None = None,
    **options: Any,
) -> App:
    clock = clock or ManualClock()
    kv = kv if kv is not None else MemoryKv()
    bot = _bot(events, **options)
    runtime = bot.bind(
        provider, kv, instance_id="i1", clock=clock, rng=random.Random(7), fallbacks=fallbacks
    )
    await runtime.start()
    return App(runtime, bot, provider, clock, kv)


def _sent(fake: GraphFake) -> list[dict[str, Any]]:
    return [a.body for a in fake.accepted["whatsapp"]]


# -- the switch ---------------------------------------------------------------------------


async def test_a_reply_outside_the_window_goes_out_as_its_template_once(
    graph: tuple[GraphFake, str],
) -> None:
    fake, base = graph
    events: list[Any] = []
    wa = _whatsapp(fake, base)
    app = await _app(wa, events)
    try:
        receipt = await app.runtime.send(
            USER, "Your order shipped", idempotency_key="k", fallback=TEMPLATE
        )
        rec = await app.ops.outbox.get("k")
    finally:
        await app.stop()
    assert receipt.state == "sent" and receipt.fallback_key == "k~fallback"
    [body] = _sent(fake)
    assert body["type"] == "template" and body["template"]["name"] == "hello_world"
    assert receipt.message_id == fake.accepted["whatsapp"][0].id
    assert events == [FallbackEvent("k", "k~fallback", "OutsideSessionWindowError", None)]
    assert rec is not None and rec.state == "sent"


async def test_without_a_fallback_the_refusal_is_final(graph: tuple[GraphFake, str]) -> None:
    fake, base = graph
    events: list[Any] = []
    app = await _app(_whatsapp(fake, base), events)
    try:
        with pytest.raises(OutsideSessionWindowError):
            await app.runtime.send(USER, "Your order shipped", idempotency_key="k")
    finally:
        await app.stop()
    assert _sent(fake) == []
    assert [type(e) for e in events] == [DeadEvent]


async def test_an_open_window_sends_the_text_and_never_the_fallback(
    graph: tuple[GraphFake, str],
) -> None:
    fake, base = graph
    fake.closed_windows.clear()
    events: list[Any] = []
    app = await _app(_whatsapp(fake, base), events)
    try:
        receipt = await app.runtime.send(USER, "hi", idempotency_key="k", fallback=TEMPLATE)
    finally:
        await app.stop()
    assert receipt.fallback_key is None
    assert [b["type"] for b in _sent(fake)] == ["text"] and events == []


async def test_an_enqueued_send_falls_back_in_the_sweeper(graph: tuple[GraphFake, str]) -> None:
    fake, base = graph
    events: list[Any] = []
    app = await _app(_whatsapp(fake, base), events)
    try:
        key = await app.runtime.enqueue(USER, "later", idempotency_key="q", fallback=TEMPLATE)
        await settle(app, passes=3, step=1.0)
        rec = await app.ops.outbox.get(key)
    finally:
        await app.stop()
    assert rec is not None and rec.state == "sent"
    assert [b["type"] for b in _sent(fake)] == ["template"]
    assert [type(e) for e in events] == [FallbackEvent]


async def test_the_fallback_s_own_refusal_is_dead_and_never_falls_back_again(
    graph: tuple[GraphFake, str],
) -> None:
    fake, base = graph
    events: list[Any] = []
    app = await _app(_whatsapp(fake, base), events)
    unknown = Fallback.template("no_such_template", "en_US")
    try:
        with pytest.raises(Exception, match="132001"):
            await app.runtime.send(USER, "hi", idempotency_key="k", fallback=unknown)
        rec = await app.ops.outbox.get("k")
    finally:
        await app.stop()
    assert rec is not None and rec.state == "dead"
    assert _sent(fake) == []
    assert [type(e) for e in events] == [FallbackEvent, DeadEvent]


# -- exactly once across crashes -------------------------------------------------------------


async def test_a_crash_right_after_the_switch_resumes_the_fallback_not_the_text(
    graph: tuple[GraphFake, str],
) -> None:
    fake, base = graph
    shared, clock = MemoryKv(), ManualClock()
    dying = crashable(shared)
    dying.crash_after(Write.OUTBOX_FALLBACK)
    first = await _app(_whatsapp(fake, base), [], kv=dying, clock=clock)
    with pytest.raises(SimulatedCrash):
        await first.runtime.send(USER, "hi", idempotency_key="k", fallback=TEMPLATE)
    await first.provider.close()  # the dead process's connections
    assert _sent(fake) == []

    events: list[Any] = []
    fake.closed_windows.clear()  # the text would go now: only the fallback may
    again = await _app(_whatsapp(fake, base), events, kv=shared, clock=clock)
    try:
        await settle(again, passes=3)
        rec = await again.ops.outbox.get("k")
    finally:
        await again.stop()
    assert rec is not None and rec.state == "sent"
    assert [b["type"] for b in _sent(fake)] == ["template"]
    assert events == []  # the switch was announced once, by the first run


async def test_a_crash_after_the_fallback_went_out_is_ambiguous_like_any_send(
    graph: tuple[GraphFake, str],
) -> None:
    fake, base = graph
    shared, clock = MemoryKv(), ManualClock()
    dying = crashable(shared)
    dying.crash_before(Write.OUTBOX_MARK_SENT)  # the template left; its result never recorded
    first = await _app(_whatsapp(fake, base), [], kv=dying, clock=clock)
    with pytest.raises(SimulatedCrash):
        await first.runtime.send(USER, "hi", idempotency_key="k", fallback=TEMPLATE)
    await first.provider.close()  # the dead process's connections
    assert [b["type"] for b in _sent(fake)] == ["template"]

    again = await _app(
        _whatsapp(fake, base), [], kv=shared, clock=clock, outbox={"on_ambiguous": "skip"}
    )
    try:
        await settle(again, passes=3)
        rec = await again.ops.outbox.get("k")
    finally:
        await again.stop()
    assert rec is not None and rec.state == "unknown"
    assert [b["type"] for b in _sent(fake)] == ["template"]  # never the text, never twice


# -- another channel, split texts, bad input ---------------------------------------------------


async def test_a_fallback_through_another_channel_goes_to_its_recipient(
    graph: tuple[GraphFake, str],
) -> None:
    fake, base = graph
    sms = MockProvider("sms")
    events: list[Any] = []
    app = await _app(_whatsapp(fake, base), events, fallbacks={"sms": sms})
    by_sms = Fallback(text="Your order shipped (reply on WhatsApp)", channel="sms", chat_id="+1555")
    try:
        receipt = await app.runtime.send(
            USER, "Your order shipped", idempotency_key="k", fallback=by_sms
        )
    finally:
        await app.stop()
    assert receipt.fallback_key == "k~fallback" and receipt.state == "sent"
    assert [(m.chat_id, m.text) for m in sms.sent] == [
        ("+1555", "Your order shipped (reply on WhatsApp)")
    ]
    assert _sent(fake) == []
    assert events == [FallbackEvent("k", "k~fallback", "OutsideSessionWindowError", "sms")]


async def test_a_fallback_channel_this_runtime_lacks_is_dead_naming_it(
    graph: tuple[GraphFake, str],
) -> None:
    fake, base = graph
    app = await _app(_whatsapp(fake, base), [])
    try:
        with pytest.raises(Exception, match=r"'sms'.*BOTMESH_FALLBACK_PROVIDERS"):
            await app.runtime.send(
                USER, "hi", idempotency_key="k", fallback=Fallback(text="x", channel="sms")
            )
        rec = await app.ops.outbox.get("k")
    finally:
        await app.stop()
    assert rec is not None and rec.state == "dead"


async def test_the_later_parts_of_a_split_text_give_way_to_the_fallback(
    graph: tuple[GraphFake, str],
) -> None:
    fake, base = graph
    events: list[Any] = []
    app = await _app(_whatsapp(fake, base), events)
    text = ("word " * 1000).strip()  # 4999 characters: two parts on WhatsApp
    try:
        receipt = await app.runtime.send(USER, text, idempotency_key="k", fallback=TEMPLATE)
        second = await app.ops.outbox.get("k#2")
    finally:
        await app.stop()
    assert receipt.fallback_key == "k~fallback"
    assert [b["type"] for b in _sent(fake)] == ["template"]
    assert second is not None and second.state == "dead"
    dead = [e for e in events if isinstance(e, DeadEvent)]
    assert [(e.id, e.reason) for e in dead] == [("k#2", Reason.SUPERSEDED_BY_FALLBACK)]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({}, "empty fallback"),
        ({"text": "x", "on": ("NoSuchError",)}, "NoSuchError.*not a send error"),
        ({"text": "x", "on": ()}, "names no error"),
        ({"text": "x", "channel": " "}, "channel must be a non-empty string"),
    ],
)
def test_a_bad_fallback_is_refused_where_it_is_built(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        Fallback(**kwargs)


async def test_a_fallback_that_is_not_a_fallback_is_refused_before_journaling() -> None:
    app = await make_app(MockProvider())
    try:
        with pytest.raises(TypeError, match=r"botmesh\.Fallback"):
            await app.runtime.send("c", "hi", fallback="template")  # type: ignore[arg-type]
        assert await app.ops.outbox.list() == []
    finally:
        await app.stop()


def test_the_fallback_providers_of_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    from botmesh._cli.load import fallbacks_of_env
    from botmesh.state.errors import AppLoadError

    monkeypatch.setenv(
        "BOTMESH_FALLBACK_PROVIDERS", "mock, backup=botmesh.providers.mock:MockProvider"
    )
    found = fallbacks_of_env()
    assert sorted(found) == ["backup", "mock"]
    monkeypatch.setenv("BOTMESH_FALLBACK_PROVIDERS", "mock,mock")
    with pytest.raises(AppLoadError, match="named twice"):
        fallbacks_of_env()
    monkeypatch.setenv("BOTMESH_FALLBACK_PROVIDERS", "x=nowhere")
    with pytest.raises(AppLoadError, match="BOTMESH_FALLBACK_PROVIDERS 'nowhere'"):
        fallbacks_of_env()
