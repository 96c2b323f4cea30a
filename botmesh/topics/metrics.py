"""The record a worker publishes its counters in, on ``<prefix>.metrics``: keyed by its
instance id, ``{"v": 1, "instance", "ts", "counters"}``. The worker writes it
(``metrics_record``); ``botmesh status`` reads it (``decode_metrics``)."""

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


def metrics_record(instance: str, counters: Mapping[str, int], ts: float) -> tuple[bytes, bytes]:
    """The key and value a worker produces to ``<prefix>.metrics``: keyed by its instance
    id, ``{"v": 1, "instance", "ts", "counters"}``."""
    value = {"v": METRICS_VERSION, "instance": instance, "ts": ts, "counters": dict(counters)}
    return instance.encode(), json.dumps(value).encode()  # the counters in the engine's order


def decode_metrics(key: bytes, value: bytes | None) -> WorkerMetrics | None:
    """A record of ``<prefix>.metrics``; ``None`` for a tombstone or a record it cannot read."""
    if value is None:
        return None
    try:
        obj = json.loads(value)
        counters = {str(k): int(v) for k, v in obj["counters"].items()}
        return WorkerMetrics(str(obj.get("instance") or key.decode()), float(obj["ts"]), counters)
    except (ValueError, KeyError, TypeError, AttributeError):
        return None
