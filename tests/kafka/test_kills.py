"""Kill tests of real workers on a real broker, counting effects outside the workers.

Each test runs ``botmesh worker`` processes (``tests.kafka.worker.Worker``) whose provider
POSTs every send to a recorder in this process (``tests.kafka.recorder.Recorder``), so a
send a worker made and never journaled (it was SIGKILLed) is still counted. The evidence a
test checks at the end:

- lost: an inbound id that is not accounted for (its reply is not at the recorder, no
  receipt says its send settled ``dead`` or ``unknown``, it is not in the inbound DLQ);
- duplicates: a send (one text per inbound) that reached the recorder more than once. The
  bot runs with the default ``on_ambiguous="skip"``: an ambiguous send becomes ``unknown``
  and is never sent again, so every test expects 0 duplicates.

Each test prints what it measured (``pytest -s`` shows it). Every wait ends as soon as its
condition holds; the time limits are hang guards only.

- ``test_random_sigkills_lose_nothing_and_send_nothing_twice``: one worker SIGKILLed
  ``KILLS`` times at random moments (mid-batch after a random number of replies, or during
  its start-up), a new round of inbounds at each start; then the journal is read back (the
  changelog of the journal on Kafka, ``botmesh.streams.table_kv.decode_entry``) and checked against
  the recorder: every inbound settled, every call a send the journal knows (``sent`` or
  ``unknown``), every ``sent`` one a call the recorder has.
- ``test_survivor_of_a_killed_peer_resends_nothing``: two workers in one group (own data
  dirs and instance ids, one prefix), one of them SIGKILLed mid-stream ``PEER_KILLS`` times
  while traffic flows; each time the survivor takes its partitions over (everything
  produced up to a second after the kill, on every partition, gets answered while it is
  down: within the session timeout and the leases, 10 s here instead of 60 s), then it
  restarts and rejoins.
- ``test_joins_and_leaves_under_traffic_send_nothing_twice``: a second and a third worker
  join the group and leave it (clean stops) while traffic flows; no fault. Six partitions,
  so that every join moves some to the new worker; after each leave, what is produced in
  the next second (on the leaver's partitions too) is answered by the others.

The two-worker tests run under both processing guarantees (``GUARANTEES``): under
``exactly_once`` they found (on the Faust runtime) a restore that ended before it had read
what it fetched and one that a rebalance overtook (the new owner sent replies again).

The recovery tests (offsets reset to the earliest, data dir deleted) are in
``test_kill_recovery.py``, the broker stopped and started in ``test_kill_broker.py``.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import random
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from botmesh.streams.ops.tools import produce_inbound
from botmesh.streams.provision import ensure_topics
from botmesh.topics import Catalog
from tests.kafka.bot import bot
from tests.kafka.recorder import (
    CHATS,
    SESSION_TIMEOUT,
    Recorder,
    Tally,
    check_effects,
    describe_group,
    traffic,
    wait_until,
)
from tests.kafka.unknowns import check_unknown_sends, recorder_callers
from tests.kafka.worker import WAIT_S, Worker, journal_source, read_journal
from tests.soak import rounds, seed

pytestmark = [pytest.mark.kafka, pytest.mark.crash]


async def sleep_alive(worker: Worker, seconds: float) -> None:
    """Sleep ``seconds`` (a chosen moment, not a wait for a condition), checking the worker."""
    end = time.monotonic() + seconds
    while (left := end - time.monotonic()) > 0:
        worker.check_alive()
        await asyncio.sleep(min(left, 0.05))


def alive(*workers: Worker) -> None:
    for w in workers:
        w.check_alive()


def first_reply_s(recorder: Recorder, runs: list[tuple[int, float]]) -> list[float]:
    """For each run (pid, start time): seconds from its start to its first send, for the
    runs that sent anything."""
    first: dict[int, float] = {}
    for c in recorder.calls():
        first.setdefault(c.pid, c.at)
    return [first[pid] - t0 for pid, t0 in runs if pid in first]


def figures(values: list[float]) -> str:
    if not values:
        return "none"
    return (
        f"min {min(values):.1f}s, median {statistics.median(values):.1f}s, "
        f"max {max(values):.1f}s over {len(values)}"
    )


# -- 1. random SIGKILLs of one worker ------------------------------------------------------

KILLS = rounds(quick=6, soak=20)
PER_ROUND = 120  # inbounds produced at each (re)start


@pytest.mark.soak
@pytest.mark.timeout(600)  # a hang guard: a healthy run takes a few minutes at most
async def test_random_sigkills_lose_nothing_and_send_nothing_twice(
    kafka_bootstrap: str,
    topic_prefix: str,
    tmp_path: Path,
    recorder: Recorder,
    tally: Tally,
) -> None:
    cat = Catalog(topic_prefix)
    worker = Worker(kafka_bootstrap, topic_prefix, tmp_path, recorder=recorder.url)
    records = traffic("rk", (KILLS + 1) * PER_ROUND)
    ids = {r.id for r in records}
    rng = random.Random(seed(20261202))
    runs: list[tuple[int, float]] = []
    moments: collections.Counter[str] = collections.Counter()
    t_start = time.monotonic()
    try:
        for k in range(KILLS + 1):
            worker.start()
            runs.append((worker.pid, time.monotonic()))
            chunk = records[k * PER_ROUND : (k + 1) * PER_ROUND]
            await produce_inbound(kafka_bootstrap, cat.inbound, chunk)
            if k == KILLS:
                break
            if rng.random() < 0.25:  # during its start-up (joining, recovering, replaying)
                moments["start-up"] += 1
                await sleep_alive(worker, rng.uniform(0.0, 2.5))
            else:  # mid-stream: after a random number of this round's replies
                moments["mid-stream"] += 1
                want = rng.randint(1, PER_ROUND - 20)

                def replied(
                    c: frozenset[str] = frozenset(r.id for r in chunk), w: int = want
                ) -> bool:
                    return len(c & recorder.answered()) >= w

                await wait_until(
                    replied, f"{want} replies of round {k}", check=worker.check_alive, limit=WAIT_S
                )
                await asyncio.sleep(rng.uniform(0.0, 0.05))
            worker.kill()
        await tally.until_accounted(recorder, ids, worker.check_alive, WAIT_S)
        elapsed = time.monotonic() - t_start
        assert worker.stop() == 0, worker.child.tail() if worker.child else ""
    finally:
        worker.close()

    out = check_effects(recorder, tally, ids)

    # the journal: every inbound settled; duplicates only ever for sends it calls unknown
    journal = await read_journal(worker)
    inbox = {v["id"]: v for k, v in journal.items() if k.startswith(f"{bot.scope}/in/")}
    outbox = {v["key"]: v for k, v in journal.items() if k.startswith(f"{bot.scope}/out/")}
    states = collections.Counter(v["state"] for v in inbox.values())
    assert set(inbox) == ids, f"{len(ids - set(inbox))} inbounds not in the journal"
    assert set(states) <= {"done", "dead"}, states
    send_states = collections.Counter(v["state"] for v in outbox.values())
    assert set(send_states) <= {"sent", "dead", "unknown"}, send_states
    message_ids = {c.message_id for c in recorder.calls()}
    for key, v in outbox.items():
        if v["state"] == "sent":
            assert v["message_id"] in message_ids, f"{key} is sent but the recorder has no call"
    for c in recorder.calls():
        record = outbox.get(f"{c.inbound_id}:1")
        assert record is not None, f"a provider call the journal does not know: {c}"
        assert record["state"] in ("sent", "unknown"), (c, record)
    left = check_unknown_sends(
        outbox, recorder_callers(recorder.calls()), worker.killed, chats=CHATS
    )
    print(
        f"  {KILLS} SIGKILLs ({dict(moments)}), {len(runs)} runs in {elapsed:.0f}s; journal "
        f"read from the {journal_source(worker)}: inbox {dict(states)}, sends "
        f"{dict(send_states)}, {left}; time to first reply after a start: "
        f"{figures(first_reply_s(recorder, runs))}; {out['duplicates']} duplicates, "
        f"{out['lost']} lost"
    )


# -- traffic that keeps flowing, and what the workers said ----------------------------------


class Flow:
    """Inbounds produced in the background, ``step`` every ``pause`` seconds (25 a second: what
    two workers on the journal on Kafka keep up with on a small machine, with room), until
        :meth:`stop`; ``produced`` holds the ids produced so far."""

    def __init__(self, bootstrap: str, topic: str, run: str, step: int = 5) -> None:
        self.bootstrap, self.topic, self.run, self.step = bootstrap, topic, run, step
        self.produced: set[str] = set()
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> Flow:
        self._task = asyncio.ensure_future(self._flow())
        return self

    async def _flow(self, pause: float = 0.2) -> None:
        n = 0
        while not self._stop.is_set():
            chunk = traffic(f"{self.run}{n}", self.step, start=n * self.step)
            n += 1
            await produce_inbound(self.bootstrap, self.topic, chunk)
            self.produced.update(r.id for r in chunk)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), pause)

    async def stop(self) -> None:
        self._stop.set()
        if self._task is not None:
            await self._task

    def cancel(self) -> None:
        self._stop.set()
        if self._task is not None:
            self._task.cancel()


async def produced_after(flow: Flow, seconds: float = 1.0) -> set[str]:
    """What the flow produced up to ``seconds`` from now (records after an event)."""
    await asyncio.sleep(seconds)
    return set(flow.produced)


_NOTABLE = ("assigned", "Ready", "revoked", "loaded", "ERROR", "CRITICAL", "Traceback", "exit")


def logs(*workers: Worker) -> str:
    """What each worker said of note lately (assignments, errors), for a failed wait."""
    out = []
    for w in workers:
        lines = [
            line[:240]
            for line in w.lines()
            if any(n in line for n in _NOTABLE) and "refuses this send" not in line
        ]
        out.append(f"-- worker {w.instance} (run {w.runs}):\n" + "\n".join(lines[-25:]))
    return "\n".join(out)


async def waiting(
    cond: Callable[[], bool], what: str, workers: Sequence[Worker], check: Callable[[], None]
) -> float:
    """``wait_until`` that shows the workers' notable lines when it fails."""
    try:
        return await wait_until(cond, what, check=check, limit=WAIT_S)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{logs(*workers)}") from None


# -- 2. two workers in one group, one killed again and again ----------------------------------

PEER_KILLS = rounds(quick=2, soak=5)
#: The two-worker tests run under both processing guarantees.
GUARANTEES = ["at_least_once", "exactly_once"]
#: The inbox and outbox leases of the two workers (default 60s): the survivor replays the
#: victim's pending records once their leases expired, so this bounds each takeover.
PEER_LEASE = "10s"


def peers(
    bootstrap: str,
    prefix: str,
    tmp: Path,
    recorder: Recorder,
    env: dict[str, str] | None = None,
) -> tuple[Worker, Worker]:
    """Two workers ``a`` and ``b`` of one group, each with its own data dir and instance id,
    on a 6 s session timeout and ``PEER_LEASE`` leases, sending to ``recorder``; ``env``
    adds to their environment (the processing guarantee, say)."""

    def worker(name: str) -> Worker:
        return Worker(
            bootstrap,
            prefix,
            tmp / name,
            instance=name,
            recorder=recorder.url,
            env={**SESSION_TIMEOUT, "BOTMESH_TEST_LEASE": PEER_LEASE, **(env or {})},
            loglevel="info",
        )

    return worker("a"), worker("b")


@pytest.mark.soak
@pytest.mark.timeout(600)  # a hang guard: a healthy run takes a few minutes at most
@pytest.mark.parametrize("guarantee", GUARANTEES)
async def test_survivor_of_a_killed_peer_resends_nothing(
    kafka_bootstrap: str,
    topic_prefix: str,
    tmp_path: Path,
    recorder: Recorder,
    tally: Tally,
    *,
    guarantee: str,
) -> None:
    cat = Catalog(topic_prefix)
    env = {"BOTMESH_PROCESSING_GUARANTEE": guarantee}
    survivor, victim = peers(kafka_bootstrap, topic_prefix, tmp_path, recorder, env)
    both = (survivor, victim)
    rng = random.Random(seed(8))
    takeovers: list[float] = []
    rejoins: list[float] = []
    flow = Flow(kafka_bootstrap, cat.inbound, "pk").start()

    def check() -> None:
        alive(*both)

    try:
        survivor.start()
        victim.start()
        t0 = time.monotonic()
        # both hold partitions: each has sent something
        await waiting(
            lambda: all(recorder.first_from(w.pid) is not None for w in both),
            "a send from each worker",
            both,
            check,
        )
        rejoins.append(time.monotonic() - t0)
        for k in range(PEER_KILLS):
            since, pid, want = len(recorder), victim.pid, rng.randint(1, 40)

            def victim_sent(p: int = pid, s: int = since, w: int = want) -> bool:
                return recorder.sends_from(p, s) >= w

            await waiting(victim_sent, f"{want} sends from the victim in round {k}", both, check)
            victim.kill()
            killed_at = time.monotonic()
            # records produced after the kill, on every partition: only a takeover answers
            # the victim's share
            pending = await produced_after(flow)
            try:
                await tally.until_accounted(recorder, pending, survivor.check_alive, WAIT_S)
            except AssertionError as exc:
                raise AssertionError(f"{exc}\n{logs(*both)}") from None
            takeovers.append(time.monotonic() - killed_at)
            victim.start()  # back again: it rejoins the group and gets partitions
            started, since = time.monotonic(), len(recorder)

            def back(p: int = victim.pid, s: int = since) -> bool:
                return recorder.first_from(p, s) is not None

            await waiting(back, f"a send from the restarted victim in round {k}", both, check)
            rejoins.append(time.monotonic() - started)
        await flow.stop()
        await tally.until_accounted(recorder, flow.produced, check, WAIT_S)
        assert victim.stop() == 0
        assert survivor.stop() == 0
    finally:
        flow.cancel()
        victim.close()
        survivor.close()

    by_pid = collections.Counter(c.pid for c in recorder.calls())
    print(
        f"\n  {PEER_KILLS} SIGKILLs of one of two workers; the survivor answered everything "
        f"pending {figures(takeovers)} after a kill; the (re)started worker sent "
        f"{figures(rejoins)} after its start; calls per process {dict(by_pid)}"
    )
    check_effects(recorder, tally, flow.produced, killed=victim.killed)


@pytest.mark.timeout(600)  # a hang guard: a healthy run takes about a minute
@pytest.mark.parametrize("guarantee", GUARANTEES)
async def test_a_peer_that_joins_behind_takes_over_without_resending(
    kafka_bootstrap: str,
    topic_prefix: str,
    tmp_path: Path,
    recorder: Recorder,
    tally: Tally,
    *,
    guarantee: str,
) -> None:
    """The second worker joins a group whose journal already holds hundreds of records:
    whatever it copies of its peer's partitions (a standby replica under
    ``at_least_once``) starts with a backlog, not at the live end. Its peer is then
    SIGKILLed: the takeover must know every send the peer made. A standby that lost the
    backlog it fetched first sent 37 replies again (the freeze test on CI, where the
    second worker happened to join late)."""
    cat = Catalog(topic_prefix)
    env = {"BOTMESH_PROCESSING_GUARANTEE": guarantee}
    first, late = peers(kafka_bootstrap, topic_prefix, tmp_path, recorder, env)
    both = (first, late)
    flow = Flow(kafka_bootstrap, cat.inbound, "jb").start()
    try:
        first.start()
        await waiting(
            lambda: len(recorder) >= 200, "200 sends from the first worker", both, first.check_alive
        )
        late.start()
        await waiting(
            lambda: recorder.first_from(late.pid) is not None,
            "a send from the late worker",
            both,
            lambda: alive(*both),
        )
        await asyncio.sleep(1.0)  # its copies of the peer's partitions are under way
        first.kill()
        killed_at = time.monotonic()
        pending = await produced_after(flow)
        await tally.until_accounted(recorder, pending, late.check_alive, WAIT_S)
        took_over = time.monotonic() - killed_at
        await flow.stop()
        await tally.until_accounted(recorder, flow.produced, late.check_alive, WAIT_S)
        assert late.stop() == 0
    finally:
        flow.cancel()
        first.close()
        late.close()

    print(f"\n  the late worker answered everything pending {took_over:.1f}s after the kill")
    check_effects(recorder, tally, flow.produced, killed=first.killed)


# -- 3. workers joining and leaving under traffic, no fault -----------------------------------


#: Enough partitions that each of the three workers holds some, and every join or leave
#: moves some.
JOIN_PARTITIONS = 6


@pytest.mark.timeout(600)  # a hang guard: a healthy run takes a few minutes at most
@pytest.mark.parametrize("guarantee", GUARANTEES)
async def test_joins_and_leaves_under_traffic_send_nothing_twice(
    kafka_bootstrap: str,
    topic_prefix: str,
    tmp_path: Path,
    recorder: Recorder,
    *,
    guarantee: str,
) -> None:
    cat = Catalog(topic_prefix)
    ensure_topics(kafka_bootstrap, cat.specs(partitions=JOIN_PARTITIONS))
    tally = await Tally(kafka_bootstrap, cat.sent, cat.inbound_dlq).start()
    a, b, c = workers = [
        Worker(
            kafka_bootstrap,
            topic_prefix,
            tmp_path / name,
            instance=name,
            recorder=recorder.url,
            env={**SESSION_TIMEOUT, "BOTMESH_PROCESSING_GUARANTEE": guarantee},
            loglevel="info",
            partitions=JOIN_PARTITIONS,
        )
        for name in "abc"
    ]
    running: list[Worker] = []
    steps: list[str] = []

    def check() -> None:
        alive(*running)

    def group() -> tuple[str, dict[str, list[int]]]:
        return describe_group(kafka_bootstrap, cat.group, cat.inbound)

    async def join(w: Worker) -> None:
        w.start()
        running.append(w)
        t0 = time.monotonic()
        names = {x.instance_id for x in running}
        # a member of the stable group, with the inbound's partitions shared among the members,
        # each holding some: every join moves partitions to the new worker
        await waiting(
            lambda: (
                (g := group())[0] == "STABLE"
                and set(g[1]) == names
                and sorted(p for ps in g[1].values() for p in ps) == list(range(JOIN_PARTITIONS))
                and all(g[1].values())
            ),
            f"{w.instance} joined the group",
            workers,
            check,
        )
        pending = set(flow.produced)
        await tally.until_accounted(recorder, pending, check, WAIT_S)
        steps.append(
            f"{w.instance} joined ({group()[1]}), all answered {time.monotonic() - t0:.1f}s "
            "after its start"
        )

    async def leave(w: Worker) -> None:
        running.remove(w)
        assert w.stop() == 0, w.child.tail() if w.child else ""
        t0 = time.monotonic()
        pending = await produced_after(flow)  # its partitions' records move to the others
        try:
            await tally.until_accounted(recorder, pending, check, WAIT_S)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{logs(*workers)}") from None
        steps.append(f"{w.instance} left, all answered {time.monotonic() - t0:.1f}s later")

    flow = Flow(kafka_bootstrap, cat.inbound, "jl").start()
    try:
        await join(a)
        await join(b)
        await join(c)
        await leave(b)
        await leave(c)
        await flow.stop()
        await tally.until_accounted(recorder, flow.produced, check, WAIT_S)
        await leave(a)
    finally:
        flow.cancel()
        for w in workers:
            w.close()
        await tally.close()

    by_pid = collections.Counter(call.pid for call in recorder.calls())
    print(
        f"\n  joins and leaves under traffic: {'; '.join(steps)}; calls per process {dict(by_pid)}"
    )
    check_effects(recorder, tally, flow.produced)
