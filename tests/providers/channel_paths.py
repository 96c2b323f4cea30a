"""The paths a channel adapter's tests drive with the real adapter against its local fake:
a send retried by the engine after a rate limit (the wait is the channel's ``Retry-After``),
an inbound whose media is journaled as a reference, replayed after a crash and downloaded
again, and a webhook through the real gateway onto a real broker's inbound topic. The
runtime is the real one on a manual clock (``tests.kit.make_app``); only the channel's
remote API is faked."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import pytest

from botmesh import Bot, Context, Inbound, Receipt, load_media_of
from botmesh.journal import MemoryKv, Write
from botmesh.providers.webhooks import ChannelWebhook
from botmesh.state.errors import MediaUnavailableError
from botmesh.state.ports import Provider
from botmesh.streams.provision import ensure_topics
from botmesh.testing import ManualClock, SimulatedCrash, crashable
from botmesh.topics.catalog import Catalog
from botmesh.topics.records import decode_inbound
from tests.gateway.kit import gateway_at, read_topic
from tests.kit import make_app, policy

__all__ = ["Replayed", "post_through_gateway", "replay_media", "send_through_engine"]


async def send_through_engine(
    provider: Provider, chat_id: str, text: str, *, base: str = "1s"
) -> tuple[Receipt, float]:
    """``runtime.send`` through the engine (backoff ``base``, no jitter): the receipt and
    how long the engine's clock waited before the send went out."""
    app = await make_app(provider, outbox={"backoff": {"base": base, "jitter": 0}})
    try:
        t0 = app.clock.now()
        receipt = await app.runtime.send(chat_id, text, idempotency_key="k-retry")
        return receipt, app.clock.now() - t0
    finally:
        await app.stop()


@dataclass
class Replayed:
    """What a crash and a replay of one inbound did."""

    #: The media as the inbox journaled it (the reference, never the bytes).
    journaled: Any
    #: What the handler downloaded on each run (live, then replayed).
    loaded: list[bytes | None] = field(default_factory=list)
    #: The media the handler saw on each run.
    media: list[Any] = field(default_factory=list)
    #: ``MediaUnavailableError.reason`` of a run that could not download.
    errors: list[str] = field(default_factory=list)


def _bot(seen: Replayed) -> Bot:
    bot = Bot("bot", durability=policy())

    @bot.on_message
    async def handler(ctx: Context) -> None:
        seen.media.append(ctx.message.media)
        try:
            seen.loaded.append(await load_media_of(ctx, throw_on_error=True))
        except MediaUnavailableError as exc:
            seen.errors.append(exc.reason)

    return bot


async def replay_media(
    provider: Provider, inbound: Inbound, *, before_replay: Callable[[], None] = lambda: None
) -> Replayed:
    """Handle ``inbound`` on a runtime that dies before marking it done (the handler has
    downloaded its media), then start a second runtime on the same journal: it replays the
    inbound, rebuilding the media from the journaled reference, and downloads it again.
    ``before_replay`` runs between the two (to expire the media on the fake, say)."""
    shared, clock = MemoryKv(), ManualClock()
    seen = Replayed(journaled=None)
    dying = crashable(shared)
    dying.crash_before(Write.INBOX_MARK_DONE)
    first = await make_app(provider, kv=dying, clock=clock, bot=_bot(seen))
    with pytest.raises(SimulatedCrash):
        await first.runtime.handle(inbound)
    [entry] = [e for e in await shared.scan("") if e.key.endswith(f"/in/{inbound.id}")]
    seen.journaled = entry.value["message"].get("media")
    before_replay()
    second = await make_app(provider, kv=shared, clock=clock, bot=_bot(seen))  # replays
    await second.stop()
    return seen


async def post_through_gateway(
    bootstrap: str,
    prefix: str,
    webhook: ChannelWebhook,
    body: bytes,
    headers: dict[str, str],
    *,
    query: str = "",
    times: int = 1,
) -> tuple[list[int], list[tuple[bytes | None, Inbound]]]:
    """Post ``body`` ``times`` times to a gateway serving ``webhook`` at ``/<channel>`` (with
    ``query``, e.g. ``?token=…``); the HTTP statuses and every record then on
    ``<prefix>.inbound`` as ``(key, Inbound)``."""
    catalog = Catalog(prefix)
    ensure_topics(bootstrap, catalog.specs(partitions=2))
    statuses: list[int] = []
    async with gateway_at(bootstrap, prefix, {webhook.channel: webhook}) as (_, url):
        async with aiohttp.ClientSession() as http:
            for _ in range(times):
                target = f"{url}/{webhook.channel}{query}"
                async with http.post(target, data=body, headers=headers) as resp:
                    statuses.append(resp.status)
        records = await read_topic(bootstrap, catalog.inbound)
    return statuses, [(r.key, decode_inbound(r.value)) for r in records]
