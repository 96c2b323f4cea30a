"""Pacing: the rate limits a channel states, kept before a send is attempted.

A channel refuses sends over its limits with a 429 (``RateLimitedError``); that is the
channel telling us after the fact. The limits it documents are known before: so many
messages a second for the whole bot (or phone number), so many to one private chat, so
many to one group chat. ``Pacer`` keeps a channel's sends under them:

- **Strict spacing, no catch-up burst.** At the moment a send is about to call the
  provider its slot is ``max(next_free, now)``, and ``next_free`` becomes ``slot + 1 /
  rate``. A send that had to wait takes the slot again after its sleep, from the clock's
  ``now`` then: an event loop that stalled for a second does not let a second's worth of
  sends out at once when it comes back. Only a wake-up less than half an interval late
  (the loop's jitter, a millisecond) keeps the slot it waited for, so that this jitter
  does not add up, send after send, into a rate below the limit; two calls are never
  closer than half an interval.
- **One channel slot, one slot per chat.** A send waits for its chat's slot (private or
  group, by the channel's ``is_group``), then for the channel's; waiters take their turn
  in arrival order. A chat's entry is dropped once its slot is in the past, so memory
  follows the chats active in the last interval, not every chat ever seen.
- **A share of the channel.** ``share`` (in (0, 1]) multiplies the channel's rate: the
  Kafka worker sets it to the part of the inbound partitions it owns, so the workers of a
  group stay under the limit together. A chat belongs to one worker: chat limits are not
  shared.
- **Retry-After pauses the channel.** A ``RateLimitedError`` from the channel pushes the
  channel's next slot to ``now + retry_after``: every send waits, not only the refused one.

A provider declares its limits with a ``rate_limits`` attribute (a ``ChannelLimits``) and
may say which chats are groups (``is_group(chat_id)``); both are optional
(``declared_limits``, ``group_test``). ``outbox.rate_limits`` (``botmesh.state.config``)
overrides each limit, or turns it off.
"""

from __future__ import annotations

import asyncio
import math
import re
from collections.abc import Callable
from dataclasses import dataclass

from botmesh.state.clock import Clock
from botmesh.state.counters import Metrics
from botmesh.state.errors import ConfigError

__all__ = [
    "NO_LIMITS",
    "ChannelLimits",
    "Pacer",
    "Rate",
    "declared_limits",
    "group_test",
]

_PERIODS = {
    "s": 1.0,
    "sec": 1.0,
    "second": 1.0,
    "m": 60.0,
    "min": 60.0,
    "minute": 60.0,
    "h": 3600.0,
    "hour": 3600.0,
}
_RATE = re.compile(r"^\s*(?P<n>\d+(?:\.\d+)?)\s*(?:/\s*(?P<per>[a-z]+)\s*)?$")
_HINT = "write it as messages per period: '30/s', '20/min', '1000/h', or a number (per second)"


def _period(per: str | None) -> float | None:
    """Seconds of a period's name (``s``, ``min``, ``minutes``...; none: a second)."""
    if per is None:
        return 1.0
    return _PERIODS.get(per, _PERIODS.get(per.removesuffix("s")))


@dataclass(frozen=True, slots=True)
class Rate:
    """``count`` messages per ``period`` seconds (``Rate.parse("20/min")``)."""

    count: float
    period: float = 1.0

    def __post_init__(self) -> None:
        for name in ("count", "period"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ConfigError(f"rate.{name}", f"expected a number, got {value!r}")
            if not (math.isfinite(value) and value > 0):
                raise ConfigError(f"rate.{name}", f"must be a finite number above 0, got {value}")

    @property
    def per_second(self) -> float:
        return self.count / self.period

    @classmethod
    def parse(cls, value: object, setting: str) -> Rate:
        """``"30/s"``, ``"20/min"``, ``"1000/h"``, ``"80"`` or a number (per second), or a
        ``Rate``; a ``ConfigError`` naming ``setting`` and the fix for anything else."""
        if isinstance(value, Rate):
            return value
        if isinstance(value, int | float) and not isinstance(value, bool):
            if not (math.isfinite(value) and value > 0):
                raise ConfigError(setting, f"a rate must be above 0, got {value!r}; {_HINT}")
            return cls(float(value))
        if not isinstance(value, str):
            raise ConfigError(setting, f"expected a rate, got {value!r}; {_HINT}")
        match = _RATE.match(value.lower())
        period = _period(match["per"]) if match else None
        if match is None or period is None:
            raise ConfigError(setting, f"not a rate: {value!r}; {_HINT}")
        count = float(match["n"])
        if count <= 0:
            raise ConfigError(setting, f"a rate must be above 0, got {value!r}; {_HINT}")
        return cls(count, period)

    def __str__(self) -> str:
        unit = {1.0: "s", 60.0: "min", 3600.0: "h"}.get(self.period)
        return f"{self.count:g}/{unit}" if unit else f"{self.count:g}/{self.period:g}s"


@dataclass(frozen=True, slots=True)
class ChannelLimits:
    """What a channel allows; ``None``: no limit of that kind."""

    #: The whole bot (or phone number, or page): every send it makes.
    channel: Rate | None = None
    #: One private chat.
    chat: Rate | None = None
    #: One group chat (a chat the channel's ``is_group`` says is a group).
    group: Rate | None = None

    @property
    def any(self) -> bool:
        return self.channel is not None or self.chat is not None or self.group is not None


#: A channel that states no limits.
NO_LIMITS = ChannelLimits()


def declared_limits(provider: object) -> ChannelLimits:
    """The limits ``provider`` declares (its ``rate_limits`` attribute), else none."""
    limits = getattr(provider, "rate_limits", None)
    return limits if isinstance(limits, ChannelLimits) else NO_LIMITS


def group_test(provider: object) -> Callable[[str], bool] | None:
    """The provider's ``is_group(chat_id)``, when it has one."""
    test = getattr(provider, "is_group", None)
    return test if callable(test) else None


class _Slot:
    """The next free moment of one stream of sends, and the turn of its waiters."""

    __slots__ = ("lock", "next_free")

    def __init__(self) -> None:
        self.next_free = 0.0
        self.lock = asyncio.Lock()  # FIFO: waiters take their turn in arrival order

    async def take(self, clock: Clock, interval: Callable[[], float]) -> None:
        """Wait for the slot (the caller holds ``lock``), then take it: the slot is
        computed again after every sleep, from the clock's ``now`` then. Woken less than
        half an interval late (the event loop's jitter), the send keeps the cadence: its
        slot is the one it waited for (two calls are never closer than half an interval);
        later than that (a stall, or nothing to send), its slot is now: no catch-up."""
        while True:
            now = clock.now()
            if self.next_free <= now:
                gap = interval()
                late = now - self.next_free
                self.next_free = (self.next_free if late < gap / 2 else now) + gap
                return
            await clock.sleep(self.next_free - now)


#: Chats kept at least, before idle ones are dropped.
_KEEP_CHATS = 1024


class Pacer:
    """One channel's pacing: its slot, its chats' slots (see the module doc)."""

    def __init__(
        self,
        limits: ChannelLimits,
        *,
        clock: Clock,
        metrics: Metrics,
        is_group: Callable[[str], bool] | None = None,
        share: float = 1.0,
    ) -> None:
        self.limits = limits
        self._clock = clock
        self._metrics = metrics
        self._is_group = is_group
        self._share = 1.0
        self.share = share
        self._channel = _Slot()
        #: The provider calls themselves, spaced again right before each (``spacing``).
        self._calls = _Slot()
        self._chats: dict[str, tuple[_Slot, float]] = {}
        self._evict_at = _KEEP_CHATS
        #: Whether any limit applies: without one, ``wait`` is never called.
        self.limited = limits.any

    @property
    def share(self) -> float:
        """This process's part of the channel's rate, in (0, 1]."""
        return self._share

    @share.setter
    def share(self, fraction: float) -> None:
        if not (isinstance(fraction, int | float) and 0.0 < fraction <= 1.0):
            raise ValueError(f"a pace share is in (0, 1], got {fraction!r}")
        self._share = float(fraction)

    def _channel_interval(self) -> float:
        rate = self.limits.channel
        return 0.0 if rate is None else 1.0 / (rate.per_second * self._share)

    def _chat_rate(self, chat_id: str) -> Rate | None:
        limits = self.limits
        if limits.group is not None or limits.chat is not None:
            group = self._is_group is not None and self._is_group(chat_id)
            return limits.group if group else limits.chat
        return None

    def chat_ready(self, chat_id: str) -> float:
        """When ``chat_id``'s next send may go (its chat slot; the channel's is not
        counted); 0 when nothing holds it."""
        entry = self._chats.get(chat_id)
        return 0.0 if entry is None else entry[0].next_free

    async def wait(self, chat_id: str) -> float:
        """Wait until a send to ``chat_id`` may call the provider, and take its slots;
        the seconds waited (counted in ``outboxPaced`` and ``outboxPacedMs``)."""
        clock = self._clock
        began = clock.now()
        rate = self._chat_rate(chat_id)
        if rate is None:
            await self._take_channel()
        else:
            interval = rate.period / rate.count
            slot = self._chat_slot(chat_id, interval, began)
            async with slot.lock:
                await slot.take(clock, lambda: interval)
                await self._take_channel()
                slot.next_free = clock.now() + interval  # after the channel's wait too
        waited = clock.now() - began
        if waited > 0:
            self._metrics.outbox_paced += 1
            self._metrics.outbox_paced_ms += round(waited * 1000)
        return waited

    async def _take_channel(self) -> None:
        slot = self._channel
        if self.limits.channel is None and slot.next_free <= self._clock.now():
            return  # no channel rate, no Retry-After pending
        async with slot.lock:
            await slot.take(self._clock, self._channel_interval)

    async def spacing(self) -> None:
        """Right before the provider call of a send that took its slot (``wait``) before
        it was marked in flight: the calls spaced at the channel's rate again, so that
        what came between (a journal write slower for one send than for the next) never
        bunches them up at the channel. Short: the slots were taken already."""
        if self.limits.channel is None and self._calls.next_free <= self._clock.now():
            return
        async with self._calls.lock:
            await self._calls.take(self._clock, self._channel_interval)

    def _chat_slot(self, chat_id: str, interval: float, now: float) -> _Slot:
        entry = self._chats.get(chat_id)
        if entry is None:
            if len(self._chats) >= self._evict_at:
                self._evict(now)
            entry = self._chats[chat_id] = (_Slot(), interval)
        return entry[0]

    def _evict(self, now: float) -> None:
        """Drop the chats whose slot is past and that nobody waits on."""
        idle = [
            c for c, (s, _) in self._chats.items() if s.next_free <= now and not s.lock.locked()
        ]
        for chat in idle:
            del self._chats[chat]
        self._evict_at = max(_KEEP_CHATS, 2 * len(self._chats))

    def refused(self, retry_after: float) -> None:
        """The channel answered 429 with ``retry_after``: no send of this channel before
        then (of a paced channel: one without limits is not paced at all)."""
        if retry_after > 0:
            until = self._clock.now() + retry_after
            self._channel.next_free = max(self._channel.next_free, until)
            self._calls.next_free = max(self._calls.next_free, until)

    @property
    def chats(self) -> int:
        """Chats with a slot kept now."""
        return len(self._chats)
