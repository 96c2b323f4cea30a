"""The faust-streaming 0.15.3 defects the worker meets, and what botmesh does about each.

=====================================================  =====================================
defect                                                 workaround (where)
=====================================================  =====================================
An exception in the agent body acks the event (a       nothing escapes the batch body: a
``take_events`` batch: the whole batch) and the        batch that cannot be settled makes
error handler commits it: it is never redelivered.     the process exit without acking
                                                       (``streams.worker``: ``os._exit``)
A cancelled ``take_events`` body acks its batch        ``CancelledError`` in the body: exit
(the stream's ``finally``).                            without acking (``streams.worker``)
Events skipped at a startup seek: the commit of a      ``guard_commit_holes`` below: Faust
partition skips a hole of exactly one offset at the    never commits past a hole at the head
head of the acked offsets (``Consumer._new_offset``    of the acked offsets; the hole's
checks ``min(acked) - committed > 1`` where            record is redelivered at the next
``committed`` is already the next offset; and a        start (the journal answers the rest
committed offset of 0 is not checked at all), so a     as duplicates)
record that never reached the agent is committed
past and lost.
``app.producer.flush()`` returns before a buffered     the journal never relies on it: it
write is acked; a table write is not durable until     awaits the broker's ack of each of its
the commit timer.                                      changelog records (``TableKv.commit``)
Under ``exactly_once`` the changelog offsets are       not met: the worker runs
persisted per source partition, so every restart       ``at_least_once`` (exactly-once is not
replays the whole changelog.                           offered yet)
=====================================================  =====================================
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from faust.transport.consumer import Consumer

__all__ = ["guard_commit_holes", "held_commit"]

log = logging.getLogger("botmesh.streams")

_ORIGINAL: Callable[[Any, Any], int | None] = Consumer._new_offset


def held_commit(consumer: Any, tp: Any) -> bool:
    """A hole at the head of ``tp``'s acked offsets that Faust knows nothing of (no gap
    it recorded itself): the offset after the last commit never reached the agent."""
    acked = consumer._acked[tp]
    committed = consumer._committed_offset[tp]
    if not acked or committed is None or consumer._gap[tp]:
        return False
    return bool(min(acked) > committed)


_warned: set[tuple[Any, int]] = set()


def _new_offset(self: Any, tp: Any) -> int | None:
    if held_commit(self, tp):
        committed = self._committed_offset[tp]
        if (tp, committed) not in _warned:
            _warned.add((tp, committed))
            log.warning(
                "%s: offset %s was never handed to the agent (acked from %s on); the commit "
                "stays at %s so that the next start redelivers it",
                tp,
                committed,
                min(self._acked[tp]),
                committed,
            )
        return None
    return _ORIGINAL(self, tp)


def guard_commit_holes() -> None:
    """Install the guard on Faust's consumer (idempotent; the worker does it at start)."""
    Consumer._new_offset = _new_offset  # type: ignore[method-assign]
