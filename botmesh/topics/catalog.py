"""The topic catalog: every topic name derived from one prefix, with its partitions,
replication and cleanup policy.

Pure data (no Kafka client): ``botmesh.streams.provision`` creates what this module describes.

========================================  ==========  =================================
topic                                     cleanup     purpose
========================================  ==========  =================================
``<prefix>.inbound``                      delete 7d   inbound messages, keyed by chat id
``<prefix>.requests``                     delete 7d   send requests (sends from outside a
                                                      handler), keyed by chat id;
                                                      partitions = inbound's
``<prefix>.control``                      delete 7d   operator actions (retry a send, replay
                                                      an inbound, discard), keyed by chat
                                                      id; partitions = inbound's
``<prefix>.statuses``                     delete 7d   channels' delivery statuses
                                                      (delivered, read, failed), keyed by
                                                      chat id, from the webhook gateway;
                                                      partitions = inbound's
``<prefix>.control.results``              delete 7d   their results, keyed by request id
``<prefix>.sent``                         delete 7d   sent receipts, keyed by chat id
``<prefix>.outbox.retry.1s`` / ``.5s`` /  delete 1d   outbox retry tiers: a failed send
``.30s`` / ``.1m`` / ``.5m`` / ``.10m``                 parked until its retry
                                                      (``botmesh.state.backoff.RETRY_TIERS``);
                                                      partitions = inbound's
``<prefix>.inbound.dlq``                  delete 30d  undecodable / failed inbound records
``<prefix>.requests.dlq``                 delete 30d  undecodable / failed send requests
``<prefix>.outbox.dlq``                   delete 30d  sends that failed for good
``<prefix>.worker-journal-changelog``     compact     the worker's journal (a table:
                                                      inbox, outbox and lease records);
                                                      partitions = inbound's
``<prefix>.metrics``                      compact     each worker's engine counters,
                                                      keyed by its instance id (every
                                                      ``BOTMESH_METRICS_INTERVAL`` s and
                                                      at a clean stop; ``botmesh metrics``)
``<prefix>.gateway.seen``                 compact,    the webhook gateway's produced events
                                          delete 7d   (``<channel>:<event id>``), so a
                                                      webhook the channel retries is
                                                      produced once; 1 partition; created
                                                      by ``botmesh gateway``
                                                      (:meth:`Catalog.gateway_specs`), not
                                                      by ``specs()``
========================================  ==========  =================================

The prefix comes from ``BOTMESH_TOPIC_PREFIX`` (default ``botmesh``). The worker's consumer
group is ``<prefix>.worker``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Literal

from botmesh.state.backoff import RETRY_TIERS

__all__ = [
    "DEFAULT_PARTITIONS",
    "DEFAULT_PREFIX",
    "PREFIX_ENV",
    "RETRY_TIERS",
    "TABLES",
    "Catalog",
    "TopicSpec",
    "prefix_from_env",
]

DEFAULT_PREFIX = "botmesh"
PREFIX_ENV = "BOTMESH_TOPIC_PREFIX"
DEFAULT_PARTITIONS = 8


#: The tables of the worker; each has a compacted changelog topic. One table, the
#: journal, holds the inbox, outbox and lease records (``botmesh.streams.table_kv``).
TABLES: tuple[str, ...] = ("journal",)

_DAY_MS = 24 * 3600 * 1000
_PREFIX_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,199}$")

Role = Literal[
    "inbound",
    "requests",
    "control",
    "statuses",
    "results",
    "sent",
    "retry",
    "dlq",
    "changelog",
    "metrics",
    "seen",
]


@dataclass(frozen=True, slots=True)
class TopicSpec:
    """One topic: name, partition count, replication factor and topic-level configs."""

    name: str
    role: Role
    partitions: int
    replication: int
    config: Mapping[str, str] = field(default_factory=dict)
    purpose: str = ""

    @property
    def compacted(self) -> bool:
        return self.config.get("cleanup.policy") == "compact"


@dataclass(frozen=True, slots=True)
class _SpecMaker:
    """Makes the catalog's topic specs at one partition count and replication factor; every
    topic gets ``min.insync.replicas`` 2 from 3 replicas up (else 1)."""

    partitions: int
    replication: int

    def __call__(self, name: str, role: Role, config: dict[str, str], purpose: str) -> TopicSpec:
        common = {"min.insync.replicas": "2" if self.replication >= 3 else "1"}
        return TopicSpec(
            name, role, self.partitions, self.replication, {**common, **config}, purpose
        )

    def deleted(self, name: str, role: Role, retention_ms: int, purpose: str) -> TopicSpec:
        """A topic whose records are deleted ``retention_ms`` after they were written."""
        return self(
            name, role, {"cleanup.policy": "delete", "retention.ms": str(retention_ms)}, purpose
        )


def prefix_from_env(environ: Mapping[str, str] | None = None) -> str:
    """The topic prefix from ``BOTMESH_TOPIC_PREFIX`` (default ``botmesh``), validated."""
    env = os.environ if environ is None else environ
    return check_prefix(env.get(PREFIX_ENV, "").strip() or DEFAULT_PREFIX)


def check_prefix(prefix: str) -> str:
    if not _PREFIX_RE.match(prefix):
        raise ValueError(
            f"bad topic prefix {prefix!r}: use 1-200 characters of letters, digits, '.', '_' "
            "or '-', starting with a letter or digit (e.g. 'botmesh' or 'acme.prod')"
        )
    return prefix


@dataclass(frozen=True, slots=True)
class Catalog:
    """Topic names and specs for one prefix: ``Catalog("bm").inbound == "bm.inbound"``."""

    prefix: str = DEFAULT_PREFIX

    def __post_init__(self) -> None:
        check_prefix(self.prefix)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Catalog:
        return cls(prefix_from_env(environ))

    @property
    def inbound(self) -> str:
        return f"{self.prefix}.inbound"

    @property
    def requests(self) -> str:
        """Send requests: sends from outside a handler, keyed by chat id; the worker reads
        them with the inbound (same partitions, so a chat's requests and messages have one
        owner)."""
        return f"{self.prefix}.requests"

    @property
    def control(self) -> str:
        """Operator actions (``botmesh.topics.control``): keyed by chat id, read with the inbound
        (same partitions), so the chat's owner carries them out."""
        return f"{self.prefix}.control"

    @property
    def statuses(self) -> str:
        """Channels' delivery statuses (``DeliveryStatus``: delivered, read, failed), keyed
        by chat id, produced by the webhook gateway and read with the inbound (same
        partitions), so the chat's owner joins each to its send."""
        return f"{self.prefix}.statuses"

    @property
    def control_results(self) -> str:
        return f"{self.prefix}.control.results"

    @property
    def sent(self) -> str:
        return f"{self.prefix}.sent"

    @property
    def inbound_dlq(self) -> str:
        return f"{self.prefix}.inbound.dlq"

    @property
    def requests_dlq(self) -> str:
        return f"{self.prefix}.requests.dlq"

    @property
    def outbox_dlq(self) -> str:
        return f"{self.prefix}.outbox.dlq"

    @property
    def metrics(self) -> str:
        """The workers' counters (compacted, keyed by instance id; ``botmesh metrics``)."""
        return f"{self.prefix}.metrics"

    @property
    def gateway_seen(self) -> str:
        """The webhook gateway's record of the events it produced (compacted, keyed by
        ``<channel>:<event id>``)."""
        return f"{self.prefix}.gateway.seen"

    def gateway_specs(self, replication: int = 1) -> list[TopicSpec]:
        """The topics the webhook gateway creates (``botmesh gateway``): its seen topic, one
        partition (every replica reads all of it), compacted and deleted after the
        inbound's retention (7 d): past that, a retried webhook is no longer recognised."""
        if replication < 1:
            raise ValueError(f"replication must be >= 1, got {replication}")
        return [
            TopicSpec(
                self.gateway_seen,
                "seen",
                1,
                replication,
                {
                    "cleanup.policy": "compact,delete",
                    "retention.ms": str(7 * _DAY_MS),
                    "segment.ms": str(3600 * 1000),
                    "min.cleanable.dirty.ratio": "0.1",
                    "min.insync.replicas": "2" if replication >= 3 else "1",
                },
                "events the webhook gateway produced to the inbound, keyed by channel:id",
            )
        ]

    @property
    def app_id(self) -> str:
        """The worker's consumer group id (``<prefix>.worker``), the stem of its changelog."""
        return f"{self.prefix}.worker"

    @property
    def group(self) -> str:
        return self.app_id

    @property
    def retry_group(self) -> str:
        """The consumer group of the retry tiers' consumers (``<prefix>.worker.retry``): its
        committed offsets on a tier say which parked sends were attempted."""
        return f"{self.app_id}.retry"

    def retry(self, tier: str) -> str:
        """The retry topic of one tier (``"1s"``, ``"5s"``, ``"30s"``, ``"1m"``, ``"5m"``
        or ``"10m"``)."""
        if tier not in {name for name, _ in RETRY_TIERS}:
            known = ", ".join(name for name, _ in RETRY_TIERS)
            raise ValueError(f"unknown retry tier {tier!r}: use one of {known}")
        return f"{self.prefix}.outbox.retry.{tier}"

    @property
    def retries(self) -> tuple[str, ...]:
        return tuple(self.retry(name) for name, _ in RETRY_TIERS)

    def changelog(self, table: str) -> str:
        """The changelog topic of ``table`` (``<app id>-<table>-changelog``)."""
        return f"{self.app_id}-{table}-changelog"

    def specs(self, partitions: int = DEFAULT_PARTITIONS, replication: int = 1) -> list[TopicSpec]:
        """Every topic of the catalog. Requests, changelogs and retry tiers get the inbound's
        partition count (a journal partition goes with its inbound partition, and the worker
        reads requests with the inbound); DLQs and receipts too, so a chat keeps one partition
        everywhere."""
        if partitions < 1:
            raise ValueError(f"partitions must be >= 1, got {partitions}")
        if replication < 1:
            raise ValueError(f"replication must be >= 1, got {replication}")
        make = _SpecMaker(partitions, replication)
        return [
            *self._message_specs(make),
            *self._retry_specs(make),
            *self._dlq_specs(make),
            *self._compacted_specs(make),
        ]

    def _message_specs(self, make: _SpecMaker) -> list[TopicSpec]:
        """The topics of messages, requests, operator actions and receipts (kept 7 days)."""
        week = 7 * _DAY_MS
        return [
            make.deleted(
                self.inbound,
                "inbound",
                week,
                "inbound messages and interactions, keyed by chat id",
            ),
            make.deleted(
                self.requests,
                "requests",
                week,
                "send requests (sends from outside a handler), keyed by chat id",
            ),
            make.deleted(
                self.control,
                "control",
                week,
                "operator actions (retry_send, replay_inbound, discard, restart_flow, "
                "drop_flow), keyed by chat id",
            ),
            make.deleted(
                self.statuses,
                "statuses",
                week,
                "channels' delivery statuses (delivered, read, failed), keyed by chat id",
            ),
            make.deleted(
                self.control_results,
                "results",
                week,
                "results of operator actions, keyed by request id",
            ),
            make.deleted(self.sent, "sent", week, "sent receipts, keyed by chat id"),
        ]

    def _retry_specs(self, make: _SpecMaker) -> list[TopicSpec]:
        """The outbox's retry tiers (kept a day)."""
        return [
            make.deleted(
                self.retry(name),
                "retry",
                _DAY_MS,
                f"outbox retry tier: sends due again after {name}",
            )
            for name, _ in RETRY_TIERS
        ]

    def _dlq_specs(self, make: _SpecMaker) -> list[TopicSpec]:
        """The dead-letter topics (kept 30 days)."""
        month = 30 * _DAY_MS
        return [
            make.deleted(
                self.inbound_dlq,
                "dlq",
                month,
                "inbound records that could not be decoded or handled (header 'reason')",
            ),
            make.deleted(
                self.requests_dlq,
                "dlq",
                month,
                "send requests that could not be decoded or settled (header 'reason')",
            ),
            make.deleted(
                self.outbox_dlq, "dlq", month, "sends that failed for good (header 'reason')"
            ),
        ]

    def _compacted_specs(self, make: _SpecMaker) -> list[TopicSpec]:
        """The compacted topics: each table's changelog, and the workers' metrics."""
        changelogs = [
            make(
                self.changelog(table),
                "changelog",
                # segments roll hourly (or at 64 MiB) so that the cleaner can compact them:
                # a worker restoring a partition on an empty disk reads each key once
                {
                    "cleanup.policy": "compact",
                    "segment.ms": str(3600 * 1000),
                    "segment.bytes": str(64 * 1024 * 1024),
                    "min.cleanable.dirty.ratio": "0.1",
                },
                f"changelog of the worker's table {table!r}",
            )
            for table in TABLES
        ]
        metrics = make(
            self.metrics,
            "metrics",
            {
                "cleanup.policy": "compact",
                "segment.ms": str(3600 * 1000),
                "min.cleanable.dirty.ratio": "0.1",
            },
            "each worker's engine counters, keyed by its instance id",
        )
        return [*changelogs, metrics]

    def specs_beside(
        self,
        existing: Mapping[str, int],
        partitions: int = DEFAULT_PARTITIONS,
        replication: int = 1,
    ) -> list[TopicSpec]:
        """:meth:`specs` for a cluster whose topics are ``existing`` (name -> partition
        count): a requests, control or retry-tier topic still to create beside an existing
        inbound gets the inbound's partition count, whatever ``partitions`` says (a chat's
        requests, operator actions and parked sends must land on the partition of its
        messages)."""
        specs = self.specs(partitions, replication)
        inbound = existing.get(self.inbound)
        if inbound is None:
            return specs
        return [
            replace(s, partitions=inbound)
            if s.role in {"requests", "control", "statuses", "retry"} and s.name not in existing
            else s
            for s in specs
        ]

    def names(self) -> list[str]:
        return [s.name for s in self.specs()]
