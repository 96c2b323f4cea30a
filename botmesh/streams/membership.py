"""The worker's place in its consumer group: it joins only once the broker lists every topic
it subscribes to, and it never sits on an empty assignment that nobody else covers.

Two hazards, both silent before (a worker that said it was ready and answered nothing):

- **Topics not listed yet.** The group's leader computes the assignment from the metadata
  its consumer holds at that moment. A topic just created (by the worker's provisioning, by
  ``botmesh topics create`` a moment before) may not be in a broker's metadata yet; the
  leader then skips it (librdkafka: ``Subscribed topic not available``) and assigns nothing
  of it until the consumer refreshes its metadata. ``wait_for_topics`` holds the join until
  the broker lists every subscribed topic with a leader for each partition, and gives up
  after ``BOTMESH_TOPIC_WAIT`` seconds naming the topics it still misses.
- **An empty assignment that sticks.** A static member (``--instance-id``) that rejoins
  gets its last assignment back from the coordinator without a rebalance (KIP-345), so an
  empty one sticks across restarts. ``AssignmentWatch`` checks a worker that owns no
  partition of the inbound: when the group is stable and some inbound partitions have no
  owner among its members, it removes this worker from the group (LeaveGroup by instance
  id, or by member id for a dynamic member), which makes the consumer join again and the
  group rebalance; it logs why and counts it (``forcedRebalances``). A worker that owns no
  partition because the group's other members own them all (more workers than partitions)
  is left as it is. (librdkafka's consumer does not join while no subscribed topic is
  listed, and the worker waits for its topics before it subscribes; the watch stays as the
  net for an assignment computed from metadata that lacked them.)

``AssignmentWatch.ready`` is the readiness the worker reports: true while it owns inbound
partitions, or owns none and none is left without an owner.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from botmesh.streams.connection import Brokers, KafkaAuthError, list_topics
from botmesh.streams.groups import GroupInfo, Member, admin_client, describe, remove_members

__all__ = [
    "WORKER_COUNTERS",
    "AssignmentWatch",
    "TopicsNotListed",
    "unlisted_topics",
    "wait_for_topics",
]

#: The worker's own counters, published beside the engine's on ``<prefix>.metrics``.
WORKER_COUNTERS = ("forcedRebalances",)

log = logging.getLogger("botmesh.streams")

#: Seconds between two lines saying what the join still waits for.
_SAY_EVERY_S = 10.0


class TopicsNotListed(Exception):
    """The broker's metadata still lacks some subscribed topics after the wait's limit."""

    def __init__(self, missing: Mapping[str, str], waited: float) -> None:
        self.missing = dict(missing)
        self.waited = waited
        what = "; ".join(f"{name} ({why})" for name, why in sorted(self.missing.items()))
        super().__init__(
            f"the broker's metadata does not list {what} after {waited:.0f}s "
            "(BOTMESH_TOPIC_WAIT): check the topic prefix and that the topics exist "
            "(`botmesh topics list`), or create them (`botmesh topics create`)"
        )


def unlisted_topics(
    bootstrap: Brokers, names: Iterable[str], timeout: float = 10.0
) -> dict[str, str]:
    """Of ``names``, those the broker's metadata does not list ready to be assigned: name ->
    why (not listed, an error, no partitions, partitions without a leader). Blocking;
    ``KafkaAuthError`` when the brokers refuse this client."""
    try:
        meta = list_topics(bootstrap, timeout)
    except KafkaAuthError:
        raise
    except ConnectionError as exc:
        return dict.fromkeys(names, f"metadata not read: {exc}")
    missing: dict[str, str] = {}
    for name in names:
        topic = meta.topics.get(name)
        if topic is None:
            missing[name] = "not listed"
        elif topic.error is not None:
            missing[name] = str(topic.error)
        elif not topic.partitions:
            missing[name] = "no partitions"
        else:
            leaderless = sorted(p for p, md in topic.partitions.items() if md.leader < 0)
            if leaderless:
                missing[name] = f"no leader for partitions {leaderless}"
    return missing


async def wait_for_topics(
    bootstrap: Brokers, names: Iterable[str], limit: float, *, poll: float = 0.25
) -> float:
    """Wait until the broker lists every topic of ``names`` with a leader for each partition;
    the seconds it waited. ``TopicsNotListed`` after ``limit`` seconds."""
    wanted = sorted(set(names))
    started = time.monotonic()
    said = 0.0
    while True:
        missing = await asyncio.to_thread(unlisted_topics, bootstrap, wanted)
        waited = time.monotonic() - started
        if not missing:
            if said:
                log.info("the broker lists every topic of the group now (waited %.1fs)", waited)
            return waited
        if waited >= limit:
            raise TopicsNotListed(missing, waited)
        if not said or waited - said >= _SAY_EVERY_S:
            # the first line at info: a topic created a moment ago is the common case
            (log.warning if said else log.info)(
                "waiting for the broker's metadata to list %s before joining the group "
                "(%.0fs so far, limit %.0fs: BOTMESH_TOPIC_WAIT)",
                ", ".join(f"{n} ({why})" for n, why in sorted(missing.items())),
                waited,
                limit,
            )
            said = max(waited, 1e-9)
        await asyncio.sleep(min(poll, max(limit - waited, 0.0)))


_T = TypeVar("_T")


class ClientCalls:
    """Blocking calls on a librdkafka client, each in a thread and awaited shielded: a task
    cancelled at the stop leaves its call running, and ``settle`` waits for the calls still
    running before the client may go. librdkafka (2.16) aborts the process when a client is
    destroyed with a request of it pending (``eonce->refcnt > 0``): CI saw a worker's stop
    end that way while a group describe of its membership check was under way."""

    def __init__(self) -> None:
        self._running: set[asyncio.Task[Any]] = set()

    async def call(self, fn: Callable[..., _T], *args: Any) -> _T:
        task = asyncio.ensure_future(asyncio.to_thread(fn, *args))
        self._running.add(task)
        task.add_done_callback(self._ended)
        return await asyncio.shield(task)

    def _ended(self, task: asyncio.Task[Any]) -> None:
        self._running.discard(task)
        if not task.cancelled():
            task.exception()  # the caller's, when it still waits; else nobody's

    async def settle(self, seconds: float) -> None:
        """Wait (up to ``seconds``) for the calls still running to end."""
        if self._running:
            await asyncio.wait(set(self._running), timeout=seconds)


@dataclass
class AssignmentWatch:
    """Checks, every ``interval`` seconds while the worker owns no inbound partition, that
    the group leaves no inbound partition without an owner; forces a rebalance if it does."""

    bootstrap: Brokers
    group: str
    #: the topic whose partitions the worker must own (the inbound)
    topic: str
    #: the inbound partitions this worker owns now
    owned: Callable[[], set[int]]
    #: this worker's static instance id (``group.instance.id``), or None
    instance_id: str | None
    #: this worker's member id now (a dynamic member is removed by it)
    member_id: Callable[[], str | None]
    #: true while the worker rebalances (nothing is checked then)
    rebalancing: Callable[[], bool] = lambda: False
    interval: float = 2.0
    #: seconds after a forced rebalance before the next check
    settle: float = 10.0
    #: rebalances this worker forced (``forcedRebalances`` in its metrics)
    forced: int = 0
    ready: bool = False
    _said: str = ""
    #: one admin client for the watch's life (made at its first check)
    _admin: Any = None
    #: its calls on that client (``settle`` them before the process ends)
    calls: ClientCalls = field(default_factory=ClientCalls)

    async def run(self) -> None:
        while True:
            try:
                acted = await self.check()
            except Exception as exc:  # a broker out of reach: checked again later
                log.warning(
                    "cannot check this worker's assignment: %s: %s", type(exc).__name__, exc
                )
                acted = False
            await asyncio.sleep(self.settle if acted else self.interval)

    async def check(self) -> bool:
        """One check; true when it forced a rebalance."""
        mine = self.owned()
        if mine:
            self._say(f"ready: owns partitions {sorted(mine)} of {self.topic}", ready=True)
            return False
        if self.rebalancing():
            return False
        if not self.member_id():
            # not in the group yet: nothing to check, and on a new cluster the group's
            # coordinator may still be loading, when librdkafka (2.16) can abort the process
            # on a group request that times out meanwhile (``eonce->refcnt > 0``; see
            # ``groups.coordinated``): the group is asked once the consumer joined through it
            self._say(f"not ready: joining the group ({self.group})", ready=False)
            return False
        counts, info = await self.calls.call(self._read_group)
        partitions = counts.get(self.topic, 0)
        if not partitions or info.state != "stable":
            self._say(
                f"not ready: owns no partition of {self.topic} (group {info.state})",
                ready=False,
            )
            return False
        me = self._me(info.members)
        if me is not None and me.partitions.get(self.topic):
            self._say(f"not ready: taking partitions of {self.topic}", ready=False)
            return False  # assigned, not yet taken up by the consumer
        owners = {p for m in info.members if m is not me for p in m.partitions.get(self.topic, [])}
        unowned = sorted(set(range(partitions)) - owners)
        if not unowned:
            self._say(
                f"ready, idle: the group's other members own every partition of {self.topic}",
                ready=True,
            )
            return False
        self.ready = False
        self._said = ""
        if me is None:
            log.warning(
                "not ready: partitions %s of %s have no owner, and this worker is not a member "
                "of group %s yet; checked again",
                unowned,
                self.topic,
                self.group,
            )
            return True
        self.forced += 1
        log.warning(
            "not ready: this worker owns no partition of %s while partitions %s have no owner "
            "in group %s (%d members); its assignment was computed without them (a topic not "
            "listed yet when the group's leader assigned, and kept by a static member's "
            "rejoin): leaving the group to force a rebalance (%d forced so far)",
            self.topic,
            unowned,
            self.group,
            len(info.members),
            self.forced,
        )
        await remove_members(self.bootstrap, self.group, [me], wait_s=10.0)
        return True

    def _read_group(self) -> tuple[dict[str, int], GroupInfo]:
        if self._admin is None:  # kept: see ``Membership`` in ``worker.loop``
            self._admin = admin_client(self.bootstrap, 10.0)
        meta = list_topics(self.bootstrap, 10.0, client=self._admin)
        counts = {n: len(t.partitions) for n, t in meta.topics.items() if t.error is None}
        return counts, describe(self._admin, self.group, self.bootstrap, 10.0)

    def _me(self, members: list[Member]) -> Member | None:
        member_id = self.member_id()
        for m in members:
            if self.instance_id is not None and m.instance_id == self.instance_id:
                return m
            if self.instance_id is None and member_id and m.member_id == member_id:
                return m
        return None

    def _say(self, what: str, *, ready: bool) -> None:
        self.ready = ready
        if what != self._said:
            self._said = what
            (log.info if ready else log.warning)("%s", what)
