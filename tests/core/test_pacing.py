"""Rate limits kept before a send calls the provider (``botmesh.state.pacing``): the rate
syntax and its errors, strict spacing without a catch-up burst, chat and group slots beside
the channel's, a worker's share, a 429's Retry-After pausing the channel, the sweeper
leaving a chat that must wait for later, the settings (the bot's and the worker's)."""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections.abc import Awaitable
from typing import Any

import pytest

from botmesh import Bot
from botmesh.errors import ConfigError, RateLimitedError, SendDeferredError
from botmesh.observability.metrics import WorkerSources, WorkerTelemetry
from botmesh.providers.discord import DiscordProvider
from botmesh.providers.telegram import TelegramProvider
from botmesh.providers.whatsapp import WhatsAppProvider
from botmesh.state.config import DurabilityConfig, RateLimits
from botmesh.state.counters import Metrics
from botmesh.state.messages import Outbound, SendResult
from botmesh.state.pacing import NO_LIMITS, ChannelLimits, Pacer, Rate, declared_limits
from botmesh.streams.config import WorkerConfig
from botmesh.testing import ManualClock, MockProvider
from tests.kit import make_app, policy

T0 = 1_700_000_000.0


class LoopClock:
    """Virtual time for concurrent waiters: ``sleep(s)`` returns once the driver (``run``)
    moved time to ``now + s``; ``stall`` seconds are added to the next wake-up (an event
    loop that was blocked)."""

    def __init__(self, start: float = T0) -> None:
        self.t = start
        self.stall = 0.0
        self._sleepers: list[tuple[float, int, asyncio.Future[None]]] = []
        self._seq = itertools.count()

    def now(self) -> float:
        return self.t

    async def sleep(self, seconds: float) -> None:
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._sleepers, (self.t + max(seconds, 0.0), next(self._seq), fut))
        await fut

    async def run(self, *coros: Awaitable[Any]) -> list[Any]:
        tasks = [asyncio.ensure_future(c) for c in coros]
        while not all(t.done() for t in tasks):
            for _ in range(50):  # every runnable waiter reaches its sleep (or ends)
                await asyncio.sleep(0)
            if self._sleepers:
                deadline, _, fut = heapq.heappop(self._sleepers)
                self.t = max(self.t, deadline) + self.stall
                self.stall = 0.0
                fut.set_result(None)
        return [t.result() for t in tasks]


class Stamped:
    """Sends through a pacer and stamps each with the clock when it would call the
    provider."""

    def __init__(self, pacer: Pacer, clock: LoopClock | ManualClock) -> None:
        self.pacer, self.clock = pacer, clock
        self.at: list[tuple[str, float]] = []

    async def send(self, chat: str) -> None:
        await self.pacer.wait(chat)
        self.at.append((chat, self.clock.now() - T0))

    def times(self, chat: str | None = None) -> list[float]:
        return [t for c, t in self.at if chat is None or c == chat]


def pacer(
    clock: LoopClock | ManualClock,
    limits: ChannelLimits,
    *,
    groups: bool = False,
    metrics: Metrics | None = None,
) -> Pacer:
    return Pacer(
        limits,
        clock=clock,
        metrics=metrics or Metrics(),
        is_group=(lambda chat: chat.startswith("-")) if groups else None,
    )


# -- the rate syntax --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("given", "per_second"),
    [
        ("30/s", 30.0),
        ("20/min", 20 / 60),
        ("80/s", 80.0),
        ("1/s", 1.0),
        ("1000/h", 1000 / 3600),
        (" 2.5 / sec ", 2.5),
        ("20/minutes", 20 / 60),
        ("12", 12.0),
        (7, 7.0),
        (0.5, 0.5),
    ],
)
def test_a_rate_is_messages_per_period_or_a_number_per_second(
    given: object, per_second: float
) -> None:
    assert Rate.parse(given, "x").per_second == pytest.approx(per_second)


@pytest.mark.parametrize("given", ["fast", "0/s", "-1/s", "30/day", "30/", "", 0, -2, True, None])
def test_a_bad_rate_is_refused_naming_the_setting_and_the_fix(given: object) -> None:
    with pytest.raises(ConfigError) as info:
        Rate.parse(given, "outbox.rate_limits.chat")
    assert info.value.field == "outbox.rate_limits.chat"
    assert "'30/s'" in info.value.message  # how to write one


def test_a_rate_reads_back_as_it_is_written() -> None:
    assert [str(Rate.parse(v, "x")) for v in ("30/s", "20/min", "5/h", 3)] == [
        "30/s",
        "20/min",
        "5/h",
        "3/s",
    ]


# -- the pacer ------------------------------------------------------------------------------


async def test_sends_are_spaced_strictly_one_interval_apart() -> None:
    clock = LoopClock()
    metrics = Metrics()
    sends = Stamped(pacer(clock, ChannelLimits(channel=Rate(10)), metrics=metrics), clock)
    await clock.run(*(sends.send(f"c{i}") for i in range(6)))
    assert sends.times() == pytest.approx([0.0, 0.1, 0.2, 0.3, 0.4, 0.5])
    assert metrics.outbox_paced == 5  # the first did not wait
    assert metrics.outbox_paced_ms == 100 + 200 + 300 + 400 + 500


async def test_calls_bunched_after_their_slots_are_spaced_again_right_before_the_call() -> None:
    clock = LoopClock()
    paced = pacer(clock, ChannelLimits(channel=Rate(10)))
    # slots taken 0.1 s apart, then a slow journal write for each
    await clock.run(*(paced.wait(f"c{i}") for i in range(3)))
    called: list[float] = []

    async def call() -> None:
        await paced.spacing()
        called.append(clock.now())

    await clock.run(*(call() for _ in range(3)))  # they all reach the call at once
    assert called == pytest.approx([called[0], called[0] + 0.1, called[0] + 0.2])


async def test_time_without_sends_gives_no_catch_up_burst() -> None:
    """A second with nothing to send does not bank a second's worth of sends."""
    clock = ManualClock(T0)
    sends = Stamped(pacer(clock, ChannelLimits(channel=Rate(10))), clock)
    await sends.send("a")
    clock.advance(5.0)
    for i in range(4):
        await sends.send(f"b{i}")
    assert sends.times() == pytest.approx([0.0, 5.0, 5.1, 5.2, 5.3])


async def test_a_stalled_event_loop_gives_no_burst_either() -> None:
    """A waiter that wakes late (the loop blocked for 2 s) takes its slot from the clock
    then: the waiters behind it are still spaced one interval apart."""
    clock = LoopClock()
    sends = Stamped(pacer(clock, ChannelLimits(channel=Rate(10))), clock)
    clock.stall = 2.0
    await clock.run(*(sends.send(f"c{i}") for i in range(5)))
    times = sends.times()
    assert times[1] == pytest.approx(2.1)  # woke 2 s late
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert min(gaps) == pytest.approx(0.1)


class LateClock(ManualClock):
    """Every sleep wakes ``late`` seconds after it was due (the event loop's jitter)."""

    def __init__(self, late: float) -> None:
        super().__init__(T0)
        self.late = late

    async def sleep(self, seconds: float) -> None:
        await super().sleep(seconds + self.late)


async def test_the_loops_jitter_does_not_add_up_into_a_lower_rate() -> None:
    """Waking 3 ms late at every slot keeps the cadence (ten sends in 0.9 s, not 0.927 s),
    and two calls are never closer than half an interval."""
    clock = LateClock(0.003)
    sends = Stamped(pacer(clock, ChannelLimits(channel=Rate(10))), clock)
    for i in range(10):
        await sends.send(f"c{i}")
    times = sends.times()
    assert times[-1] == pytest.approx(0.903)
    assert min(b - a for a, b in itertools.pairwise(times)) >= 0.05


async def test_a_chat_waits_for_its_own_slot_and_others_go_by() -> None:
    clock = LoopClock()
    limits = ChannelLimits(channel=Rate(10), chat=Rate(1))
    sends = Stamped(pacer(clock, limits), clock)
    await clock.run(sends.send("a"), sends.send("a"), sends.send("b"), sends.send("a"))
    assert sends.times("a") == pytest.approx([0.0, 1.0, 2.0])  # a chat: 1/s
    assert sends.times("b") == pytest.approx([0.1])  # the channel: 10/s, not behind a


async def test_a_group_has_its_own_limit_beside_a_private_chats() -> None:
    clock = LoopClock()
    limits = ChannelLimits(channel=Rate(30), chat=Rate(1), group=Rate(20, 60))
    sends = Stamped(pacer(clock, limits, groups=True), clock)
    await clock.run(*(sends.send(c) for c in ("-100", "-100", "-100", "42", "42")))
    assert sends.times("-100") == pytest.approx([0.0, 3.0, 6.0])  # 20 a minute
    assert sends.times("42") == pytest.approx([1 / 30, 1.0 + 1 / 30])  # 1 a second


async def test_chat_limits_without_a_group_test_treat_every_chat_as_private() -> None:
    clock = LoopClock()
    sends = Stamped(pacer(clock, ChannelLimits(chat=Rate(2), group=Rate(1, 60))), clock)
    await clock.run(sends.send("-5"), sends.send("-5"))
    assert sends.times() == pytest.approx([0.0, 0.5])


async def test_a_share_takes_its_part_of_the_channel_rate_not_of_a_chats() -> None:
    clock = LoopClock()
    p = pacer(clock, ChannelLimits(channel=Rate(10), chat=Rate(1)))
    p.share = 0.25  # a worker owning 2 of 8 partitions: 2.5/s
    sends = Stamped(p, clock)
    await clock.run(sends.send("a"), sends.send("b"), sends.send("c"), sends.send("a"))
    assert sends.times("b") == pytest.approx([0.4])
    assert sends.times("c") == pytest.approx([0.8])
    assert sends.times("a") == pytest.approx([0.0, 1.2])  # its own 1 s, then the channel
    for bad in (0, 1.5, -0.1):
        with pytest.raises(ValueError, match=r"\(0, 1\]"):
            p.share = bad


async def test_retry_after_pauses_every_send_of_the_channel() -> None:
    clock = LoopClock()
    p = pacer(clock, ChannelLimits(channel=Rate(10)))
    sends = Stamped(p, clock)
    await clock.run(sends.send("a"))
    p.refused(5.0)
    await clock.run(sends.send("b"), sends.send("c"))
    assert sends.times() == pytest.approx([0.0, 5.0, 5.1])


async def test_idle_chats_are_dropped_so_memory_stays_bounded() -> None:
    clock = ManualClock(T0)
    p = pacer(clock, ChannelLimits(chat=Rate(1)))
    for i in range(20_000):
        await p.wait(f"chat-{i}")
        clock.advance(0.01)  # 100 new chats a second, each idle after its 1 s
    assert p.chats <= 2 * 1024


def test_a_provider_without_limits_declares_none() -> None:
    assert declared_limits(MockProvider()) == NO_LIMITS
    assert not Pacer(NO_LIMITS, clock=ManualClock(), metrics=Metrics()).limited


def test_the_channels_declare_their_documented_limits() -> None:
    telegram = TelegramProvider("123456:" + "A" * 35)
    assert declared_limits(telegram) == ChannelLimits(
        channel=Rate(30), chat=Rate(1), group=Rate(20, 60)
    )
    assert telegram.is_group("-1001234") and telegram.is_group("@news")
    assert not telegram.is_group("42")
    assert declared_limits(WhatsAppProvider("token", "123")).channel == Rate(80)
    assert declared_limits(WhatsAppProvider("token", "123")).chat is None
    assert declared_limits(DiscordProvider("x" * 30)).channel == Rate(50)


# -- the engine: delivery paced ------------------------------------------------------------


class Limited(MockProvider):
    """A mock channel that declares ``limits`` and stamps each call with ``clock``."""

    def __init__(self, clock: ManualClock, limits: ChannelLimits, name: str = "limited") -> None:
        super().__init__(name)
        self.rate_limits = limits
        self.clock = clock
        self.at: list[tuple[str, float]] = []

    def is_group(self, chat_id: str) -> bool:
        return chat_id.startswith("-")

    async def send(self, message: Outbound) -> SendResult:
        self.at.append((message.chat_id, round(self.clock.now() - T0, 6)))
        return await super().send(message)


async def test_inline_sends_wait_for_their_slot() -> None:
    clock = ManualClock(T0)
    provider = Limited(clock, ChannelLimits(channel=Rate(4), chat=Rate(1)))
    app = await make_app(provider, clock=clock)
    for chat in ("a", "b", "a"):
        await app.runtime.send(chat, "hi")
    assert provider.at == [("a", 0.0), ("b", 0.25), ("a", 1.0)]
    metrics = app.ops.metrics()
    assert metrics["outboxPaced"] == 2 and metrics["outboxPacedMs"] == 250 + 750
    await app.stop()


async def test_a_429_pauses_the_channel_for_its_retry_after() -> None:
    clock = ManualClock(T0)
    provider = Limited(clock, ChannelLimits(channel=Rate(100)))
    app = await make_app(provider, clock=clock, outbox={"inline_max": 0})
    provider.fail_next(RateLimitedError("slow down", retry_after=3.0))
    with pytest.raises(SendDeferredError):
        await app.runtime.send("a", "first")  # refused: left to the sweeper
    await app.runtime.send("b", "second")  # another chat: after the pause all the same
    assert provider.at == [("a", 0.0), ("b", 3.0)]
    await app.stop()


async def test_the_sweeper_leaves_a_chat_that_must_wait_and_goes_on_with_others() -> None:
    """With a chat's next slot further than a sweeper poll away, its send is left due at
    that slot (no attempt charged, nobody sleeps on it) and the other chats go now."""
    clock = ManualClock(T0)
    provider = Limited(clock, ChannelLimits(chat=Rate(1, 10)))  # one send per 10 s a chat
    app = await make_app(provider, clock=clock, poll=0)
    for key, chat in (("a1", "a"), ("a2", "a"), ("b1", "b")):
        await app.runtime.enqueue(chat, key, idempotency_key=key)
    await app.ops.sweep_once()
    assert sorted(provider.at) == [("a", 0.0), ("b", 0.0)]  # a2 left for later
    assert clock.now() == T0  # nobody slept 10 s
    a2 = await app.ops.outbox.get("a2")
    assert a2 is not None and (a2.state, a2.attempts) == ("pending", 0)
    clock.advance(5.0)
    await app.ops.sweep_once()  # not its slot yet
    assert len(provider.at) == 2
    clock.advance(5.0)
    await app.ops.sweep_once()
    assert provider.at[2] == ("a", 10.0)
    a2 = await app.ops.outbox.get("a2")
    assert a2 is not None and (a2.state, a2.attempts) == ("sent", 1)
    await app.stop()


async def test_a_fallback_channel_is_paced_under_its_own_limits() -> None:
    clock = ManualClock(T0)
    own = Limited(clock, ChannelLimits(channel=Rate(1000)))
    sms = Limited(clock, ChannelLimits(channel=Rate(2)), name="sms")
    bot = Bot("bot", durability=policy())
    runtime = bot.bind(own, "memory://", clock=clock, fallbacks={"sms": sms})
    await runtime.start()
    engine = runtime._core.engine
    assert engine is not None
    assert engine.pacers["sms"].limits == ChannelLimits(channel=Rate(2))
    assert engine.pacers[None].limits == ChannelLimits(channel=Rate(1000))
    runtime.set_pace_share(0.5)
    assert {p.share for p in engine.pacers.values()} == {0.5}
    with pytest.raises(ConfigError):
        runtime.set_pace_share(0)
    await runtime.stop()


# -- the settings --------------------------------------------------------------------------


def test_outbox_rate_limits_override_or_turn_off_the_declared_ones() -> None:
    declared = ChannelLimits(channel=Rate(30), chat=Rate(1), group=Rate(20, 60))
    config = DurabilityConfig.from_mapping(
        {"outbox": {"rate_limits": {"channel": "10/s", "group": "off"}}}
    )
    assert config.outbox.rate_limits == RateLimits(Rate(10), "default", None)
    assert config.outbox.rate_limits.limits(declared) == ChannelLimits(Rate(10), Rate(1), None)
    assert DurabilityConfig().outbox.rate_limits.limits(declared) == declared
    off = DurabilityConfig.from_mapping({"outbox": {"rate_limits": "off"}})
    assert off.outbox.rate_limits.limits(declared) == NO_LIMITS


@pytest.mark.parametrize(
    ("given", "field"),
    [
        ({"channel": "fast"}, "outbox.rate_limits.channel"),
        ({"chats": "1/s"}, "outbox.rate_limits.chats"),
        ("30/s", "outbox.rate_limits"),
        (42, "outbox.rate_limits"),
    ],
)
def test_a_bad_rate_limits_option_is_refused_by_its_name(given: object, field: str) -> None:
    with pytest.raises(ConfigError) as info:
        Bot("b", durability={"outbox": {"rate_limits": given}})
    assert info.value.field == field


def test_the_workers_environment_sets_the_limits_over_the_bots() -> None:
    assert WorkerConfig.from_env({}).rate_limits is None
    env = {"BOTMESH_RATE_LIMIT": "80/s", "BOTMESH_GROUP_RATE_LIMIT": "off"}
    worker = WorkerConfig.from_env(env).rate_limits
    assert worker == RateLimits(Rate(80), "default", None)
    bots = RateLimits(channel=Rate(5), chat=Rate(2))
    assert worker.over(bots) == RateLimits(Rate(80), Rate(2), None)
    with pytest.raises(ValueError, match="BOTMESH_CHAT_RATE_LIMIT"):
        WorkerConfig.from_env({"BOTMESH_CHAT_RATE_LIMIT": "lots"})


async def test_a_runtimes_rate_limits_go_over_the_bots() -> None:
    clock = ManualClock(T0)
    provider = Limited(clock, ChannelLimits(channel=Rate(30), chat=Rate(1)))
    bot = Bot("bot", durability=policy(outbox={"rate_limits": {"chat": "2/s"}}))
    runtime = bot.bind(provider, "memory://", clock=clock, rate_limits=RateLimits(channel=Rate(80)))
    await runtime.start()
    engine = runtime._core.engine
    assert engine is not None
    assert engine.pacers[None].limits == ChannelLimits(Rate(80), Rate(2), None)
    await runtime.stop()


def test_the_scrape_gives_the_wait_in_seconds() -> None:
    telemetry = WorkerTelemetry(
        WorkerSources(counters=lambda: {"outboxPaced": 3, "outboxPacedMs": 1500})
    )
    scrape = telemetry.scrape().decode()
    assert "botmesh_outbox_paced_total 3.0" in scrape
    assert "botmesh_outbox_paced_seconds_total 1.5" in scrape
