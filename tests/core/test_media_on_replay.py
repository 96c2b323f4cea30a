"""Media on replay: the inbox journals a channel's durable media reference (never the bytes,
never a credential), a replay rebuilds the media before the handler runs, and
``load_media_of`` downloads it, or reports why it cannot (``MediaUnavailableError`` with
``not-durable``, ``provider-mismatch`` or ``rehydrate-failed``) while the handler still runs.

The channel is an in-process provider with the two media-reference methods and a download
(its "remote" store is a dict): the provider is the one thing tests fake."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

import botmesh
from botmesh import Bot, Context, Inbound, Media
from botmesh.errors import MediaUnavailableError, ProviderError
from botmesh.journal import MemoryKv, Write
from botmesh.state.kv import handover
from botmesh.testing import ManualClock, MockProvider, SimulatedCrash, crashable
from tests.kit import make_app, policy

pytestmark = pytest.mark.crash

SECRET = "tok-3f9a"  # a credential the channel adds at download time; never journaled


class RefChannel(MockProvider):
    """Media ids journaled as ``{"v": 1, "data": {"id": ...}}``; view-once media is not
    durable; a download needs the token and fails for an expired id."""

    def __init__(self, name: str = "refs") -> None:
        super().__init__(name)
        self.files: dict[str, bytes] = {}
        self.expired: set[str] = set()
        self.downloads: list[tuple[str, str]] = []

    def serialize_media_ref(self, media: Media) -> dict[str, Any] | None:
        if media.extra.get("view_once") or media.id is None:
            return None
        return {"v": 1, "data": {"id": media.id}}

    def rehydrate_media_ref(self, stored: Mapping[str, Any], media: Media) -> Media:
        data = stored.get("data")
        if stored.get("v") != 1 or not isinstance(data, dict) or set(data) != {"id"}:
            raise ProviderError("stored media reference is not valid")
        if not str(data["id"]).isalnum():
            raise ProviderError("stored media id is not valid")
        return Media(id=data["id"], mime=media.mime, name=media.name, provider=self.name)

    async def download_media(self, media: Media) -> bytes:
        if media.data is not None:  # a live message that carried its bytes
            return media.data
        assert media.id is not None
        self.downloads.append((media.id, SECRET))
        if media.id in self.expired or media.id not in self.files:
            raise ProviderError(f"{self.name}: media {media.id} is gone (HTTP 404)")
        return self.files[media.id]


class Seen:
    """What the handler saw on each run."""

    def __init__(self) -> None:
        self.media: list[Media | None] = []
        self.loaded: list[bytes | None] = []
        self.errors: list[str] = []


def _bot(seen: Seen, *, throw: bool = False, **options: Any) -> Bot:
    bot = Bot("bot", durability=policy(**options))

    @bot.on_message
    async def handler(ctx: Context) -> None:
        seen.media.append(ctx.message.media)
        try:
            seen.loaded.append(await botmesh.load_media_of(ctx, throw_on_error=throw))
        except MediaUnavailableError as exc:
            seen.errors.append(exc.reason)
            await ctx.reply("Please send the image again.")
            return
        await ctx.reply("got it")

    return bot


PHOTO = Media(id="f1", mime="image/png", provider="refs", data=b"live-bytes", name="p.png")


async def _crash_in_handler(
    channel: RefChannel, media: Media, **options: Any
) -> tuple[MemoryKv, ManualClock, Seen]:
    """The first run journals the inbound and dies before marking it done."""
    shared, clock, seen = MemoryKv(), ManualClock(), Seen()
    a = crashable(shared)
    a.crash_before(Write.INBOX_MARK_DONE)
    first = await make_app(channel, kv=a, clock=clock, bot=_bot(seen, **options))
    with pytest.raises(SimulatedCrash):
        await first.runtime.handle(Inbound(id="m1", chat_id="c", media=media))
    assert seen.loaded == [b"live-bytes"]  # the live run downloads (here: the inline bytes)
    return shared, clock, seen


async def _journaled_media(kv: MemoryKv) -> Any:
    """The inbound's media as the journal holds it (read raw: starting a runtime would
    replay it)."""
    [entry] = [e for e in await kv.scan("") if e.key.endswith("/in/m1")]
    return entry.value["message"].get("media")


async def test_the_journal_holds_the_reference_not_the_bytes() -> None:
    channel = RefChannel()
    channel.files["f1"] = b"from-the-channel"
    shared, _, _ = await _crash_in_handler(channel, PHOTO)
    media = await _journaled_media(shared)
    assert media == {
        "mime": "image/png",
        "name": "p.png",
        "provider": "refs",
        "ref": {"v": 1, "data": {"id": "f1"}},
    }
    assert "data" not in media and SECRET not in repr(media)


async def test_a_replay_rebuilds_the_media_and_downloads_it() -> None:
    channel = RefChannel()
    channel.files["f1"] = b"from-the-channel"
    shared, clock, _ = await _crash_in_handler(channel, PHOTO)
    seen = Seen()
    await make_app(channel, kv=shared, clock=clock, bot=_bot(seen, throw=True))  # recovers
    assert seen.errors == [] and seen.loaded == [b"from-the-channel"]
    [media] = seen.media
    assert media is not None and media.id == "f1" and media.data is None
    assert [m.text for m in channel.sent] == ["got it"]  # the replay's reply: from the outbox


@pytest.mark.parametrize("throw", [False, True])
async def test_view_once_media_is_not_durable(throw: bool) -> None:
    channel = RefChannel()
    once = Media(
        id="f2", mime="image/png", provider="refs", data=b"live-bytes", extra={"view_once": True}
    )
    shared, clock, _ = await _crash_in_handler(channel, once)
    assert (await _journaled_media(shared))["unavailable"] == "not-durable"
    seen = Seen()
    await make_app(channel, kv=shared, clock=clock, bot=_bot(seen, throw=throw))
    assert seen.errors == (["not-durable"] if throw else [])
    assert seen.loaded == ([] if throw else [None])
    assert channel.downloads == []  # nothing to download from
    assert len(seen.media) == 1  # the handler still ran


async def test_a_tampered_reference_is_refused_and_the_handler_still_runs() -> None:
    channel = RefChannel()
    channel.files["f1"] = b"from-the-channel"
    shared, clock, _ = await _crash_in_handler(channel, PHOTO)
    [entry] = [e for e in await shared.scan("") if e.key.endswith("/in/m1")]
    tampered = {**entry.value}
    tampered["message"] = {
        **entry.value["message"],
        "media": {**entry.value["message"]["media"], "ref": {"v": 1, "data": {"id": "../x"}}},
    }
    await shared.commit([_put(entry, tampered)])
    seen = Seen()
    await make_app(channel, kv=shared, clock=clock, bot=_bot(seen, throw=True))
    assert seen.errors == ["rehydrate-failed"] and channel.downloads == []
    # the replay's other reply under the same key is sent as diverged (on_diverged="send")
    assert [m.text for m in channel.sent] == ["got it", "Please send the image again."]


async def test_another_channel_wrote_the_record() -> None:
    channel = RefChannel()
    shared, clock, _ = await _crash_in_handler(channel, PHOTO)
    other = RefChannel("other")
    other.files["f1"] = b"not yours"
    seen = Seen()
    await make_app(other, kv=shared, clock=clock, bot=_bot(seen, throw=True))
    assert seen.errors == ["provider-mismatch"] and other.downloads == []


async def test_a_reference_that_expired_before_the_replay() -> None:
    channel = RefChannel()
    shared, clock, _ = await _crash_in_handler(channel, PHOTO)
    channel.expired.add("f1")
    seen = Seen()
    await make_app(channel, kv=shared, clock=clock, bot=_bot(seen, throw=True))
    assert seen.errors == ["rehydrate-failed"] and channel.downloads == [("f1", SECRET)]


async def test_without_throw_a_failed_download_is_none() -> None:
    channel = RefChannel()
    shared, clock, _ = await _crash_in_handler(channel, PHOTO)
    channel.expired.add("f1")
    seen = Seen()
    await make_app(channel, kv=shared, clock=clock, bot=_bot(seen))
    assert seen.loaded == [None] and seen.errors == []


async def test_media_refs_off_journals_the_media_as_it_is() -> None:
    channel = RefChannel()
    shared, _, _ = await _crash_in_handler(channel, PHOTO, inbox={"media_refs": False})
    media = await _journaled_media(shared)
    assert media["id"] == "f1" and "ref" not in media and media["data"] == "bGl2ZS1ieXRlcw=="


async def test_a_provider_without_the_methods_journals_the_token_as_it_is() -> None:
    shared, clock, seen = MemoryKv(), ManualClock(), Seen()
    a = crashable(shared)
    a.crash_before(Write.INBOX_MARK_DONE)
    mock = MockProvider()
    first = await make_app(mock, kv=a, clock=clock, bot=_bot(seen))
    url = Media(url="https://example.com/a.png", mime="image/png")
    with pytest.raises(SimulatedCrash):
        await first.runtime.handle(Inbound(id="m1", chat_id="c", media=url))
    await make_app(mock, kv=shared, clock=clock, bot=_bot(seen))
    assert seen.media == [url, url]  # replayed exactly as it came
    assert [m.text for m in mock.sent] == ["got it"]


def _put(entry: Any, value: dict[str, Any]) -> Any:
    return handover(entry.key, value, expect=entry.version, due=entry.due)


async def test_a_redelivery_after_a_replay_runs_on_the_same_input() -> None:
    """Killed before replying; the replay (media from the journal, no longer downloadable)
    answers; then the transport delivers the record again (its offset was never committed):
    the handlers rerun on the journaled message, as the replay did, so they answer the same
    and nothing is sent twice. On the live message (its bytes inline) they would answer
    otherwise, and that other reply would go out too."""
    shared, clock, channel = MemoryKv(), ManualClock(), RefChannel()
    a = crashable(shared)
    a.crash_before(Write.OUTBOX_JOURNAL)
    first = await make_app(channel, kv=a, clock=clock, bot=_bot(Seen(), throw=True))
    live = Inbound(id="m1", chat_id="c", media=PHOTO)
    with pytest.raises(SimulatedCrash):
        await first.runtime.handle(live, source="inbound:0:7")
    assert channel.sent == []
    seen = Seen()
    again = await make_app(channel, kv=shared, clock=clock, bot=_bot(seen, throw=True))
    assert seen.errors == ["rehydrate-failed"]  # f1 is not in the channel's store
    await again.runtime.handle(live, source="inbound:0:7")  # delivered again
    assert seen.errors == ["rehydrate-failed", "rehydrate-failed"] and seen.loaded == []
    assert [m.text for m in channel.sent] == ["Please send the image again."]
