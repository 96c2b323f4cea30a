"""Real SIGKILLs of a worker on a real channel adapter whose channel resolves ambiguity.

A send the journal finds in flight after a SIGKILL may or may not have reached the channel.
The bot (``tests/kafka/kill_bot.py``) runs with ``on_ambiguous="skip"``: guessing, such a
send would be marked ``unknown`` and, when it had never reached the channel, lost (a run of
this test on a Discord provider whose ``resolve_ambiguous`` was removed lost exactly the
sends whose call never arrived, 3 of its 31 ambiguous sends). Discord (a nonce the channel
deduplicates) and Twilio (a listing of the sent messages) are asked instead
(``botmesh.state.ports.AmbiguityResolver``), and the worker counts their answers
(``outboxResolvedSent`` / ``outboxResolvedUnsent``). Discord's answer is the answer of a
resend with the same nonce, the original message or the one the resend made, so it counts
every resolution as sent; Twilio's listing tells the two apart.

The channel's fake (``tests/providers/fakes``) runs in this process (``Background``), so
what reached the channel is counted outside the worker, whatever happened to it. A latency
middleware (``Latency``) holds every create call ``DELAY`` seconds before the fake sees it
and ``DELAY`` seconds before it answers, so kills land inside provider calls: a call whose
connection died in the first half never arrived (as a request still on the wire), one
killed in the second half was made and its answer lost.

The test produces ``MESSAGES`` inbounds over ``CHATS`` chats, a round at each start of the
worker, and SIGKILLs it ``KILLS`` times at random moments: in a run's first provider calls
(resolving what the run before left in flight, replaying) or after a random number of the
round's replies, each time a random fraction of a call later; it restarts it each time,
waits for a receipt of every inbound and stops the last run with SIGTERM. It asserts, at the
fake: exactly one message per inbound (0 lost, 0 twice); in the counters the runs published
on ``<prefix>.metrics`` (every 0.5 s, and at the clean stop): ``outboxAmbiguous`` 0 (every
ambiguous send was resolved by the channel; unless one was past Discord's nonce window, said
then) and the last run's resolutions as its log has them; every receipt ``sent``. It prints
the figures: kills (and the calls in flight at each), ambiguous sends found, resolved sent,
resolved unsent (from the runs' logs: one line per answer; each run's last published
counters add up to the same), duplicates and lost at the fake, and the calls the fake saw
never arrive or lose their answer. ``BOTMESH_TEST_KILL_SEED`` replays a run's kill moments.
"""

from __future__ import annotations

import asyncio
import bisect
import collections
import os
import random
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from aiohttp import web

from botmesh.state.messages import Inbound
from botmesh.streams.ops.operator import decode_metrics
from botmesh.streams.ops.tools import produce_inbound
from botmesh.topics import Catalog
from tests.kafka.kill_bot import reply_text
from tests.kafka.recorder import Tally, wait_until
from tests.kafka.worker import WAIT_S, Worker, read_all
from tests.providers.fakes.discord import FakeDiscord
from tests.providers.fakes.twilio import FakeTwilio
from tests.providers.serve import Background
from tests.soak import rounds

pytestmark = [pytest.mark.kafka, pytest.mark.crash, pytest.mark.slow, pytest.mark.soak]

MESSAGES = rounds(quick=240, soak=800)
CHATS = 8
KILLS = rounds(quick=3, soak=12)
#: Seconds each create call waits before the fake sees it, and again before it answers.
DELAY = 0.05
#: Share of the kills made in a run's first provider calls (resolving what the run before
#: left in flight, replaying), the others after some replies of the round.
STARTUP_KILLS = 1 / 3

#: Set it to the seed a run printed to replay its kill moments.
SEED_ENV = "BOTMESH_TEST_KILL_SEED"

_REPLY = re.compile(r"^echo (?P<id>\S+): ")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class Latency:
    """The aiohttp middleware ``middleware``: every POST waits ``delay`` s before the
    handler (a request whose connection closed meanwhile never arrives: the handler is not
    called) and ``delay`` s before its answer leaves (a connection closed meanwhile loses
    the answer). ``busy``: the POSTs in progress now; ``posts``: every POST so far."""

    def __init__(self, delay: float) -> None:
        self.delay = delay
        self.busy = 0
        self.posts = 0
        self.never_arrived = 0
        self.answers_lost = 0

    @staticmethod
    def _gone(request: web.Request) -> bool:
        transport = request.transport
        return transport is None or transport.is_closing()

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.method != "POST":
            return await handler(request)
        self.busy += 1
        self.posts += 1
        try:
            await asyncio.sleep(self.delay)
            if self._gone(request):
                self.never_arrived += 1
                return web.Response(status=499, text="the client went away")
            response = await handler(request)
            await asyncio.sleep(self.delay)
            if self._gone(request):
                self.answers_lost += 1
            return response
        finally:
            self.busy -= 1


@dataclass
class Channel:
    """One channel as the test drives it: its fake, the worker's environment for it, its
    chats, and the texts the fake holds (read on the fake's loop)."""

    name: str
    app: web.Application
    env: Callable[[str], dict[str, str]]
    chats: list[str]
    texts: Callable[[], list[str]]
    latency: Latency = field(default_factory=lambda: Latency(DELAY))


DISCORD_TOKEN = "MTEwMDAwMDAwMDAwMDAwMDAwMQ.GkIlLs.kill-test-token-0123456789abcdef"


def discord() -> Channel:
    chats = [f"22000000000000001{i:02d}" for i in range(CHATS)]
    fake = FakeDiscord(DISCORD_TOKEN, channels=tuple(chats))
    return Channel(
        name="discord",
        app=fake.app(),
        env=lambda url: {"DISCORD_BOT_TOKEN": DISCORD_TOKEN, "DISCORD_API_URL": f"{url}/api/v10"},
        chats=chats,
        texts=lambda: [m.content for m in fake.messages],
    )


def twilio() -> Channel:
    fake = FakeTwilio()
    chats = [f"+1555010{i:04d}" for i in range(CHATS)]
    return Channel(
        name="twilio",
        app=fake.app(),
        env=lambda url: {
            "TWILIO_ACCOUNT_SID": fake.account_sid,
            "TWILIO_AUTH_TOKEN": fake.auth_token,
            "TWILIO_FROM": "+15550009999",
            "TWILIO_API_URL": url,
        },
        chats=chats,
        texts=lambda: [str(m["body"]) for m in fake.messages],
    )


CHANNELS: dict[str, Callable[[], Channel]] = {"discord": discord, "twilio": twilio}


def inbounds(channel: Channel, run: str) -> list[Inbound]:
    """``MESSAGES`` inbounds round-robin over the channel's chats, ids ``<run>-<i>``."""
    return [
        Inbound(
            id=f"{run}-{i}",
            chat_id=channel.chats[i % len(channel.chats)],
            text=f"msg {i}",
            sender="user",
            channel=channel.name,
            ts=time.time(),
        )
        for i in range(MESSAGES)
    ]


@dataclass
class Answers:
    """What one run's log says about ambiguous sends: one line per answer of the channel
    (``botmesh.state.delivery``), so these are the run's counters, up to its last line."""

    sent: int = 0
    unsent: int = 0
    cannot_tell: int = 0
    guessed: int = 0  # left to ``on_ambiguous`` (counted in outboxAmbiguous)

    @classmethod
    def of(cls, lines: list[str]) -> Answers:
        a = cls()
        for line in lines:
            if "ambiguous send " in line and " says it went out" in line:
                a.sent += 1
            elif "ambiguous send " in line and " says it never arrived" in line:
                a.unsent += 1
            elif " is ambiguous and " in line and " cannot tell" in line:
                a.cannot_tell += 1
            elif " is ambiguous after a crash" in line:
                a.guessed += 1
        return a

    def __add__(self, other: Answers) -> Answers:
        return Answers(
            self.sent + other.sent,
            self.unsent + other.unsent,
            self.cannot_tell + other.cannot_tell,
            self.guessed + other.guessed,
        )

    @property
    def found(self) -> int:
        return self.sent + self.unsent + self.guessed


COUNTERS = ("outboxResolvedSent", "outboxResolvedUnsent", "outboxAmbiguous")


async def published_by_run(
    bootstrap: str, topic: str, starts: list[float]
) -> list[dict[str, int] | None]:
    """For each run (its start, epoch seconds, in ``starts``), the last counters it
    published on ``<prefix>.metrics`` (every ``BOTMESH_METRICS_INTERVAL``, and at a clean
    stop); ``None`` for a run killed before it published any."""
    last: list[dict[str, int] | None] = [None] * len(starts)
    for m in await read_all(bootstrap, topic):
        w = decode_metrics(m.key or b"", m.value)
        if w is None:
            continue
        run = bisect.bisect_right(starts, w.ts) - 1
        assert run >= 0, f"counters published before the first start: {w}"
        last[run] = w.counters  # one partition (one key): in the order published
    return last


@pytest.mark.timeout(300)  # a hang guard: a healthy run takes about a minute
@pytest.mark.parametrize("name", sorted(CHANNELS))
async def test_sigkilled_sends_are_resolved_by_the_channel_none_lost_none_twice(
    name: str,
    kafka_bootstrap: str,
    topic_prefix: str,
    tmp_path: Path,
    tally: Tally,
) -> None:
    channel = CHANNELS[name]()
    channel.app.middlewares.append(channel.latency.middleware)
    cat = Catalog(topic_prefix)
    records = inbounds(channel, "ck")
    ids = {r.id for r in records}
    rounds = KILLS + 1
    per_round = -(-MESSAGES // rounds)
    seed = int(os.environ.get(SEED_ENV) or random.randrange(1 << 30))
    rng = random.Random(seed)
    runs: list[Answers] = []
    starts: list[float] = []
    busy_at_kill: list[int] = []
    moments: collections.Counter[str] = collections.Counter()
    t0 = time.monotonic()

    bg = Background(channel.app)
    with bg as api:

        def replied() -> set[str]:
            return {m["id"] for t in bg.call(channel.texts) if (m := _REPLY.match(t))}

        env = {
            **channel.env(api),
            "BOTMESH_METRICS_INTERVAL": "0.5",
        }
        worker = Worker(
            kafka_bootstrap,
            topic_prefix,
            tmp_path,
            env=env,
            provider=channel.name,
            app="tests.kafka.kill_bot:bot",
            loglevel="info",
        )
        try:
            for k in range(rounds):
                starts.append(time.time())
                posts = bg.call(lambda: channel.latency.posts)
                worker.start()
                chunk = records[k * per_round : (k + 1) * per_round]
                await produce_inbound(kafka_bootstrap, cat.inbound, chunk)
                if k == KILLS:
                    break
                if rng.random() < STARTUP_KILLS:  # in its first calls: resolving, replaying
                    moments["start-up"] += 1

                    def called(since: int = posts) -> bool:
                        return bg.call(lambda: channel.latency.posts) > since

                    await wait_until(
                        called, f"a call of run {k}", check=worker.check_alive, limit=WAIT_S
                    )
                else:
                    moments["mid-traffic"] += 1
                    want = rng.randint(1, len(chunk) - 8)

                    def progressed(
                        c: frozenset[str] = frozenset(r.id for r in chunk), w: int = want
                    ) -> bool:
                        return len(c & replied()) >= w

                    await wait_until(
                        progressed,
                        f"{want} replies of round {k}",
                        check=worker.check_alive,
                        limit=WAIT_S,
                    )
                await asyncio.sleep(rng.uniform(0.0, 2 * DELAY))
                busy_at_kill.append(bg.call(lambda: channel.latency.busy))
                worker.kill()  # reaped: its log is complete
                runs.append(Answers.of(worker.lines()))
            await wait_until(
                lambda: ids <= set(tally.states()),
                "a receipt of every inbound",
                check=worker.check_alive,
                limit=WAIT_S,
            )
            assert worker.stop() == 0, worker.child.tail() if worker.child else ""
            runs.append(Answers.of(worker.lines()))
        finally:
            worker.close()
        texts = bg.call(channel.texts)
        never_arrived = bg.call(lambda: channel.latency.never_arrived)
        answers_lost = bg.call(lambda: channel.latency.answers_lost)
    elapsed = time.monotonic() - t0

    published = await published_by_run(kafka_bootstrap, cat.metrics, starts)
    per_inbound = collections.Counter(m["id"] for t in texts if (m := _REPLY.match(t)))
    duplicates = {i: n for i, n in per_inbound.items() if n > 1}
    lost = ids - set(per_inbound)
    states = collections.Counter(str(r.state) for r in tally.receipts)
    total = sum(runs, Answers())
    counted = {c: sum(p.get(c, 0) for p in published if p is not None) for c in COUNTERS}
    print(
        f"\n  {name}: {KILLS} SIGKILLs ({dict(moments)}; calls in flight at each kill "
        f"{busy_at_kill}) in {elapsed:.0f}s (seed {seed}); ambiguous sends found "
        f"{total.found}: resolved sent {total.sent}, resolved unsent {total.unsent}, left to "
        f"the policy {total.guessed}; at the fake: {len(texts)} messages for {len(ids)} "
        f"inbounds, {sum(n - 1 for n in duplicates.values())} duplicates, {len(lost)} lost, "
        f"{never_arrived} calls that never arrived, {answers_lost} answers lost; counters "
        f"published (each run's last) {counted}; receipts {dict(states)}"
    )
    if total.found == 0:
        print(f"  {name}: no kill left an ambiguous send this time (only 0 lost, 0 twice shown)")

    assert not duplicates, f"{len(duplicates)} inbounds answered more than once: {duplicates}"
    assert not lost, f"{len(lost)} inbounds never answered, e.g. {sorted(lost)[:5]}"
    assert sorted(texts) == sorted(reply_text(r.id, r.text) for r in records)
    # the clean stop published the last run's counters: they match its log
    final = published[-1]
    assert final is not None, f"the last run published no counters on {cat.metrics}"
    logged = {COUNTERS[0]: runs[-1].sent, COUNTERS[1]: runs[-1].unsent}
    assert {c: final.get(c) for c in COUNTERS[:2]} == logged, (final, runs[-1])
    if total.cannot_tell:  # past the channel's window (Discord's nonce): the policy decided
        print(f"  {name}: {total.cannot_tell} ambiguous sends the channel could not tell")
        return
    ambiguous = [p.get("outboxAmbiguous") for p in published if p is not None]
    assert set(ambiguous) == {0}, f"a run left ambiguous sends to the policy: {ambiguous}"
    assert total.guessed == 0, total
    assert set(states) == {"sent"}, f"every send settled sent: {dict(states)}"
