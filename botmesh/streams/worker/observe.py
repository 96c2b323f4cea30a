"""What operators see of a worker on librdkafka: ``/readyz``'s answer, what a ``/metrics``
scrape samples, and the counters it publishes to ``<prefix>.metrics``.

Readiness, in the order it is asked: a worker stopping, or not started yet, is not ready; a
rebalance in progress (the consumer inside a rebalance callback), a journal partition
being restored from its changelog or recovered, a membership not confirmed lately
(``Membership``), or an assignment that owns nothing while some inbound partition has no
owner (``AssignmentWatch``) each say why not. A worker that owns no partition because the
group's other members own them all is ready and idle.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Protocol

from botmesh.observability.http import Readiness
from botmesh.observability.metrics import WorkerSources
from botmesh.streams.membership import AssignmentWatch
from botmesh.streams.retry_tiers import RetryTiers
from botmesh.streams.runner import InboundRunner, RuntimeLike
from botmesh.streams.table_kv import TableKv
from botmesh.streams.worker.changelog import RdChangelog
from botmesh.streams.worker.consumer import ConsumerThread
from botmesh.topics.catalog import Catalog
from botmesh.topics.status_records import metrics_record

__all__ = ["Observed", "WorkerParts"]

log = logging.getLogger("botmesh.streams")


class Confirmed(Protocol):
    """The worker's membership, as readiness asks it (``loop.Membership``)."""

    def unconfirmed(self) -> str | None: ...


class WorkerParts(Protocol):
    """What ``Observed`` reads of a worker (``loop.Worker`` has it): its parts, named here
    so this module needs nothing of the loop's."""

    @property
    def cat(self) -> Catalog: ...
    @property
    def instance(self) -> str: ...
    @property
    def stopping(self) -> bool: ...
    @property
    def started(self) -> bool: ...
    @property
    def restoring(self) -> set[int]: ...
    @property
    def consumer(self) -> ConsumerThread: ...
    @property
    def watch(self) -> AssignmentWatch: ...
    @property
    def kv(self) -> TableKv | None: ...
    @property
    def membership(self) -> Confirmed: ...
    @property
    def runtime(self) -> RuntimeLike: ...
    @property
    def runner(self) -> InboundRunner: ...
    @property
    def tiers(self) -> RetryTiers: ...
    @property
    def changelog(self) -> RdChangelog: ...


class Observed:
    """A worker's readiness and samples, read from its parts (see the module docstring)."""

    def __init__(self, worker: WorkerParts) -> None:
        self.w = worker

    def readiness(self) -> Readiness:
        w = self.w
        inbound = w.cat.inbound
        if w.stopping:
            return Readiness(False, "stopping")
        if not w.started:
            return Readiness(False, "starting: the bot's runtime is not started yet")
        if w.consumer.rebalancing:
            return Readiness(False, "the group is rebalancing")
        if w.restoring:
            return Readiness(
                False, f"restoring {len(w.restoring)} journal partitions from the changelog"
            )
        if not w.watch.ready:
            return Readiness(False, f"joining the group: owns no partition of {inbound} yet")
        mine = set(w.consumer.partitions)
        kv = w.kv
        if kv is not None:
            closed = sorted(p for p in mine if not kv.owns(p))
            if closed:
                return Readiness(False, f"journal partitions {closed} not open yet")
            recovering = sorted(kv.recovering & mine)
            if recovering:
                return Readiness(False, f"recovering journal partitions {recovering}")
            stale = w.membership.unconfirmed()
            if stale is not None:
                return Readiness(False, stale)
        if not mine:
            return Readiness(
                True, f"idle: the group's other members own every partition of {inbound}"
            )
        return Readiness(True, f"owns partitions {sorted(mine)} of {inbound}")

    def sources(self) -> WorkerSources:
        """What a scrape samples from this worker."""
        w = self.w

        def counters() -> dict[str, int]:
            ops = w.runtime.durability if w.started else None
            return ops.metrics() if ops is not None else {}

        return WorkerSources(
            counters=counters,
            forced_rebalances=lambda: w.watch.forced,
            dead_letters=lambda: dict(w.runner.letters),
            ready=lambda: self.readiness().ready,
            partitions_owned=lambda: len(w.consumer.partitions),
            partitions_restoring=lambda: len(w.restoring),
            lag=lambda: dict(w.consumer.lag),
            parked=lambda: dict(w.tiers.parked),
            unsettled=lambda: w.runner.unsettled,
        )

    async def publish(self) -> None:
        """The engine's counters, the readiness and the partitions restoring, produced once
        to ``<prefix>.metrics`` keyed by the instance id (best effort, bounded)."""
        w = self.w
        ops = w.runtime.durability if w.started else None
        if ops is None:
            return
        counters = ops.metrics()
        counters["forcedRebalances"] = w.watch.forced
        readiness = self.readiness()
        key, value = metrics_record(
            w.instance,
            counters,
            time.time(),
            ready=readiness.ready,
            why=readiness.why,
            restoring=len(w.restoring),
        )
        topic = w.cat.metrics

        async def send() -> None:
            await (await w.changelog.send(topic, key, value))

        try:  # bounded: a broker that is down must not hold up a clean stop
            await asyncio.wait_for(send(), timeout=10.0)
        except Exception as exc:  # counters are best effort: never stop the worker
            log.warning("cannot publish the metrics to %s: %s: %s", topic, type(exc).__name__, exc)

    async def publish_every(self, seconds: float, stopping: Callable[[], bool]) -> None:
        """``publish`` every ``seconds`` until cancelled."""
        while not stopping():
            await asyncio.sleep(seconds)
            await self.publish()
