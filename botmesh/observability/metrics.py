"""The worker's and the gateway's metrics in Prometheus' text format (``GET /metrics``).

Two kinds of series:

- **Sampled at scrape time** (no cost on the hot path): the engine's counters under
  Prometheus names (``inboundJournaled`` is ``botmesh_inbound_journaled_total``; the same
  values ``botmesh metrics`` reads from ``<prefix>.metrics``), dead letters by kind and
  reason, and the gauges: readiness, partitions owned and restoring, consumer lag per
  partition, sends in flight, sends parked per retry tier, records taken and not settled.
  A ``WorkerSources`` gives each as a callable the collector calls on a scrape.
- **Histograms** fed on the hot path (``WorkerTelemetry``, the engine's ``Timings``):
  handler time, provider call latency by channel and result, journal write latency (an
  awaited write until the broker acked it), and the time from an inbound record's
  timestamp (its producer's clock) to its settling.

Label values are bounded: a channel's name, a result, a topic and partition, a reason, a
tier, never a chat id or a key. ``metric_names()`` lists every sample name either process
can export; the alert rules and the dashboard in ``deploy/`` are tested against it.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Histogram,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from botmesh.state.counters import Metric as EngineMetric

__all__ = [
    "CONTENT_TYPE",
    "ENGINE_COUNTERS",
    "GatewayCollector",
    "WorkerSources",
    "WorkerTelemetry",
    "exposition",
    "gateway_registry",
    "metric_names",
    "prometheus_name",
]

#: The Content-Type of a scrape.
CONTENT_TYPE = CONTENT_TYPE_LATEST

#: Latency buckets in seconds: a millisecond to a minute (a provider's retries inline).
_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


def prometheus_name(counter: str) -> str:
    """``inboundJournaled`` -> ``botmesh_inbound_journaled`` (the ``_total`` is the
    exposition's); a counter of milliseconds (``outboxPacedMs``) is exported in seconds,
    Prometheus' unit: ``botmesh_outbox_paced_seconds``."""
    if counter.endswith("Ms"):
        counter = counter.removesuffix("Ms") + "Seconds"
    return "botmesh_" + re.sub(r"(?<!^)(?=[A-Z])", "_", counter).lower()


def _unit(counter: str) -> float:
    """What one of ``counter`` is in Prometheus' units (a millisecond: 0.001 s)."""
    return 0.001 if counter.endswith("Ms") else 1.0


#: The engine's counters (``botmesh metrics``' names) -> their Prometheus family names.
ENGINE_COUNTERS: Mapping[str, str] = {m.value: prometheus_name(m.value) for m in EngineMetric}


@dataclass
class WorkerSources:
    """What a scrape samples, each a callable of the worker's state now."""

    #: the engine's counters, under ``botmesh metrics``' names
    counters: Callable[[], Mapping[str, int]] = dict
    #: rebalances this worker forced (``AssignmentWatch``)
    forced_rebalances: Callable[[], int] = lambda: 0
    #: dead letters produced, by (kind, reason)
    dead_letters: Callable[[], Mapping[tuple[str, str], int]] = dict
    #: whether ``/readyz`` answers 200
    ready: Callable[[], bool] = lambda: False
    partitions_owned: Callable[[], int] = lambda: 0
    partitions_restoring: Callable[[], int] = lambda: 0
    #: records behind the end of each (topic, partition) this worker consumes
    lag: Callable[[], Mapping[tuple[str, int], int]] = dict
    #: sends parked on each retry tier, waiting to be due
    parked: Callable[[], Mapping[str, int]] = dict
    #: records taken from Kafka and not settled yet
    unsettled: Callable[[], int] = lambda: 0


@dataclass
class _Calls:
    """Provider calls in flight (``Timings.calling``)."""

    n: int = 0


class _Sampled(Collector):
    """The series read at scrape time from ``WorkerSources``."""

    def __init__(self, sources: Callable[[], WorkerSources], calls: _Calls) -> None:
        self._sources = sources
        self._calls = calls

    def collect(self) -> Iterable[Metric]:
        s = self._sources()
        counters = s.counters()
        for name, family in ENGINE_COUNTERS.items():
            yield CounterMetricFamily(
                family, f"the engine's {name} counter", value=counters.get(name, 0) * _unit(name)
            )
        yield CounterMetricFamily(
            "botmesh_forced_rebalances",
            "rebalances this worker forced, owning no partition while some had no owner",
            value=s.forced_rebalances(),
        )
        dead = CounterMetricFamily(
            "botmesh_dead_letters",
            "records copied to a dead-letter topic",
            labels=["kind", "reason"],
        )
        for (kind, reason), n in sorted(s.dead_letters().items()):
            dead.add_metric([kind, reason], n)
        yield dead
        yield _gauge("botmesh_worker_ready", "1 when /readyz answers 200", int(s.ready()))
        yield _gauge(
            "botmesh_partitions_owned", "inbound partitions this worker owns", s.partitions_owned()
        )
        yield _gauge(
            "botmesh_partitions_restoring",
            "journal partitions being restored from the changelog",
            s.partitions_restoring(),
        )
        lag = GaugeMetricFamily(
            "botmesh_consumer_lag",
            "records between the committed offset and the partition's end",
            labels=["topic", "partition"],
        )
        for (topic, partition), n in sorted(s.lag().items()):
            lag.add_metric([topic, str(partition)], n)
        yield lag
        yield _gauge("botmesh_sends_in_flight", "provider calls under way", self._calls.n)
        parked = GaugeMetricFamily(
            "botmesh_sends_parked", "sends parked on a retry tier", labels=["tier"]
        )
        for tier, n in sorted(s.parked().items()):
            parked.add_metric([tier], n)
        yield parked
        yield _gauge(
            "botmesh_records_unsettled", "records taken and not settled yet", s.unsettled()
        )


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, value=value)


@dataclass
class WorkerTelemetry:
    """A worker's registry: the sampled series and the histograms; it is the engine's
    ``Timings`` (``Bot.bind(timings=...)``)."""

    sources: WorkerSources = field(default_factory=WorkerSources)

    def __post_init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self._calls = _Calls()
        self.registry.register(_Sampled(lambda: self.sources, self._calls))
        r = self.registry
        self._handler = Histogram(
            "botmesh_handler_seconds",
            "time the bot's handlers of one inbound ran",
            registry=r,
            buckets=_BUCKETS,
        )
        self._provider = Histogram(
            "botmesh_provider_call_seconds",
            "one call of a provider's send, by channel and result (ok, error)",
            ["channel", "result"],
            registry=r,
            buckets=_BUCKETS,
        )
        self._journal = Histogram(
            "botmesh_journal_write_seconds",
            "an awaited journal write, until the broker acked it",
            registry=r,
            buckets=_BUCKETS,
        )
        self._receipt = Histogram(
            "botmesh_inbound_to_receipt_seconds",
            "from an inbound record's timestamp to its settling",
            registry=r,
            buckets=_BUCKETS,
        )
        self._statuses = Counter(
            "botmesh_delivery_statuses",
            "channel status webhooks about sends, by channel and outcome (delivered, read, "
            "failed: the delivery state they set; unchanged; unmatched: no such send)",
            ["channel", "outcome"],
            registry=r,
        )
        self.handler = self._handler.observe
        self.journal_write = self._journal.observe
        self._receipt_observe = self._receipt.observe
        self._by_call: dict[tuple[str, str], Callable[[float], None]] = {}

    def provider_call(self, channel: str, result: str, seconds: float) -> None:
        observe = self._by_call.get((channel, result))
        if observe is None:
            observe = self._by_call[(channel, result)] = self._provider.labels(
                channel, result
            ).observe
        observe(seconds)

    def calling(self, delta: int) -> None:
        self._calls.n += delta

    def delivery_status(self, channel: str, outcome: str) -> None:
        self._statuses.labels(channel, outcome).inc()

    def settled(self, seconds: float) -> None:
        """An inbound settled ``seconds`` after its record's timestamp (a clock behind the
        producer's is counted as 0)."""
        self._receipt_observe(max(seconds, 0.0))

    def scrape(self) -> bytes:
        return exposition(self.registry)


def exposition(registry: CollectorRegistry) -> bytes:
    """``registry`` in the text format a Prometheus server scrapes."""
    return generate_latest(registry)


#: The gateway's counters (``botmesh._gateway.COUNTERS``) are one family by result.
GATEWAY_FAMILY = "botmesh_gateway_webhooks"


class GatewayCollector(Collector):
    """The gateway's counters by channel and result, and its gauges, sampled at scrape time
    from ``Gateway.metrics()`` (``channels``, ``seen``, ``connected``)."""

    def __init__(self, metrics: Callable[[], Mapping[str, Any]]) -> None:
        self._metrics = metrics

    def collect(self) -> Iterable[Metric]:
        now = self._metrics()
        family = CounterMetricFamily(
            GATEWAY_FAMILY,
            "webhooks by channel and what became of them",
            labels=["channel", "result"],
        )
        for channel, counts in sorted(now.get("channels", {}).items()):
            for result, n in counts.items():
                family.add_metric([channel, result], n)
        yield family
        yield _gauge(
            "botmesh_gateway_connected",
            "1 while the gateway's producer is connected to Kafka",
            int(bool(now.get("connected"))),
        )
        yield _gauge(
            "botmesh_gateway_seen_entries",
            "webhook event ids remembered to answer a channel's retries as duplicates",
            int(now.get("seen", {}).get("entries", 0)),
        )


def gateway_registry(metrics: Callable[[], Mapping[str, Any]]) -> CollectorRegistry:
    """A registry of the gateway's series, read from ``metrics`` at each scrape."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(GatewayCollector(metrics))
    return registry


def metric_names() -> frozenset[str]:
    """Every sample name the worker and the gateway export (``botmesh_handler_seconds_bucket``,
    ``botmesh_outbox_ambiguous_total``, ``botmesh_worker_ready`` ...)."""
    telemetry = WorkerTelemetry(
        WorkerSources(
            dead_letters=lambda: {("inbound", "bad-record"): 0},
            lag=lambda: {("inbound", 0): 0},
            parked=lambda: {"1s": 0},
        )
    )
    telemetry.provider_call("channel", "ok", 0.0)
    telemetry.handler(0.0)
    telemetry.journal_write(0.0)
    telemetry.settled(0.0)
    telemetry.delivery_status("channel", "delivered")
    gateway = gateway_registry(lambda: {"channels": {"channel": {"received": 0}}})
    names: set[str] = set()
    for registry in (telemetry.registry, gateway):
        for family in registry.collect():
            names.update(sample.name for sample in family.samples)
    return frozenset(names)
