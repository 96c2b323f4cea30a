"""The record a worker publishes its counters in, on ``<prefix>.metrics``: keyed by its
instance id, ``{"v": 1, "instance", "ts", "counters", "ready", "why", "restoring"}``. The
worker writes it (``metrics_record``); ``botmesh metrics``, ``botmesh status`` and
``botmesh console`` read it (``decode_metrics``).

``ready`` (what ``/readyz`` says: the worker owns its partitions with their journal
partitions restored and recovered), ``why`` (the reason, as ``/readyz`` gives it) and
``restoring`` (journal partitions being restored from the changelog now) were added later
in version 1: a record without them reads as ``ready`` unknown (``None``)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["METRICS_VERSION", "WorkerMetrics", "decode_metrics", "metrics_record"]

#: The ``"v"`` of a record on ``<prefix>.metrics``.
METRICS_VERSION = 1


@dataclass(frozen=True, slots=True)
class WorkerMetrics:
    instance: str
    #: when the worker published them (epoch seconds)
    ts: float
    counters: dict[str, int]
    #: whether the worker was ready (``/readyz``) when it published them; ``None``: not said
    ready: bool | None = None
    #: why (``/readyz``'s reason)
    why: str = ""
    #: journal partitions it was restoring from the changelog
    restoring: int = 0


def metrics_record(
    instance: str,
    counters: Mapping[str, int],
    ts: float,
    *,
    ready: bool | None = None,
    why: str = "",
    restoring: int = 0,
) -> tuple[bytes, bytes]:
    """The key and value a worker produces to ``<prefix>.metrics``: keyed by its instance
    id, ``{"v": 1, "instance", "ts", "counters"}`` and, when ``ready`` is given, ``ready``,
    ``why`` and ``restoring``."""
    value: dict[str, object] = {
        "v": METRICS_VERSION,
        "instance": instance,
        "ts": ts,
        "counters": dict(counters),  # the counters in the engine's order
    }
    if ready is not None:
        value.update(ready=ready, why=why, restoring=restoring)
    return instance.encode(), json.dumps(value).encode()


def decode_metrics(key: bytes, value: bytes | None) -> WorkerMetrics | None:
    """A record of ``<prefix>.metrics``; ``None`` for a tombstone or a record it cannot read."""
    if value is None:
        return None
    try:
        obj = json.loads(value)
        counters = {str(k): int(v) for k, v in obj["counters"].items()}
        ready = obj.get("ready")
        return WorkerMetrics(
            str(obj.get("instance") or key.decode()),
            float(obj["ts"]),
            counters,
            ready if isinstance(ready, bool) else None,
            str(obj.get("why") or ""),
            int(obj.get("restoring") or 0),
        )
    except (ValueError, KeyError, TypeError, AttributeError):
        return None
