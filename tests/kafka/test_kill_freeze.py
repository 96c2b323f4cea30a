"""A worker frozen past its session timeout (``SIGSTOP``), its partitions taken over by a
peer, then thawed (``SIGCONT``): it must not write into the journal it no longer owns.

Under ``at_least_once`` nothing on the broker stops a worker that lost its partitions from
producing to their changelog, and a thawed worker does not know yet that it was evicted:
its event loop resumes the turns it was in the middle of (a provider call answered while it
was frozen, a write that was due) before its consumer hears from the group coordinator.
The journal refuses every write while the worker's membership was last confirmed more than
half the session timeout ago (``botmesh.streams.table_kv``: "Fenced by the group").

A thawed worker either gives up the batch it held and exits (status 75), and is started
again as a supervisor would, or rejoins: its consumer hears that its session expired, drops
its partitions (``lost``: nothing of them committed, their journal partitions closed), and
restores from the changelog whatever the rejoin gives it. Under ``exactly_once`` its open
transaction was aborted by the coordinator meanwhile (``transaction.timeout.ms``), and its
producer, fenced by the epoch bump, makes it exit 75; its journal writes are refused until
the coordinator lists it again, and a transaction it has open then is aborted, not
committed. (On the Faust runtime this test found six faults, among them a standby replica
that skipped records and a restore that ended before it had read the records it fetched.)

The evidence is the changelog itself: every record carries the header ``botmesh.writer`` =
``<instance id>@<group generation>``. After the thaw, no record may come from the frozen
worker under the generation it had before the freeze; the peer's records written during
the freeze (under a newer generation) show it took the partitions over. The recorder in
this process counts the effects: 0 lost, 0 sent twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from pathlib import Path

import pytest

from botmesh.streams.table_kv import changelog_topic
from botmesh.streams.worker.changelog import TIMED_OUT_TXN
from botmesh.streams.worker.loop import EXIT_ABANDONED
from botmesh.topics import Catalog
from tests.kafka.recorder import Recorder, Tally, check_effects
from tests.kafka.test_kills import GUARANTEES, Flow, alive, peers, produced_after, waiting
from tests.kafka.worker import WAIT_S, read_all

pytestmark = [pytest.mark.kafka, pytest.mark.crash]

#: How long the worker stays frozen: well past the 6 s session timeout and the 10 s leases
#: (``PEER_LEASE``), so its partitions and the records it held are taken over meanwhile.
FREEZE_S = 20.0


def writers(records: list[object]) -> list[tuple[str, int, float]]:
    """(instance id, generation, producer time in s) of each changelog record."""
    out = []
    for m in records:
        headers = dict(getattr(m, "headers", None) or ())
        raw = headers.get("botmesh.writer")
        assert raw is not None, "a changelog record without its writer header"
        instance, _, generation = raw.decode().rpartition("@")
        out.append((instance, int(generation), getattr(m, "timestamp", 0) / 1000))
    return out


#: What a worker that gave its batch up says: the journal refused its writes (membership
#: unconfirmed) or, under exactly_once, a newer transactional producer fenced it, or the
#: transaction coordinator had aborted the transaction it held over the freeze (its
#: ``transaction.timeout.ms`` is shorter than the freeze).
FENCED = (
    "membership stays unconfirmed",
    "group membership was last confirmed",
    "fenced by a newer producer",
    "ProducerFenced",
    TIMED_OUT_TXN,
)


def abandoned(status: int, lines: list[str], tail: str) -> None:
    """A worker's exit was the documented one: status 75, having been fenced."""
    assert status == EXIT_ABANDONED, (status, tail)
    assert any(w in line for line in lines for w in FENCED), tail


@pytest.mark.timeout(600)  # a hang guard: a healthy run takes about a minute
@pytest.mark.parametrize("guarantee", GUARANTEES)
async def test_a_thawed_worker_writes_nothing_under_the_generation_it_lost(
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
    frozen, peer = peers(kafka_bootstrap, topic_prefix, tmp_path, recorder, env)
    both = (frozen, peer)
    flow = Flow(kafka_bootstrap, cat.inbound, "fz").start()
    try:
        frozen.start()
        peer.start()
        await waiting(
            lambda: all(recorder.first_from(w.pid) is not None for w in both),
            "a send from each worker",
            both,
            lambda: alive(*both),
        )
        since = len(recorder)
        await waiting(
            lambda: recorder.sends_from(frozen.pid, since) >= 10,
            "the worker to freeze is mid-stream",
            both,
            lambda: alive(*both),
        )
        os.kill(frozen.pid, signal.SIGSTOP)
        frozen_at = time.time()
        # the peer answers what is produced up to a second after the freeze, on every
        # partition (the frozen worker's partitions and the records it held move to it)
        pending = await produced_after(flow)
        await tally.until_accounted(recorder, pending, peer.check_alive, WAIT_S)
        took_over_s = time.time() - frozen_at
        await asyncio.sleep(max(0.0, FREEZE_S - took_over_s))
        thawed_at = time.time()
        os.kill(frozen.pid, signal.SIGCONT)
        since, thawed = len(recorder), frozen.child
        assert thawed is not None
        said = len(thawed.lines)
        # it rejoins the group, or gives up the batch it held (it cannot be confirmed while
        # that batch holds its rebalance) and exits to start afresh. A send of its after the
        # thaw says neither: a provider call it was in the middle of ends first (its result
        # is then refused by the journal), before it is fenced and exits
        await waiting(
            # (``group generation N``: the worker's line when a rebalance assigns to it)
            lambda: not thawed.alive() or any("group generation" in x for x in thawed.lines[said:]),
            "the thawed worker rejoins or exits",
            both,
            peer.check_alive,
        )
        exited = None if thawed.alive() else thawed.stop()  # reaped: its pipes closed
        restarts: list[str] = []

        def supervise() -> None:
            """As a supervisor would: a worker that gave its batch up is started again. Under
            exactly_once the rebalances of a restart can move a partition while a worker's
            transaction on it is open; the new owner's producer fences it and it exits 75
            too (docs/worker.md), so this holds after the thaw, for either worker."""
            for w in both:
                if w.child is not None and not w.child.alive():
                    abandoned(w.child.stop(), w.child.lines, w.child.tail(40))
                    restarts.append(w.instance)
                    assert len(restarts) <= 4, f"restarted over and over: {restarts}"
                    w.start()

        if exited is not None:
            abandoned(exited, thawed.lines, thawed.tail(40))
            frozen.start()  # as its supervisor would
            await waiting(
                lambda: recorder.first_from(frozen.pid, since) is not None,
                "a send from the restarted worker",
                both,
                supervise,
            )
        await flow.stop()
        await tally.until_accounted(recorder, flow.produced, supervise, WAIT_S)
        assert frozen.stop() == 0
        assert peer.stop() == 0
    finally:
        flow.cancel()
        for w in both:
            with contextlib.suppress(Exception):  # never leave a stopped process behind
                os.kill(w.pid, signal.SIGCONT)
            w.close()

    # what a restore sees: under exactly_once the thawed worker's late records are appended
    # to the log in its transaction, which the peer's producer fenced, so they are aborted
    written = writers(await read_all(kafka_bootstrap, changelog_topic(cat), committed=True))
    before = [g for who, g, at in written if who == frozen.instance_id and at < frozen_at]
    assert before, "the frozen worker wrote nothing before the freeze"
    lost_generation = max(before)
    zombie = [
        (g, at - thawed_at)
        for who, g, at in written
        if who == frozen.instance_id and g <= lost_generation and at >= thawed_at
    ]
    taken = [
        g
        for who, g, at in written
        if who == peer.instance_id and frozen_at < at < thawed_at and g > lost_generation
    ]
    refused = [line for line in thawed.lines if "group membership was last confirmed" in line]
    reloaded = any("missed a rebalance" in line for line in thawed.lines)
    assert taken, "the peer wrote nothing under a newer generation while the worker was frozen"
    assert zombie == [], f"{len(zombie)} records written under a lost generation: {zombie[:5]}"
    out = check_effects(recorder, tally, flow.produced)
    print(
        f"\n  frozen {thawed_at - frozen_at:.1f}s (generation {lost_generation}); the peer "
        f"answered everything pending {took_over_s:.1f}s after the freeze and wrote "
        f"{len(taken)} records under generation(s) {sorted(set(taken))}; after the thaw the "
        f"frozen worker wrote {len(zombie)} records under its lost generation, "
        f"{len(refused)} log lines of writes refused, "
        f"{'its partitions reloaded, ' if reloaded else ''}"
        f"{'exited ' + str(exited) + ' and restarted' if exited is not None else 'rejoined'}; "
        f"{len(restarts)} later exit(s) of a fenced worker, restarted ({restarts}); "
        f"{out}"
    )
