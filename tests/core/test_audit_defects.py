"""Defects of issue 37, found through the public API, each pinned by its repro.

E1: an explicit key ending in ``~fallback`` (the suffix of a fallback's key) made a send's
fallback a duplicate of that other send at a channel that dedupes by key.
E2: a fallback's text was not split to its channel's limit.
E3: a retryable error named in ``Fallback.on`` switched only once the retries were spent.
E4: a lone surrogate in a text was an outage on sqlite, accepted elsewhere, and a raw
``UnicodeEncodeError`` in a handler's reply.
E6: a config file that is not UTF-8 was refused without naming the file.
E7: a non-string ``instance_id`` and non-mapping send ``options`` raised ``AttributeError``.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

import botmesh
from botmesh import Bot, Context, ErrorEvent, Fallback, Inbound, Media
from botmesh.errors import BadRecord, ConfigError
from botmesh.journal import DurableKv, MemoryKv, Write
from botmesh.settings import apply_config_file, read_config_file, resolve_secret_files
from botmesh.state.errors import (
    InvalidKeyError,
    OutsideSessionWindowError,
    RateLimitedError,
    SendDeferredError,
)
from botmesh.state.messages import Outbound, SendResult
from botmesh.testing import ManualClock, MockProvider, SimulatedCrash, crashable
from tests.kit import App, make_app, policy, settle, texts


class KeyedChannel(MockProvider):
    """A channel that deduplicates by the send's key, as Discord's nonce, an email's
    Message-ID or Baileys do: a key it saw answers with that message's id, nothing sent."""

    def __init__(self, name: str = "keyed", **kwargs: Any) -> None:
        super().__init__(name, **kwargs)
        self.by_key: dict[str, str] = {}

    async def send_keyed(self, message: Outbound, key: str) -> SendResult:
        if key in self.by_key:
            return SendResult(self.by_key[key])
        result = await self.send(message)
        self.by_key[key] = result.message_id
        return result


class Logged(MockProvider):
    """A channel that also notes each text it took in a list shared with another."""

    def __init__(self, name: str, log: list[str | None], **kwargs: Any) -> None:
        super().__init__(name, **kwargs)
        self.log = log

    async def send(self, message: Outbound) -> SendResult:
        result = await super().send(message)
        self.log.append(message.text)
        return result


async def _with_fallbacks(
    provider: Any,
    fallbacks: dict[str, Any],
    *,
    kv: DurableKv | None = None,
    clock: ManualClock | None = None,
    **options: Any,
) -> App:
    clock = clock or ManualClock()
    kv = kv if kv is not None else MemoryKv()
    bot = Bot("bot", durability=policy(**options))
    runtime = bot.bind(
        provider, kv, instance_id="i1", clock=clock, rng=random.Random(7), fallbacks=fallbacks
    )
    await runtime.start()
    return App(runtime, bot, provider, clock, kv)


# -- E1: explicit keys in the reserved forms --------------------------------------------------


@pytest.mark.parametrize("key", ["inv:7~fallback", "a~fallback~fallback", "inv:7#2", "x#fallback"])
async def test_an_explicit_key_in_a_reserved_form_is_refused_naming_it(key: str) -> None:
    app = await make_app(KeyedChannel())
    try:
        for call in (app.runtime.send, app.runtime.enqueue):
            with pytest.raises(InvalidKeyError) as info:
                await call("c", "first", idempotency_key=key)
            assert info.value.key == key and repr(key) in str(info.value)
        assert await app.ops.outbox.list() == []
    finally:
        await app.stop()


async def test_a_fallback_is_never_taken_for_another_send_with_its_key() -> None:
    channel = KeyedChannel()
    app = await make_app(channel)
    try:
        with pytest.raises(InvalidKeyError, match="~fallback"):
            await app.runtime.send("c", "first", idempotency_key="inv:7~fallback")
        await app.runtime.send("c", "other", idempotency_key="inv:7x~fallbac")  # not reserved
        channel.fail_next(OutsideSessionWindowError("closed"))
        receipt = await app.runtime.send(
            "c", "second", idempotency_key="inv:7", fallback=Fallback(text="instead")
        )
    finally:
        await app.stop()
    assert receipt.fallback_key == "inv:7~fallback"
    assert texts(channel) == ["other", "instead"]


async def test_a_reply_with_a_reserved_key_is_refused_in_the_handler() -> None:
    bot = Bot("bot", durability=policy())
    errors: list[BaseException] = []

    @bot.on_message
    async def handler(ctx: Context) -> None:
        await ctx.reply("x", idempotency_key="m:1~fallback")

    bot.on(ErrorEvent, lambda e: errors.append(e.error))
    app = await make_app(bot=bot)
    try:
        await app.runtime.handle(Inbound(id="m", chat_id="c", text="hi"))
    finally:
        await app.stop()
    assert [type(e) for e in errors] == [InvalidKeyError]
    assert app.provider.sent == []


# -- E2: a fallback's text is split to its channel's limit ------------------------------------

LONG = " ".join(f"word{i:03d}" for i in range(62)) + " end"  # 499 characters


async def test_a_fallback_text_is_split_to_its_channel_s_limit() -> None:
    assert len(LONG) == 499
    main, sms = MockProvider("wa"), MockProvider("sms", text_limit=160)
    main.fail_chat("c", OutsideSessionWindowError("closed"))
    app = await _with_fallbacks(main, {"sms": sms})
    try:
        receipt = await app.runtime.send(
            "c", "hi", idempotency_key="k", fallback=Fallback(text=LONG, channel="sms")
        )
        parts = texts(sms)  # every part went out inline, in order, before send returned
        records = {r.key: r.state for r in await app.ops.outbox.list()}
    finally:
        await app.stop()
    assert receipt.fallback_key == "k~fallback"
    assert len(parts) == 4 and all(len(t or "") <= 160 for t in parts), parts
    assert " ".join(t or "" for t in parts).split() == LONG.split()
    assert records == dict.fromkeys(["k", "k~fallback#2", "k~fallback#3", "k~fallback#4"], "sent")


async def test_the_message_log_shows_each_part_of_a_split_fallback() -> None:
    main, sms = MockProvider("wa", text_limit=300), MockProvider("sms", text_limit=160)
    main.fail_chat("c", OutsideSessionWindowError("closed"))
    app = await _with_fallbacks(main, {"sms": sms})
    try:
        await app.runtime.send(
            "c", LONG, idempotency_key="k", fallback=Fallback(text=LONG, channel="sms")
        )
        logged = sorted(await app.bot.messages("c"), key=lambda m: m.part)
    finally:
        await app.stop()
    assert [(m.key, m.part, m.parts, m.fallback_key, m.channel) for m in logged] == [
        ("k", 1, 4, "k~fallback", "sms"),
        *((f"k~fallback#{n}", n, 4, f"k~fallback#{n}", "sms") for n in (2, 3, 4)),
    ]


async def test_the_split_fallback_of_an_enqueued_split_send_supersedes_its_parts() -> None:
    main, sms = MockProvider("wa", text_limit=200), MockProvider("sms", text_limit=160)
    main.fail_chat("c", OutsideSessionWindowError("closed"))
    app = await _with_fallbacks(main, {"sms": sms})
    try:
        await app.runtime.enqueue(
            "c", LONG, idempotency_key="k", fallback=Fallback(text=LONG, channel="sms")
        )
        await settle(app, passes=8)
        records = {r.key: r for r in await app.ops.outbox.list()}
    finally:
        await app.stop()
    assert main.sent == []
    assert " ".join(t or "" for t in texts(sms)).split() == LONG.split()
    sent = sorted(k for k, r in records.items() if r.state == "sent")
    assert sent == ["k", "k~fallback#2", "k~fallback#3", "k~fallback#4"]
    assert {records["k#2"].state, records["k#3"].state} == {"dead"}


async def test_a_send_to_the_chat_waits_behind_every_part_of_a_retried_fallback() -> None:
    both: list[str | None] = []
    main, sms = Logged("wa", both), Logged("sms", both, text_limit=160)
    main.fail_next(OutsideSessionWindowError("closed"))
    sms.fail_next(RateLimitedError("slow down", retry_after=120.0))  # past inline_max
    app = await _with_fallbacks(main, {"sms": sms})
    try:
        with pytest.raises(SendDeferredError):
            await app.runtime.send(
                "c", "hi", idempotency_key="k", fallback=Fallback(text=LONG, channel="sms")
            )
        later = await app.runtime.send("c", "next", idempotency_key="a")
        await settle(app, passes=8, step=130.0)
    finally:
        await app.stop()
    assert later.state == "pending"  # behind the fallback's last part, not its first
    assert len(both) == 5 and both[-1] == "next", both


async def test_a_crash_right_after_a_split_switch_sends_every_part_once() -> None:
    main, sms = MockProvider("wa"), MockProvider("sms", text_limit=160)
    main.fail_chat("c", OutsideSessionWindowError("closed"))
    shared, clock = MemoryKv(), ManualClock()
    dying = crashable(shared)
    dying.crash_after(Write.OUTBOX_FALLBACK)
    bot = Bot("bot", durability=policy())
    first = bot.bind(main, dying, instance_id="i1", clock=clock, fallbacks={"sms": sms})
    await first.start()
    with pytest.raises(SimulatedCrash):
        await first.send(
            "c", "hi", idempotency_key="k", fallback=Fallback(text=LONG, channel="sms")
        )
    assert sms.sent == []

    again = await _with_fallbacks(main, {"sms": sms}, kv=shared, clock=clock)
    try:
        await settle(again, passes=6)
        states = {r.key: r.state for r in await again.ops.outbox.list()}
    finally:
        await again.stop()
    assert " ".join(t or "" for t in texts(sms)).split() == LONG.split()
    assert states == dict.fromkeys(["k", "k~fallback#2", "k~fallback#3", "k~fallback#4"], "sent")


# -- E3: a retryable error named in Fallback.on switches at once ----------------------------


async def test_a_retryable_error_named_in_on_switches_on_the_attempt_that_failed() -> None:
    main, sms = MockProvider("wa"), MockProvider("sms")
    main.fail_chat("c", RateLimitedError("slow down", retry_after=1.0))
    app = await _with_fallbacks(main, {"sms": sms})
    fallback = Fallback(text="instead", channel="sms", on=("RateLimitedError",))
    try:
        receipt = await app.runtime.send("c", "hi", idempotency_key="k", fallback=fallback)
    finally:
        await app.stop()
    assert len(main.calls) == 1
    assert texts(sms) == ["instead"] and receipt.fallback_key == "k~fallback"


# -- E4: lone surrogates are refused at the front door --------------------------------------


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"text": "a\ud800b"}, "text"),
        ({"sender": "\udfff"}, "sender"),
        ({"id": "m\ud800"}, "id"),
        ({"chat_id": "c\ud800"}, "chat_id"),
        ({"data": {"k": ["ok", "\ud800"]}}, "data.k[1]"),
        ({"data": {"\ud800": 1}}, "data"),
        ({"media": Media(url="https://x/\ud800")}, "media.url"),
    ],
)
def test_an_inbound_with_a_lone_surrogate_is_refused_naming_the_field(
    fields: dict[str, Any], field: str
) -> None:
    base: dict[str, Any] = {"id": "m", "chat_id": "c", **fields}
    with pytest.raises(BadRecord) as info:
        Inbound(**base)
    assert info.value.field == field
    assert "surrogate" in str(info.value) and "UTF-8" in str(info.value)


async def test_handle_refuses_a_lone_surrogate_as_a_bad_record_on_every_backend(
    backend: Any,
) -> None:
    """The repro built the inbound with ``msgspec.structs.replace``-free code paths too: a
    decoded inbound (the wire) is refused the same way, before any journal sees it."""
    bot = Bot("bot", durability=policy())
    runtime = bot.bind(MockProvider(), backend.kv, instance_id="i1", clock=ManualClock())
    await runtime.start()
    try:
        with pytest.raises(BadRecord) as info:
            await runtime.handle(Inbound(id="m", chat_id="c", text="\ud800"))
        assert info.value.field == "text"
    finally:
        await runtime.stop()


@pytest.mark.parametrize(
    ("args", "opts", "field"),
    [
        (("c", "a\ud800"), {}, "text"),
        (("c", "x"), {"options": {"caption": "\ud800"}}, "options.caption"),
        (("c", "x"), {"fallback": None, "media": Media(path="/tmp/\ud800")}, "media.path"),
    ],
)
async def test_a_send_holding_a_lone_surrogate_is_refused_naming_the_field(
    args: tuple[Any, ...], opts: dict[str, Any], field: str
) -> None:
    app = await make_app()
    try:
        for call in (app.runtime.send, app.runtime.enqueue):
            with pytest.raises(BadRecord) as info:
                await call(*args, **opts)
            assert info.value.field == field
        assert await app.ops.outbox.list() == []
    finally:
        await app.stop()


def test_a_fallback_holding_a_lone_surrogate_is_refused_naming_the_field() -> None:
    with pytest.raises(BadRecord) as info:
        Fallback(text="\ud800")
    assert info.value.field == "fallback.text"


async def test_a_reply_holding_a_lone_surrogate_raises_bad_record_in_the_handler() -> None:
    bot = Bot("bot", durability=policy())
    errors: list[BaseException] = []

    @bot.on_message
    async def handler(ctx: Context) -> None:
        await ctx.reply("bad \ud83d text")

    bot.on(ErrorEvent, lambda e: errors.append(e.error))
    app = await make_app(bot=bot)
    try:
        await app.runtime.handle(Inbound(id="m", chat_id="c", text="hi"))
    finally:
        await app.stop()
    assert [type(e) for e in errors] == [BadRecord]
    assert isinstance(errors[0], BadRecord) and errors[0].field == "text"
    assert app.provider.sent == []


# -- E6: a config file that is not UTF-8 ------------------------------------------------------


def test_a_config_file_that_is_not_utf8_is_refused_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "botmesh.toml"
    path.write_bytes(b'[kafka]\nbootstrap_servers = "caf\xe9:9092"\n')
    for read in (read_config_file, lambda p: apply_config_file(p, {})):
        with pytest.raises(ValueError, match="not UTF-8") as info:
            read(path)
        assert str(path) in str(info.value) and "save it as UTF-8" in str(info.value)


def test_a_secret_file_that_is_not_utf8_is_refused_naming_its_variable(tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_bytes(b"\xff\xfe")
    env = {"TELEGRAM_BOT_TOKEN_FILE": str(path)}
    with pytest.raises(ValueError, match="TELEGRAM_BOT_TOKEN_FILE") as info:
        resolve_secret_files(env)
    assert "UTF-8" in str(info.value)


# -- E7: wrong types at the front door --------------------------------------------------------


@pytest.mark.parametrize("instance_id", [123, b"i1", ["i1"]])
def test_a_non_string_instance_id_is_a_config_error(instance_id: Any) -> None:
    with pytest.raises(ConfigError) as info:
        botmesh.run(Bot("bot"), MockProvider(), instance_id=instance_id)
    assert info.value.field == "instance_id" and type(instance_id).__name__ in str(info.value)


@pytest.mark.parametrize("options", [["a"], "parse_mode", 5])
async def test_send_options_that_are_not_a_mapping_are_a_bad_record(options: Any) -> None:
    app = await make_app()
    try:
        for call in (app.runtime.send, app.runtime.enqueue):
            with pytest.raises(BadRecord) as info:
                await call("c", "x", options=options)
            assert info.value.field == "options" and "dict" in str(info.value)
        assert await app.ops.outbox.list() == []
    finally:
        await app.stop()
