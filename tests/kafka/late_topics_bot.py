"""The test bot (``tests/kafka/bot.py``) on a worker that creates no topics itself, for the
group-membership tests (``tests/kafka/test_membership.py``):

    botmesh worker --app tests.kafka.late_topics_bot:bot --provider tests.kafka.bot:provider

Its provisioning is a no-op, as for a cluster whose topics someone else creates (and maybe
later): the worker subscribes before the test creates them, which makes the race of a
group leader assigning from metadata that lacks them deterministic.

``BOTMESH_TEST_EARLIER_JOIN=1`` makes the worker join as releases before the membership
checks did (``botmesh.streams.membership``): it subscribes without waiting for the broker to list
its topics and never checks its assignment (librdkafka's consumer then joins once the
topics are listed).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

from botmesh.streams import membership
from botmesh.streams.connection import Brokers
from botmesh.streams.provision import ProvisionResult
from botmesh.streams.worker import loop as worker
from tests.kafka.bot import bot, provider

__all__ = ["bot", "provider"]


def _no_provisioning(bootstrap: Brokers, specs: Iterable[Any], timeout: float = 30.0) -> Any:
    return ProvisionResult([], [], {})


async def _no_wait(
    bootstrap: Brokers, names: Iterable[str], limit: float, *, poll: float = 0.25
) -> float:
    return 0.0


async def _no_watch(self: membership.AssignmentWatch) -> None:
    return None


worker.ensure_topics = _no_provisioning  # type: ignore[attr-defined]
if os.environ.get("BOTMESH_TEST_EARLIER_JOIN") == "1":
    worker.wait_for_topics = _no_wait  # type: ignore[attr-defined]
    membership.AssignmentWatch.run = _no_watch  # type: ignore[method-assign]
