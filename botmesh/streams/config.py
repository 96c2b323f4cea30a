"""The worker's settings (``WorkerConfig``) and its journal rule, without loading a Kafka
client.

``WorkerConfig.from_env()`` reads the environment; the CLI passes its options as overrides.
A bad value is refused here, naming the variable or the option and the fix.

The worker never runs without a journal, and never on one that forgets: ``memory://`` and
"none" are refused (a restarted worker must find what the last run journaled). The default,
``kafka``, is the journal on Kafka itself (``botmesh.streams.table_kv``: a table in RocksDB,
changelogged, following the inbound partitions), which every worker of the group shares. A
``file://`` journal stays possible for one worker alone (several workers in one group, each
with its own file, would not see each other's records when partitions move).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from botmesh.state.backends import check_url
from botmesh.state.backends.server import redact
from botmesh.state.config import Limit, RateLimits, parse_limit
from botmesh.state.errors import ConfigError
from botmesh.streams.connection import KafkaSettings, Security
from botmesh.topics.catalog import DEFAULT_PARTITIONS, Catalog, check_prefix, prefix_from_env

__all__ = [
    "DEFAULT_BOOTSTRAP",
    "GUARANTEES",
    "KAFKA_JOURNAL",
    "WorkerConfig",
    "check_worker_journal",
    "default_journal",
    "group_instance_id",
]

DEFAULT_BOOTSTRAP = "127.0.0.1:9092"
#: Seconds the group waits for a silent member before it gives its partitions to others.
DEFAULT_SESSION_TIMEOUT = 30.0
_NONE = {"", "none", "null", "off", "no"}
#: The journal on Kafka (the worker's default).
KAFKA_JOURNAL = "kafka"
_KAFKA = {"kafka", "kafka:", "kafka://", "table"}
#: The processing guarantees the worker runs under (``BOTMESH_PROCESSING_GUARANTEE``).
GUARANTEES = ("at_least_once", "exactly_once")


def check_guarantee(value: str, source: str = "--guarantee") -> str:
    """``at_least_once`` or ``exactly_once`` (``-`` taken for ``_``, any case); else
    ``ValueError`` naming ``source``."""
    v = value.strip().lower().replace("-", "_")
    if v not in GUARANTEES:
        raise ValueError(
            f"{source} {value!r}: the worker runs at_least_once (the default) or exactly_once"
        )
    return v


def default_journal(data_dir: Path) -> str:
    """``file://<data dir>/journal?append_log=true`` (the data dir made absolute)."""
    return f"file://{data_dir.resolve()}/journal?append_log=true"


def check_worker_journal(url: str, source: str = "--journal") -> str:
    """Refuse a journal the worker cannot run on (``ValueError`` naming ``source``)."""
    value = url.strip()
    if value.lower() in _KAFKA:
        return KAFKA_JOURNAL
    if value.lower() in _NONE:
        raise ValueError(
            f"{source}: the Kafka worker never runs without a journal; leave it out for the "
            "default (the journal on Kafka, 'kafka') or give file:///absolute/path"
        )
    if value.startswith("memory://"):
        raise ValueError(
            f"{source} {value!r}: the memory journal forgets everything at a restart, and a "
            "restarted worker must find what the last run journaled; leave it out for the "
            "journal on Kafka (the default, 'kafka'), or use file:///absolute/path/journal"
        )
    try:
        check_url(value)
    except ConfigError as exc:  # a password in the URL is not repeated
        shown = redact(value)
        raise ValueError(f"{source} {shown!r}: {exc.message.replace(value, shown)}") from None
    return value


def group_instance_id(instance_id: str) -> str:
    """The consumer's ``group.instance.id`` for an instance id (Kafka takes only letters,
    digits, ``.``, ``_`` and ``-``, up to 249 characters)."""
    safe = "".join(c if c.isalnum() or c in "._-" else "_" for c in instance_id)
    return safe[:249]


def _int_env(env: Mapping[str, str], name: str, default: int | None) -> int | None:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not an integer; set a number or unset it") from None


def _float_env(env: Mapping[str, str], name: str, default: float) -> float:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        return float(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not a number of seconds; fix or unset it") from None


def _limit_env(env: Mapping[str, str], name: str) -> Limit:
    """A rate limit's variable: a rate (``80/s``, ``20/min``), ``off`` or ``default``
    (also when unset: the bot's ``outbox.rate_limits``)."""
    return parse_limit(env.get(name, "").strip() or "default", name)


def _rate_limits_env(env: Mapping[str, str]) -> RateLimits | None:
    """The rate limits the worker's environment sets; ``None`` when it sets none."""
    limits = RateLimits(
        channel=_limit_env(env, "BOTMESH_RATE_LIMIT"),
        chat=_limit_env(env, "BOTMESH_CHAT_RATE_LIMIT"),
        group=_limit_env(env, "BOTMESH_GROUP_RATE_LIMIT"),
    )
    return None if limits == RateLimits() else limits


#: Settings earlier releases read, and what to set instead.
RETIRED = {
    "BOTMESH_WEB_PORT": "the old web server is gone; set BOTMESH_HTTP_PORT for /healthz, "
    "/readyz and /metrics (and BOTMESH_HTTP_HOST, 127.0.0.1 by default, to 0.0.0.0 for "
    "probes from outside the host)",
}


@dataclass(frozen=True, slots=True)
class WorkerConfig:
    """Settings of one worker process. Each field reads one environment variable
    (``from_env``); the CLI's options override them."""

    #: ``KAFKA_BOOTSTRAP_SERVERS`` (default ``127.0.0.1:9092``).
    bootstrap: str = DEFAULT_BOOTSTRAP
    #: ``KAFKA_SECURITY_PROTOCOL``, ``KAFKA_SASL_*``, ``KAFKA_SSL_*``: TLS and SASL for every
    #: client of the worker (``botmesh.streams.connection``).
    security: Security = field(default_factory=Security)
    #: ``BOTMESH_TOPIC_PREFIX`` (default ``botmesh``): every topic name and the group.
    prefix: str = "botmesh"
    #: ``BOTMESH_DATA_DIR`` (default ``./botmesh-data``): the journal's RocksDB databases
    #: (one a partition, under ``journal/``).
    data_dir: Path = field(default_factory=lambda: Path("botmesh-data"))
    #: ``BOTMESH_JOURNAL``: ``kafka`` (the default: the journal on Kafka, shared by the
    #: group) or a ``file://`` URL (one worker alone).
    journal: str | None = None
    #: ``BOTMESH_INSTANCE_ID``: the lease owner in the journal and the consumer's static
    #: ``group.instance.id``. Stable across restarts of one replica, unique per replica.
    #: Unset: the runtime's default id, and a dynamic group member.
    instance_id: str | None = None
    #: ``BOTMESH_HTTP_HOST`` (``127.0.0.1``): the address of ``/healthz``, ``/readyz`` and
    #: ``/metrics`` (``0.0.0.0`` in a container, for the kubelet and Prometheus).
    http_host: str = "127.0.0.1"
    #: ``BOTMESH_HTTP_PORT`` (unset: no server): their port (``0``: any free one, logged).
    http_port: int | None = None
    #: ``BOTMESH_PARTITIONS`` (8): partitions of the topics the worker creates.
    partitions: int = DEFAULT_PARTITIONS
    #: ``BOTMESH_REPLICATION`` (1): replication factor of the topics the worker creates.
    replication: int = 1
    #: ``BOTMESH_BATCH_SIZE`` (500): records per processing batch.
    batch_size: int = 500
    #: ``BOTMESH_IN_FLIGHT`` (1000): records taken and not yet settled, over every batch
    #: running; beyond, the worker takes no more until some settle.
    in_flight: int = 1000
    #: ``BOTMESH_SESSION_TIMEOUT`` (30 s): how long the group waits for a silent member
    #: (a killed worker without a static id) before it gives its partitions to others.
    session_timeout: float = DEFAULT_SESSION_TIMEOUT
    #: Longest a batch may keep retrying records (a journal outage) before the worker exits
    #: without acking it, seconds (default 600).
    batch_deadline: float = 600.0
    #: ``BOTMESH_PROCESSING_GUARANTEE`` (``at_least_once``, or ``exactly_once``). Under
    #: ``exactly_once`` the worker's one producer is transactional: the journal's changelog
    #: records, receipts and dead letters go into its transaction with the batch's offsets,
    #: and a journal write returns once that transaction committed
    #: (``botmesh.streams.worker.changelog``).
    guarantee: str = "at_least_once"
    #: ``BOTMESH_METRICS_INTERVAL`` (10 s): how often the worker publishes its counters to
    #: ``<prefix>.metrics`` (and once at a clean stop).
    metrics_interval: float = 10.0
    #: ``BOTMESH_STOP_TIMEOUT`` (30 s): how long a stop (SIGTERM / Ctrl-C) may take; past
    #: it the worker logs what it was waiting on and exits with status 70 without acking
    #: the batch in progress (the broker redelivers it, the journal answers the duplicates).
    stop_timeout: float = 30.0
    #: ``BOTMESH_TOPIC_WAIT`` (60 s): how long the worker waits at its start for the
    #: broker's metadata to list every topic it subscribes to (a topic just created may not
    #: be listed yet) before it joins its group; past it the worker exits naming the topics.
    topic_wait: float = 60.0
    #: ``BOTMESH_LOG_LEVEL`` (``info``).
    loglevel: str = "info"
    #: Create the topics at start (idempotent).
    provision: bool = True
    #: ``BOTMESH_RATE_LIMIT``, ``BOTMESH_CHAT_RATE_LIMIT``, ``BOTMESH_GROUP_RATE_LIMIT``:
    #: the channel's rate limits over the bot's ``outbox.rate_limits`` (``None``: the
    #: bot's). The channel limit is the whole group's: each worker takes the part of it
    #: its share of the inbound partitions is (docs/rate-limits.md).
    rate_limits: RateLimits | None = None

    def __post_init__(self) -> None:
        if self.journal is not None:
            check_worker_journal(self.journal, "journal")
        if self.instance_id is not None and not self.instance_id.strip():
            raise ValueError("instance id: must not be empty; leave it out for the default")
        if not 6.0 <= self.session_timeout <= 1800.0:
            raise ValueError(
                f"session timeout (BOTMESH_SESSION_TIMEOUT) {self.session_timeout:g}s: Kafka "
                "accepts 6 to 1800 seconds"
            )
        check_guarantee(self.guarantee, "processing guarantee")
        if self.http_port is not None and not 0 <= self.http_port <= 65535:
            raise ValueError(
                f"HTTP port (BOTMESH_HTTP_PORT, --http-port) {self.http_port}: must be 0-65535"
            )
        if not self.http_host.strip():
            raise ValueError("HTTP host (BOTMESH_HTTP_HOST, --http-host): must not be empty")
        if not self.stop_timeout > 0:
            raise ValueError(
                f"stop timeout (BOTMESH_STOP_TIMEOUT) {self.stop_timeout:g}s: must be a "
                "positive number of seconds"
            )
        if not self.topic_wait > 0:
            raise ValueError(
                f"topic wait (BOTMESH_TOPIC_WAIT) {self.topic_wait:g}s: must be a positive "
                "number of seconds"
            )
        if not self.metrics_interval > 0:
            raise ValueError(
                f"metrics interval (BOTMESH_METRICS_INTERVAL) {self.metrics_interval:g}s: "
                "must be a positive number of seconds"
            )

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> WorkerConfig:
        env = os.environ if environ is None else environ
        for name, instead in RETIRED.items():  # set for a release that read it: say so
            if env.get(name, "").strip():
                raise ValueError(f"{name} is no longer read: {instead}")
        journal = env.get("BOTMESH_JOURNAL", "").strip() or None
        if journal is not None and overrides.get("journal") is None:
            check_worker_journal(journal, "BOTMESH_JOURNAL")
        base = cls(
            bootstrap=env.get("KAFKA_BOOTSTRAP_SERVERS", "").strip() or DEFAULT_BOOTSTRAP,
            security=Security.from_env(env),
            prefix=prefix_from_env(env),
            data_dir=Path(env.get("BOTMESH_DATA_DIR", "").strip() or "botmesh-data"),
            journal=journal if overrides.get("journal") is None else None,
            instance_id=env.get("BOTMESH_INSTANCE_ID", "").strip() or None,
            http_host=env.get("BOTMESH_HTTP_HOST", "").strip() or "127.0.0.1",
            http_port=_int_env(env, "BOTMESH_HTTP_PORT", None),
            partitions=_int_env(env, "BOTMESH_PARTITIONS", DEFAULT_PARTITIONS) or 1,
            replication=_int_env(env, "BOTMESH_REPLICATION", 1) or 1,
            batch_size=_int_env(env, "BOTMESH_BATCH_SIZE", 500) or 1,
            in_flight=_int_env(env, "BOTMESH_IN_FLIGHT", 1000) or 1,
            session_timeout=_float_env(env, "BOTMESH_SESSION_TIMEOUT", DEFAULT_SESSION_TIMEOUT),
            metrics_interval=_float_env(env, "BOTMESH_METRICS_INTERVAL", 10.0),
            stop_timeout=_float_env(env, "BOTMESH_STOP_TIMEOUT", 30.0),
            topic_wait=_float_env(env, "BOTMESH_TOPIC_WAIT", 60.0),
            loglevel=env.get("BOTMESH_LOG_LEVEL", "").strip() or "info",
            rate_limits=_rate_limits_env(env),
            guarantee=check_guarantee(
                env.get("BOTMESH_PROCESSING_GUARANTEE", "").strip() or "at_least_once",
                "BOTMESH_PROCESSING_GUARANTEE",
            ),
        )
        changes = {k: v for k, v in overrides.items() if v is not None}
        if "prefix" in changes:
            check_prefix(changes["prefix"])
        if "guarantee" in changes:
            changes["guarantee"] = check_guarantee(changes["guarantee"])
        return replace(base, **changes)

    @property
    def kafka(self) -> KafkaSettings:
        """The brokers and their security settings, for every client of the worker."""
        return KafkaSettings(self.bootstrap, self.security)

    @property
    def catalog(self) -> Catalog:
        return Catalog(self.prefix)

    @property
    def journal_url(self) -> str:
        """The journal the worker runs on: ``kafka`` (the default) or a ``file://`` URL."""
        if self.journal is None:
            return KAFKA_JOURNAL
        return check_worker_journal(self.journal, "journal")

    @property
    def exactly_once(self) -> bool:
        """``exactly_once``: a transactional producer, read_committed consumers."""
        return check_guarantee(self.guarantee, "processing guarantee") == "exactly_once"

    @property
    def kafka_journal(self) -> bool:
        """The worker journals on Kafka (a changelogged table), not in a file."""
        return self.journal_url == KAFKA_JOURNAL
