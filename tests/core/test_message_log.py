"""The message log on every journal backend of ``tests/backends.py``: one entry per part the
channel accepted, read per chat newest first, paged, other chats untouched, purged by
retention; and its configuration, its off switch, what it keeps of media, its front door.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import pytest

from botmesh import Bot, Context, DurabilityConfig, Inbound, Media
from botmesh.errors import ConfigError, DurabilityError
from botmesh.journal import DurableKv, Entry, MemoryKv, Op
from botmesh.state.config import MessageLogConfig
from botmesh.state.kv import IndexName
from botmesh.state.message_log import LoggedMessage, MessageLog
from botmesh.testing import ManualClock, MockProvider
from tests.backends import BackendHandle
from tests.kit import App, make_app, policy


async def _app(kv: DurableKv, clock: ManualClock, provider: MockProvider, **options: Any) -> App:
    bot = Bot("log", durability=policy(**options))

    @bot.on_message
    async def handler(ctx: Context) -> None:
        await ctx.reply(f"re {ctx.text} and more")  # 2 parts at text_limit=8
        await ctx.enqueue(ctx.chat_id, "later")

    return await make_app(provider, kv=kv, clock=clock, bot=bot, instance_id="log")


def _rows(logged: Sequence[LoggedMessage]) -> list[tuple[str, str | None, int, int]]:
    return [(m.key, m.text, m.part, m.parts) for m in logged]


async def test_one_entry_per_part_sent_newest_first(backend: BackendHandle) -> None:
    assert backend.kv is not None
    clock, provider = ManualClock(), MockProvider("chan", text_limit=8)
    app = await _app(backend.kv, clock, provider)
    await app.runtime.handle(Inbound(id="m1", chat_id="c", text="hi"))
    clock.advance(5)
    await app.ops.drain()  # "later" goes out now, 5 s after the reply
    await app.runtime.handle(Inbound(id="m2", chat_id="d", text="yo"))  # another chat
    logged = await app.bot.messages("c")
    assert _rows(logged) == [
        ("m1:2", "later", 1, 1),
        ("m1:1#2", "and more", 2, 2),
        ("m1:1", "re hi ", 1, 2),
    ]
    # each entry is the journal's sent record: its key, the channel's id, the inbound
    records = {r.key: r for r in await app.ops.outbox.list() if r.chat_id == "c"}
    assert {m.key: m.message_id for m in logged} == {k: r.message_id for k, r in records.items()}
    assert all(r.state == "sent" for r in records.values())
    assert {m.message_id for m in logged} <= {c.message_id for c in provider.calls}
    assert {(m.chat_id, m.channel, m.inbound_id, m.attempts) for m in logged} == {
        ("c", "chan", "m1", 1)
    }
    assert [m.sent_at for m in logged] == [clock.now()] + [clock.now() - 5] * 2
    assert _rows(await app.bot.messages("d"))[-1] == ("m2:1", "re yo ", 1, 2)
    # a restart on the same data reads the same log; a redelivery logs nothing more
    kv = await backend.reopen()
    again = await _app(kv, clock, provider)
    await again.runtime.handle(Inbound(id="m1", chat_id="c", text="hi"))
    await again.ops.drain()
    assert _rows(await again.bot.messages("c")) == _rows(logged)


async def test_paging_and_chats_apart(backend: BackendHandle) -> None:
    assert backend.kv is not None
    clock, provider = ManualClock(), MockProvider()
    app = await _app(backend.kv, clock, provider)
    # "a/b" would reach into "a"'s log without the encoding; "ab" shares its first letter
    for chat, count in (("a", 5), ("a/b", 2), ("ab", 1)):
        for i in range(count):
            clock.advance(1)
            await app.runtime.send(chat, f"{chat} {i}", idempotency_key=f"{chat}-{i}")
    first = await app.bot.messages("a", limit=2)
    assert [m.text for m in first] == ["a 4", "a 3"]
    second = await app.bot.messages("a", limit=2, before=first[-1])
    assert [m.text for m in second] == ["a 2", "a 1"]
    third = await app.bot.messages("a", limit=2, before=second[-1])
    assert [m.text for m in third] == ["a 0"]
    assert await app.bot.messages("a", limit=2, before=third[-1]) == []
    # before a time: what was sent strictly earlier
    assert [m.text for m in await app.bot.messages("a", before=second[0].sent_at)] == [
        "a 1",
        "a 0",
    ]
    assert [m.text for m in await app.bot.messages("a/b")] == ["a/b 1", "a/b 0"]
    assert [m.text for m in await app.bot.messages("ab")] == ["ab 0"]
    assert await app.bot.messages("nobody") == []
    assert await app.bot.messages("a", limit=0) == []


async def test_retention_purges_entries_on_the_log_s_own_schedule(
    backend: BackendHandle,
) -> None:
    assert backend.kv is not None
    clock, provider = ManualClock(), MockProvider()
    app = await _app(backend.kv, clock, provider, retention="1d", message_log={"retention": "1h"})
    await app.runtime.send("c", "one", idempotency_key="k1")
    clock.advance(1800)
    await app.runtime.send("c", "two", idempotency_key="k2")
    clock.advance(1801)  # "one" is past the log's hour, "two" is not
    await app.ops.sweep_once()
    assert [m.text for m in await app.bot.messages("c")] == ["two"]
    assert {r.key for r in await app.ops.outbox.list()} == {"k1", "k2"}  # kept for a day
    clock.advance(1800)
    await app.ops.sweep_once()
    assert await app.bot.messages("c") == []
    assert len(await app.ops.outbox.list()) == 2


async def test_a_log_retention_of_zero_keeps_entries_after_the_journal_purge(
    backend: BackendHandle,
) -> None:
    assert backend.kv is not None
    clock, provider = ManualClock(), MockProvider()
    app = await _app(backend.kv, clock, provider, retention="1h", message_log={"retention": 0})
    await app.runtime.send("c", "kept", idempotency_key="k1")
    clock.advance(7200)
    assert await app.ops.sweep_once() >= 1  # the outbox record goes
    assert await app.ops.outbox.list() == []
    assert [m.text for m in await app.bot.messages("c")] == ["kept"]


async def test_the_default_retention_is_the_journal_s() -> None:
    clock, provider = ManualClock(), MockProvider()
    app = await make_app(provider, clock=clock, retention="2h")
    await app.runtime.send("c", "x", idempotency_key="k")
    clock.advance(7199)
    await app.ops.sweep_once()
    assert len(await app.bot.messages("c")) == 1
    clock.advance(2)
    await app.ops.sweep_once()
    assert await app.bot.messages("c") == [] and await app.ops.outbox.list() == []


class CountingKv(MemoryKv):
    """A memory journal that records the prefixes scanned and the ranges asked."""

    def __init__(self) -> None:
        super().__init__()
        self.scans: list[str] = []
        self.ranges: list[tuple[str, str]] = []
        self.commits: list[tuple[str, list[str]]] = []

    async def scan(self, prefix: str) -> list[Entry]:
        self.scans.append(prefix)
        return await super().scan(prefix)

    async def range(
        self, index: IndexName, prefix: str, until: float, limit: int = 100
    ) -> list[str]:
        self.ranges.append((index, prefix))
        return await super().range(index, prefix, until, limit)

    async def commit(self, ops: Sequence[Op], *, label: str = "") -> list[int]:
        self.commits.append((label, [op.key for op in ops]))
        return await super().commit(ops, label=label)


async def test_the_entry_rides_in_the_sent_commit_and_history_reads_one_chat() -> None:
    kv = CountingKv()
    app = await make_app(MockProvider(), kv=kv, bot_id="b")
    await app.runtime.send("c", "hi", idempotency_key="k")
    scope = app.bot.scope
    [sent] = [keys for label, keys in kv.commits if label == "outbox.mark_sent"]
    # the entry first: a commit cut between them (two changelog records on Kafka) leaves
    # the entry, which the recovery reads as the send's record (a channel without status
    # webhooks: no name under the message id, botmesh.state.statuses)
    assert sent[1] == f"{scope}/out/k" and len(sent) == 2
    assert sent[0].startswith(f"{scope}/log/c/")
    assert not [label for label, keys in kv.commits if any("/log/" in k for k in keys)][1:]
    kv.scans.clear()
    assert len(await app.bot.messages("c")) == 1
    assert kv.scans == [f"{scope}/log/c/"]  # the chat's prefix, nothing wider


async def test_off_logs_nothing_and_texts_off_keeps_the_rest() -> None:
    off = await make_app(MockProvider(), message_log={"enabled": False})
    await off.runtime.send("c", "hi", idempotency_key="k")
    assert await off.bot.messages("c") == []
    assert (await off.ops.outbox.get("k")) is not None
    quiet = await make_app(MockProvider(), message_log={"texts": False})
    await quiet.runtime.send("c", "secret words", idempotency_key="k")
    [m] = await quiet.bot.messages("c")
    assert (m.key, m.text, m.message_id) == ("k", None, "mock-1")


async def test_media_is_summarised_never_its_bytes_nor_its_url() -> None:
    kv = MemoryKv()
    app = await make_app(MockProvider(), kv=kv)
    url = "https://files.example/v1/photo.jpg?X-Amz-Signature=s3cr3t-token"
    await app.runtime.send("c", "look", media=Media(url=url, mime="image/jpeg"))
    app.clock.advance(1)
    await app.runtime.send(
        "c", None, media=Media(data=b"\x89PNG" * 100, mime="image/png", name="chart.png")
    )
    app.clock.advance(1)
    await app.runtime.send("c", None, media=Media(path="/srv/docs/report.pdf"))
    logged = await app.bot.messages("c")
    summaries = [m.media for m in reversed(logged)]
    assert [(s.kind, s.mime, s.name, s.size) for s in summaries if s is not None] == [
        ("url", "image/jpeg", "photo.jpg", None),
        ("data", "image/png", "chart.png", 400),
        ("path", None, "report.pdf", None),
    ]
    raw = json.dumps([e.value for e in await kv.scan(app.engine.keys.log)])
    assert "s3cr3t" not in raw and "X-Amz" not in raw and "iVBOR" not in raw  # no base64 PNG


async def test_the_front_door() -> None:
    bot = Bot("front")
    with pytest.raises(DurabilityError, match=r"botmesh\.run"):
        await bot.messages("c")
    unjournaled = bot.bind(MockProvider(), None)
    async with unjournaled:
        with pytest.raises(DurabilityError, match="journal"):
            await bot.messages("c")
    app = await make_app(MockProvider(), bot=Bot("front", durability=policy()))
    assert isinstance(app.engine.messages, MessageLog)
    await app.runtime.send("c", "x", idempotency_key="k")
    with pytest.raises(ValueError, match="limit"):
        await app.bot.messages("c", limit=-1)
    with pytest.raises(TypeError, match="LoggedMessage"):
        await app.bot.messages("c", before="k")  # type: ignore[arg-type]
    await app.stop()


def test_the_configuration() -> None:
    assert DurabilityConfig().message_log == MessageLogConfig()
    assert DurabilityConfig.of({"retention": "3d"}).message_log_retention == 3 * 86400
    config = DurabilityConfig.of(
        {"retention": "3d", "message_log": {"retention": "30d", "texts": False, "enabled": False}}
    )
    assert config.message_log == MessageLogConfig(enabled=False, retention=30 * 86400, texts=False)
    assert config.message_log_retention == 30 * 86400
    assert DurabilityConfig.of({"message_log": {"retention": 0}}).message_log_retention == 0
    with pytest.raises(ConfigError, match=r"message_log\.keep"):
        DurabilityConfig.of({"message_log": {"keep": True}})
    with pytest.raises(ConfigError, match=r"message_log\.retention"):
        DurabilityConfig.of({"message_log": {"retention": 5}})
    with pytest.raises(ConfigError, match=r"message_log\.texts"):
        DurabilityConfig.of({"message_log": {"texts": "no"}})


async def test_the_console_timeline_shows_a_chat_s_log_from_the_changelog() -> None:
    # the journal's records as the worker's changelog carries them (encode_entry), fed to
    # the console's index: the chat's log comes back in time order, texts hidden unless asked
    from botmesh.console.index import Index
    from botmesh.console.pages import View, timeline
    from botmesh.streams.journal_db import encode_entry
    from botmesh.streams.ops.tail import Record
    from botmesh.topics import Catalog

    kv = MemoryKv()
    app = await make_app(MockProvider(text_limit=8), kv=kv)
    await app.runtime.send("c", "secret words here", idempotency_key="k1")
    app.clock.advance(1)
    await app.runtime.send("other", "elsewhere", idempotency_key="k2")
    cat = Catalog("bm")
    topic = cat.changelog("journal")
    records = [
        Record(topic, 0, n, 0.0, e.key.encode(), encode_entry(e))
        for n, e in enumerate(await kv.scan(""))
    ]
    index = Index(cat)
    index.apply(records)
    found = index.timeline("c")
    assert found.messages == tuple(reversed(await app.bot.messages("c")))
    assert [m.key for m in found.messages] == ["k1", "k1#2", "k1#3"]
    hidden = timeline(View("bm", None, None, None, show_texts=False), "c", found)
    assert hidden.count('data-testid="logged-message"') == 3 and "secret" not in hidden
    shown = timeline(View("bm", None, None, None, show_texts=True), "c", found)
    assert "secret " in shown and "mock-1" in shown
    # retention deletes an entry: its tombstone leaves the index
    log_keys = [r.key for r in records if r.key is not None and b"/log/c/" in r.key]
    index.apply([Record(topic, 0, 99, 0.0, log_keys[0], None)])
    assert [m.key for m in index.timeline("c").messages] == ["k1#2", "k1#3"]


def test_built_directly_it_runs_the_same_checks() -> None:
    assert MessageLogConfig(retention="2h").retention == 7200  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"message_log\.retention"):
        MessageLogConfig(retention=-1)
    with pytest.raises(ConfigError, match=r"message_log\.enabled"):
        MessageLogConfig(enabled="yes")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="message_log"):
        DurabilityConfig(message_log={"texts": False})  # type: ignore[arg-type]
