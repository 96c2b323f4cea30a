"""The Bot / Runtime / Context API: lifecycle, journals by URL, instance ids, typed
listeners and the send hooks."""

from __future__ import annotations

import socket
from collections.abc import Callable
from pathlib import Path

import pytest

import botmesh
import botmesh.state.backends
from botmesh import Bot, Context, DeadEvent, Inbound, Outbound, Receipt, Runtime, SentEvent
from botmesh.errors import ConfigError, DurabilityError, UnsupportedContentError
from botmesh.journal import FileKv, MemoryKv, open_backend
from botmesh.state.backends import register_backend, schemes
from botmesh.testing import MockProvider
from tests.kit import make_app, texts


async def test_journals_by_url(tmp_path: Path) -> None:
    assert {"memory", "file"} <= set(schemes())
    kv = await open_backend("memory://")
    assert isinstance(kv, MemoryKv)
    fkv = await open_backend(f"file://{tmp_path}/j?append_log=1")
    assert isinstance(fkv, FileKv)
    await fkv.close()
    url = f"file://{tmp_path}/bot"
    async with botmesh.run(Bot("bot", durability={"poll": 0}), MockProvider(), journal=url) as a:
        await a.handle(Inbound(id="m", chat_id="c"))
    async with botmesh.run(Bot("bot", durability={"poll": 0}), MockProvider(), journal=url) as b:
        ops = b.durability
        assert ops is not None
        assert [r.id for r in await ops.inbox.list()] == ["m"]


async def test_bad_urls_name_the_fix(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigError, match="unknown journal scheme 'nosuch://'"):
        await open_backend("nosuch://x")
    with pytest.raises(ConfigError, match="not a URL"):
        await open_backend("/just/a/path")
    monkeypatch.setattr(botmesh.state.backends, "_REGISTRY", dict(botmesh.state.backends._REGISTRY))
    register_backend(
        "fancy",
        "botmesh_fancy_backend_missing:open",
        "botmesh_fancy_backend_missing:check",
        install="pip install 'botmesh[fancy]'",
    )
    with pytest.raises(ConfigError, match=r"pip install 'botmesh\[fancy\]'"):
        await open_backend("fancy://host")
    with pytest.raises(ConfigError, match=r"pip install 'botmesh\[fancy\]'"):
        botmesh.run(Bot("b"), MockProvider(), journal="fancy://host")
    with pytest.raises(ConfigError) as info:
        await open_backend(f"file://{tmp_path}/j?appendlog=1")
    assert "journal" in info.value.field and "appendlog" in info.value.field


async def test_handle_before_start_or_after_stop_is_a_clear_error() -> None:
    for journal in ("memory://", None):
        app = botmesh.run(Bot("b"), MockProvider(), journal=journal)
        with pytest.raises(DurabilityError, match="not running") as info:
            await app.handle(Inbound(id="m", chat_id="c"))
        assert "botmesh.run(bot, provider)" in str(info.value)
        with pytest.raises(DurabilityError, match="not running"):
            await app.send("c", "x")
        await app.start()
        await app.handle(Inbound(id="m", chat_id="c"))
        await app.stop()
        with pytest.raises(DurabilityError, match="not running"):
            await app.handle(Inbound(id="m2", chat_id="c"))


def test_a_runtime_refuses_what_is_not_a_provider_or_an_instance_id() -> None:
    with pytest.raises(ConfigError) as info:
        botmesh.run(Bot("b"), object())  # type: ignore[arg-type]
    assert info.value.field == "provider" and "lacks name, text_limit, send" in str(info.value)
    with pytest.raises(ConfigError) as info:
        botmesh.run(Bot("b"), MockProvider(), instance_id=" ")
    assert info.value.field == "instance_id"
    with pytest.raises(ConfigError) as info:
        botmesh.run(Bot("b"), MockProvider(), journal=42)  # type: ignore[arg-type]
    assert info.value.field == "journal"


def test_a_misspelt_option_is_refused_by_its_name_on_every_way_in() -> None:
    """The options are spelled once (``RuntimeOptions``) and taken as ``**options``: a
    keyword that is not one of them is a ``TypeError`` naming it, never dropped."""
    bot, provider = Bot("b"), MockProvider()
    ways: list[Callable[[], object]] = [
        lambda: botmesh.run(bot, provider, instanse_id="host-1"),  # type: ignore[call-arg]
        lambda: bot.bind(provider, "memory://", instanse_id="host-1"),  # type: ignore[call-arg]
        lambda: Runtime(bot, provider, "memory://", instanse_id="host-1"),  # type: ignore[call-arg]
    ]
    for way in ways:
        with pytest.raises(TypeError, match=r"unknown option 'instanse_id'.*instance_id"):
            way()
    assert botmesh.run(bot, provider, instance_id="host-1").instance_id == "host-1"


class SharedKv(MemoryKv):
    """A journal other hosts share (as Postgres or Redis would be)."""

    shared = True


async def test_default_instance_id() -> None:
    bot = Bot("helper", connection_id="wa-1")
    async with botmesh.run(bot, MockProvider()) as app:
        assert app.instance_id == f"{socket.gethostname()}/helper/wa-1"
    shared = SharedKv()
    ids = []
    for _ in range(2):
        async with Bot("helper").bind(MockProvider(), shared) as app:
            ids.append(app.instance_id)
    i1, i2 = ids
    assert i1 is not None and i1.startswith(f"{socket.gethostname()}/helper/default/")
    assert i1 != i2  # a per-boot suffix: two processes on one host never share it
    async with Bot("helper").bind(MockProvider(), shared, instance_id="pod-0") as app:
        assert app.instance_id == "pod-0"


async def test_typed_listeners() -> None:
    bot = Bot("b", durability={"poll": 0})
    dead: list[DeadEvent] = []
    sent: list[SentEvent] = []
    awaited: list[str] = []
    assert bot.on(DeadEvent, dead.append) == dead.append

    @bot.on(SentEvent)
    def on_sent(event: SentEvent) -> None:
        sent.append(event)

    @bot.on(SentEvent)
    async def on_sent_async(event: SentEvent) -> None:
        awaited.append(event.receipt.key)

    @bot.on(SentEvent)
    def broken(event: SentEvent) -> None:
        raise RuntimeError("a listener that fails is logged, never breaks the send")

    app = await make_app(bot=bot)
    receipt = await app.runtime.send("c", "hello", idempotency_key="k")
    app.provider.fail_next(UnsupportedContentError("no"))
    with pytest.raises(UnsupportedContentError):
        await app.runtime.send("c", "refused", idempotency_key="d")
    assert [(e.receipt, e.background) for e in sent] == [(receipt, False)]
    assert awaited == ["k"]
    assert [(e.kind, e.id) for e in dead] == [("outbox", "d")]


@pytest.mark.parametrize("event", ["sent", "durability:dead", Exception, Receipt])
def test_listening_to_anything_but_an_event_class_is_refused(event: object) -> None:
    with pytest.raises(
        TypeError, match="SentEvent, DeadEvent, AmbiguousEvent, FallbackEvent, ErrorEvent, Fl"
    ):
        Bot("b").on(event, print)  # type: ignore[call-overload]


async def test_send_hooks_run_once_per_send_before_the_journal_and_after_each_part() -> None:
    bot = Bot("b", durability={"poll": 0})
    before: list[str | None] = []
    after: list[tuple[str, int]] = []

    @bot.before_send
    def stamp(m: Outbound) -> Outbound:
        before.append(m.text)
        return Outbound(m.chat_id, f"{m.text}!")

    @bot.before_send
    async def keep(m: Outbound) -> None:  # None keeps the message as it is
        before.append(m.text)

    bot.after_send(lambda r: after.append((r.key, r.part)))

    @bot.on_message
    async def handler(ctx: Context) -> None:
        await ctx.reply("abcd efgh")

    app = await make_app(MockProvider(text_limit=5), bot=bot)
    await app.runtime.handle(Inbound(id="m", chat_id="c"))
    assert before == ["abcd efgh", "abcd efgh!"]  # once per send, before the split
    assert texts(app.provider) == ["abcd ", "efgh!"]
    assert after == [("m:1", 1), ("m:1#2", 2)]  # after each part went out
    rec = await app.ops.outbox.get("m:1#2")
    assert rec is not None and rec.payload["text"] == "efgh!"  # the journal holds the result


async def test_enqueue_runs_the_hooks_once_and_the_sweeper_delivers() -> None:
    bot = Bot("b", durability={"poll": 0})
    before: list[str] = []
    after: list[str] = []
    sent: list[str] = []

    def stamp(m: Outbound) -> Outbound:
        before.append(m.text or "")
        return Outbound(m.chat_id, (m.text or "") + "!")

    bot.before_send(stamp)
    bot.after_send(lambda r: after.append(r.key))
    bot.on(SentEvent, lambda e: sent.append(e.receipt.key))
    app = await make_app(bot=bot)
    key = await app.runtime.enqueue("c", "reminder", idempotency_key="reminder:1")
    assert key == "reminder:1" and app.provider.sent == [] and before == ["reminder"]
    assert await app.runtime.enqueue("c", "reminder", idempotency_key="reminder:1") == key
    await app.ops.drain()
    assert texts(app.provider) == ["reminder!"]
    assert after == ["reminder:1"] and sent == ["reminder:1"]
    assert before == ["reminder", "reminder"]  # hooks ran at enqueue, never at delivery


async def test_a_send_needs_text_or_media() -> None:
    app = await make_app()
    with pytest.raises(ValueError, match="text or media"):
        await app.runtime.send("c")
    with pytest.raises(ValueError, match="text or media"):
        await app.runtime.enqueue("c")
    assert app.provider.calls == [] and await app.ops.outbox.list() == []


async def test_the_instance_id_is_known_before_start() -> None:
    bot = Bot("hd", connection_id="wa")
    app = botmesh.run(bot, MockProvider())
    assert app.instance_id == f"{socket.gethostname()}/hd/wa"  # what the worker needs early
    async with app:
        assert app.durability is not None
        assert app.durability.instance_id == app.instance_id
    given = botmesh.run(bot, MockProvider(), instance_id="hd-0")
    assert given.instance_id == "hd-0"


async def test_flush_receipts_records_what_the_sink_acknowledged() -> None:
    from tests.kit import ListSink

    sink = ListSink(hold=True)
    app = await make_app(reply="hello", receipts=sink)
    await app.runtime.handle(Inbound(id="m", chat_id="c"))
    [record] = await app.ops.outbox.list()
    assert not record.published  # handed to the sink, not acknowledged yet
    for ack in sink.acks:
        ack.set_result(None)
    assert await app.runtime.flush_receipts() == 1
    [record] = await app.ops.outbox.list()
    assert record.published and sink.keys("sent") == ["m:1"]
    plain = botmesh.run(Bot("p"), MockProvider(), journal=None)
    async with plain:
        assert await plain.flush_receipts() == 0  # no journal, no sink: nothing to record
    await app.stop()


async def test_quiesce_stops_the_sweeper_and_records_the_receipts_first() -> None:
    """What the Kafka worker does before it hands its partitions over: no background pass
    after it, and the receipts acknowledged so far recorded published."""
    from tests.kit import ListSink

    sink = ListSink(hold=True)
    app = await make_app(reply="hello", receipts=sink, poll="50ms")
    await app.runtime.handle(Inbound(id="m", chat_id="c"))
    assert app.engine.scheduler._task is not None  # the sweeper runs
    for ack in sink.acks:
        ack.set_result(None)
    assert await app.runtime.quiesce() == 1
    assert app.engine.scheduler._task is None
    [record] = await app.ops.outbox.list()
    assert record.published
    await app.stop()  # still stops cleanly after it


def test_a_fenced_holder_is_never_retried() -> None:
    from botmesh.errors import FencedError, Reason
    from botmesh.state.backoff import GiveUp

    decision = Bot("x").config.inbox.retry_policy().decide(FencedError("k", 1, 2), 1)
    assert decision == GiveUp(Reason.HANDLE_FAILED)
