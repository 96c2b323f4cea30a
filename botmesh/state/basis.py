"""``Basis``: what one engine is built on, before any of its parts: the journal, the scope's
keys, this instance, its time, randomness, counters and wake-up call.

The engine (``botmesh.state.engine``) makes one ``Basis``; its first parts (``Leases``,
``Leadership``, ``Publisher``) and the erasure take it, and the parts after the first take
it with them as ``botmesh.state.common.Common``.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from botmesh.state.clock import Clock, SystemClock
from botmesh.state.counters import Metrics, Timings
from botmesh.state.keys import ScopeKeys
from botmesh.state.kv import DurableKv, Partitioned, anywhere, unpartitioned

__all__ = ["Basis"]


@dataclass(frozen=True, slots=True)
class Basis:
    """What one engine is built on, made once (``Basis.of``) before any of its parts; each
    part reads from it the collaborators it uses."""

    kv: DurableKv
    keys: ScopeKeys
    #: This runtime's name among the bot's (the leases' owner).
    instance_id: str
    #: This start of the instance: a lease an earlier boot wrote is reclaimed at once.
    boot: str
    #: This engine is the only writer of the records it sees (``Partitioned``).
    exclusive: bool
    #: The context of the work on one record found by a scan (``Partitioned.near``).
    near: Callable[[str], contextlib.AbstractContextManager[None]]
    #: The context of work on records of several partitions (``Partitioned``).
    across_partitions: Callable[[], contextlib.AbstractContextManager[None]]
    clock: Clock
    #: The backoff's jitter.
    rng: random.Random
    metrics: Metrics
    #: Histograms of handler and provider times, when anything keeps them.
    timings: Timings | None
    #: Set to make the scheduler run a pass now rather than at its next tick.
    wake: asyncio.Event

    @classmethod
    def of(
        cls,
        kv: DurableKv,
        *,
        scope: str,
        instance_id: str,
        clock: Clock | None = None,
        rng: random.Random | None = None,
        timings: Timings | None = None,
    ) -> Basis:
        """A new engine's: fresh counters and boot id; the system's clock and a new
        ``Random`` unless given; ``near`` and ``across_partitions`` from a partitioned
        journal, else the ones that choose nothing."""
        partitioned = kv if isinstance(kv, Partitioned) else None
        return cls(
            kv=kv,
            keys=ScopeKeys.of(scope),
            instance_id=instance_id,
            boot=uuid.uuid4().hex[:12],
            exclusive=partitioned is not None,
            near=anywhere if partitioned is None else partitioned.near,
            across_partitions=(
                unpartitioned if partitioned is None else partitioned.across_partitions
            ),
            clock=clock or SystemClock(),
            rng=rng or random.Random(),
            metrics=Metrics(),
            timings=timings,
            wake=asyncio.Event(),
        )
