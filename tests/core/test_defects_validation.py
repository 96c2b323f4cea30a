"""Records built in code are checked at the door (defect 1 of the audit).

msgspec checks types when it decodes, not when a struct is built: an ``Inbound`` or a send
built in code with a bad field used to be journaled as it was, handled now and refused only
when a replay decoded it (an inbound dead-lettered after a crash, a send pending forever).
Now building the record raises ``BadRecord`` naming the field, so nothing is journaled; and
a record journaled invalid by older code still ends dead, with a reason, never pending.
"""

from __future__ import annotations

from typing import Any

import pytest

from botmesh import Bot, Context, ErrorEvent, Inbound, Media
from botmesh.errors import BadRecord, Reason
from botmesh.journal import Write
from botmesh.state.kv import handover
from botmesh.state.messages import Outbound
from tests.kit import make_app, policy, settle


@pytest.mark.parametrize(
    ("fields", "field", "reason"),
    [
        ({"id": 123, "chat_id": "c"}, "id", Reason.WRONG_TYPE),
        ({"id": "m", "chat_id": ""}, "chat_id", Reason.MISSING_CHAT_ID),
        ({"id": "m", "chat_id": None}, "chat_id", Reason.MISSING_CHAT_ID),
        ({"id": "m", "chat_id": 42}, "chat_id", Reason.WRONG_TYPE),
        ({"id": "m", "chat_id": "c", "kind": "poll"}, "kind", Reason.WRONG_TYPE),
        ({"id": "m", "chat_id": "c", "text": 5}, "text", Reason.WRONG_TYPE),
        ({"id": "m", "chat_id": "c", "media": "https://x/a.png"}, "media", Reason.WRONG_TYPE),
        ({"id": "m", "chat_id": "c", "data": None}, "data", Reason.WRONG_TYPE),
        ({"id": "m", "chat_id": "c", "ts": "now"}, "ts", Reason.WRONG_TYPE),
    ],
)
def test_an_inbound_with_a_bad_field_is_refused_naming_it(
    fields: dict[str, Any], field: str, reason: Reason
) -> None:
    with pytest.raises(BadRecord) as info:
        Inbound(**fields)
    assert info.value.field == field
    assert info.value.reason == reason
    assert f"'{field}'" in str(info.value)


@pytest.mark.parametrize(
    ("fields", "field"),
    [({"url": 5}, "url"), ({"data": "abc"}, "data"), ({"extra": None}, "extra")],
)
def test_media_with_a_bad_field_is_refused_naming_it(fields: dict[str, Any], field: str) -> None:
    with pytest.raises(BadRecord) as info:
        Media(**fields)
    assert info.value.field == field


def test_good_records_still_build_and_round_trip() -> None:
    message = Inbound(id="m", chat_id="c", text="hi", ts=3, media=Media(url="https://x/a.png"))
    assert message.ts == 3
    assert Outbound("c", "hi", Media(data=b"\x00"), {"parse_mode": "HTML"}).chat_id == "c"


@pytest.mark.parametrize(
    ("args", "opts", "field"),
    [
        ((None, "x"), {}, "chat_id"),
        (("", "x"), {}, "chat_id"),
        (("c", "x"), {"media": "https://x/a.png"}, "media"),
        (("c", 5), {}, "text"),
    ],
)
async def test_a_bad_send_is_refused_and_nothing_is_journaled(
    args: tuple[Any, ...], opts: dict[str, Any], field: str
) -> None:
    app = await make_app()
    for call in (app.runtime.enqueue, app.runtime.send):
        with pytest.raises(BadRecord) as info:
            await call(*args, **opts)
        assert info.value.field == field
    assert await app.ops.outbox.list() == []
    assert app.provider.sent == []
    await app.stop()


async def test_a_bad_reply_in_a_handler_is_refused_and_nothing_is_journaled() -> None:
    bot = Bot("bot", durability=policy())
    errors: list[BaseException] = []

    @bot.on_message
    async def handler(ctx: Context) -> None:
        await ctx.reply("see", media="https://x/a.png")  # type: ignore[arg-type]  # the defect

    @bot.on(ErrorEvent)
    def seen(event: ErrorEvent) -> None:
        errors.append(event.error)

    app = await make_app(bot=bot)
    await app.runtime.handle(Inbound(id="m", chat_id="c", text="hi"))
    assert [type(e) for e in errors] == [BadRecord]
    assert isinstance(errors[0], BadRecord) and errors[0].field == "media"
    assert await app.ops.outbox.list() == []
    await app.stop()


async def test_handle_refuses_what_is_not_an_inbound_before_the_journal() -> None:
    app = await make_app(reply="hi")
    with pytest.raises(BadRecord) as info:
        await app.runtime.handle({"id": "m", "chat_id": "c"})  # type: ignore[arg-type]
    assert info.value.field == "message"
    assert await app.ops.inbox.list() == []
    await app.stop()


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        ({"chat_id": None, "text": "x"}, Reason.MISSING_CHAT_ID),
        ({"chat_id": "c", "text": "x", "media": "https://x/a.png"}, Reason.WRONG_TYPE),
        ({"chat_id": "c", "text": 5}, Reason.WRONG_TYPE),
    ],
)
async def test_a_send_journaled_invalid_by_older_code_ends_dead_with_a_reason(
    payload: dict[str, Any], reason: Reason
) -> None:
    app = await make_app()
    now = app.clock.now()
    value = {
        "key": "old",
        "state": "pending",
        "attempts": 0,
        "token": 0,
        "payload": payload,
        "created": now,
        "updated": now,
    }
    key = app.engine.keys.outbox + "old"
    await app.kv.commit([handover(key, value, expect=0, due=now)], label=Write.OUTBOX_JOURNAL)
    await settle(app, passes=3)
    rec = await app.ops.outbox.get("old")
    assert rec is not None and rec.state == "dead", rec
    assert rec.error is not None and rec.error["reason"] == reason
    assert app.provider.sent == []
    await app.stop()


@pytest.mark.parametrize(
    ("message", "field"),
    [
        ({"v": 1, "id": "m", "chat_id": ""}, "chat_id"),
        ({"v": 1, "id": "m", "chat_id": "c", "text": 5}, "text"),
        ({"v": 1, "id": "m", "chat_id": "c", "kind": "poll"}, "kind"),
    ],
)
async def test_an_inbound_journaled_invalid_by_older_code_ends_dead_with_a_reason(
    message: dict[str, Any], field: str
) -> None:
    """Its handlers never run; like any failure before the handlers it backs off, then is
    dead-lettered (``attempts-exhausted``) with the decoder's error naming the field."""
    app = await make_app(reply="hi", inbox={"max_attempts": 2})
    now = app.clock.now()
    value = {
        "id": "m",
        "state": "pending",
        "attempts": 0,
        "token": 0,
        "message": message,
        "created": now,
        "updated": now,
    }
    key = app.engine.keys.inbox + "m"
    await app.kv.commit([handover(key, value, expect=0, due=now)], label=Write.INBOX_JOURNAL)
    await settle(app, passes=3)
    rec = await app.ops.inbox.get("m")
    assert rec is not None and rec.state == "dead", rec
    assert rec.error is not None and rec.error["reason"] == Reason.ATTEMPTS_EXHAUSTED
    assert f"$.{field}" in rec.error["message"]
    assert app.provider.sent == []
    await app.stop()
