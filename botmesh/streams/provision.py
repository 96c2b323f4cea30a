"""Idempotent topic provisioning through the Kafka admin client (confluent-kafka).

``ensure_topics`` creates what ``topics.Catalog.specs`` describes and leaves existing topics
alone (it reports a partition count that differs from the spec, it never changes one).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.cimpl import NewTopic

from botmesh.state.errors import ConfigError
from botmesh.streams.connection import Brokers, admin, list_topics, servers
from botmesh.topics.catalog import Catalog, TopicSpec

__all__ = [
    "ProvisionResult",
    "admin_client",
    "check_copartitioned",
    "ensure_topics",
    "existing_topics",
]

log = logging.getLogger("botmesh.streams")


@dataclass(frozen=True, slots=True)
class ProvisionResult:
    created: list[str]
    existing: list[str]
    mismatched: dict[str, tuple[int, int]]  # name -> (wanted partitions, actual)


def admin_client(bootstrap: Brokers) -> Any:
    return admin(bootstrap, timeout=10.0)


def existing_topics(bootstrap: Brokers, timeout: float = 15.0) -> dict[str, int]:
    """Topic name -> partition count of every topic on the cluster (``ConnectionError``, or
    ``KafkaAuthError`` naming the setting, when the brokers do not answer or refuse)."""
    meta = list_topics(bootstrap, timeout)
    return {name: len(t.partitions) for name, t in meta.topics.items()}


def _wait_listed(bootstrap: Brokers, names: list[str], timeout: float) -> None:
    """Return once the broker's metadata lists ``names`` with a leader for every partition:
    right after its creation a topic can be missing there for a moment, and a command run
    next (``botmesh status``, a producer) would take it as absent. Logs and returns after
    ``timeout``; the topics exist, and a later reader asks again."""
    deadline = time.monotonic() + timeout
    while True:
        meta = list_topics(bootstrap, max(1.0, deadline - time.monotonic()))
        waiting = [
            n
            for n in names
            if n not in meta.topics
            or meta.topics[n].error is not None
            or not meta.topics[n].partitions
            or any(p.leader < 0 for p in meta.topics[n].partitions.values())
        ]
        if not waiting:
            return
        if time.monotonic() >= deadline:
            log.warning(
                "created topics not listed with leaders yet after %.0fs: %s", timeout, waiting
            )
            return
        time.sleep(0.1)


def _check_replication(bootstrap: Brokers, todo: list[TopicSpec], brokers: int) -> None:
    """A replication factor above the cluster's broker count is refused before anything is
    created (the broker would refuse each topic, leaving some created and some not)."""
    asked = max((s.replication for s in todo), default=0)
    if asked > brokers:
        raise ValueError(
            f"replication factor {asked} is more than the {brokers} broker(s) of the cluster at "
            f"{servers(bootstrap)!r}: set --replication (or BOTMESH_REPLICATION) to at most "
            f"{brokers}, or add brokers; nothing was created"
        )


def ensure_topics(
    bootstrap: Brokers, specs: Iterable[TopicSpec], timeout: float = 30.0
) -> ProvisionResult:
    """Create the topics that do not exist yet; idempotent (safe to run on every start).
    ``ValueError`` before creating anything when a topic to create asks for more replicas
    than the cluster has brokers."""
    wanted = list(specs)
    meta = list_topics(bootstrap, min(timeout, 10.0))
    have = {name: len(t.partitions) for name, t in meta.topics.items()}
    todo = [s for s in wanted if s.name not in have]
    created: list[str] = []
    existing = [s.name for s in wanted if s.name in have]
    _check_replication(bootstrap, todo, len(meta.brokers))
    if todo:
        admin = admin_client(bootstrap)
        futures = admin.create_topics(
            [
                NewTopic(
                    s.name,
                    num_partitions=s.partitions,
                    replication_factor=s.replication,
                    config=dict(s.config),
                )
                for s in todo
            ],
            operation_timeout=timeout,
            request_timeout=timeout,
        )
        for name, fut in futures.items():
            try:
                fut.result(timeout)
                created.append(name)
            except KafkaException as exc:
                err = exc.args[0] if exc.args else None
                if isinstance(err, KafkaError) and err.code() == KafkaError.TOPIC_ALREADY_EXISTS:
                    existing.append(name)  # another worker created it meanwhile
                    continue
                raise RuntimeError(
                    f"cannot create topic {name!r} on {servers(bootstrap)!r}: {exc}"
                ) from None
    if created:
        _wait_listed(bootstrap, created, timeout)
    mismatched = {
        s.name: (s.partitions, have[s.name])
        for s in wanted
        if s.name in have and have[s.name] != s.partitions
    }
    for name, (want, got) in mismatched.items():
        log.info("topic %s exists with %d partitions (spec %d); left as is", name, got, want)
    return ProvisionResult(sorted(created), sorted(existing), mismatched)


def check_copartitioned(cat: Catalog, have: Mapping[str, int]) -> None:
    """Refuse to run when the requests, control or statuses topic and the inbound have other
    partition counts: a chat's requests would land on another partition than its messages and its
    journal (``ConfigError`` naming the topic and the fix)."""
    inbound = have.get(cat.inbound)
    for name, what in (
        (cat.requests, "send requests"),
        (cat.control, "operator actions"),
        (cat.statuses, "delivery statuses"),
    ):
        count = have.get(name)
        if inbound is not None and count is not None and inbound != count:
            raise ConfigError(
                "topics",
                f"{name} has {count} partitions but {cat.inbound} has {inbound}: a chat's "
                f"{what} must land on the partition of its inbound messages; once {name} is "
                f"drained, delete it and let the worker create it again (with {inbound} "
                "partitions)",
            )
