"""The Kafka broker for the test suite, and small helpers for Kafka tests.

Where the broker comes from (:func:`acquire_broker`, used by the ``kafka_bootstrap`` fixture):

1. ``KAFKA_BOOTSTRAP_SERVERS`` set: that broker (it must answer, else the tests fail);
2. a Docker engine answers: a ``testcontainers`` Kafka container (image ``KAFKA_TEST_IMAGE``,
   default ``confluentinc/cp-kafka:7.6.0`` in KRaft mode), stopped at the end;
3. otherwise the local JVM broker of ``deploy/kafka/kafka.sh`` on 127.0.0.1:19092 (controller
   19093, data ``deploy/kafka/.run/test``, wiped when this session starts it).

Several pytest sessions on one machine share the local broker: the first starts it, later ones
reuse it. Each session holds a shared ``flock`` on ``.run/test.users`` while it uses the broker; at
the end, the session that started it stops it if nobody else holds the lock; if others still do,
the last of them stops it (the starter is gone by then). A broker left by a crashed session (its
starter dead, no users) is restarted clean. Works with or without pytest-xdist (each xdist worker
is one user).

Helpers for tests (all take the ``host:port`` bootstrap string the fixture returns):

- :func:`broker_answers` — does a Kafka broker answer an ApiVersions request (raw socket, fast);
- :func:`create_topics` — create topics and wait until their leaders are known;
- :func:`delete_topics`;
- :func:`end_offsets` — high watermarks of a topic's partitions;
- :func:`committed_offsets` — a consumer group's committed offsets;
- :func:`kafka_tool` — run ``deploy/kafka/kafka.sh tool NAME args...`` (a CLI JVM, ~1-2 s).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import random
import shutil
import socket
import struct
import subprocess
import time
import warnings
from collections.abc import Callable, Iterable, Mapping
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

REPO = Path(__file__).resolve().parents[2]
KAFKA_SH = REPO / "deploy" / "kafka" / "kafka.sh"
RUN_DIR = REPO / "deploy" / "kafka" / ".run"
TEST_DATA_DIR = RUN_DIR / "test"
TEST_PORT = 19092
TEST_CONTROLLER_PORT = 19093
TEST_BOOTSTRAP = f"127.0.0.1:{TEST_PORT}"
START_TIMEOUT_S = 180


class BrokerUnavailable(RuntimeError):
    """No Kafka broker could be found or started; the message says why and what to do."""


# ------------------------------------------------------------------------------------ probing


def _split(bootstrap: str) -> tuple[str, int]:
    first = bootstrap.split(",", maxsplit=1)[0].strip()
    if "://" in first:
        first = first.split("://", 1)[1]
    host, _, port = first.rpartition(":")
    if not host or not port.isdigit():
        raise BrokerUnavailable(
            f"bad bootstrap address {bootstrap!r}: expected host:port (e.g. 127.0.0.1:9092)"
        )
    return host.strip("[]"), int(port)


def broker_answers(bootstrap: str, timeout: float = 2.0) -> bool:
    """True when the first ``host:port`` of ``bootstrap`` answers a Kafka ApiVersions v0 request."""
    host, port = _split(bootstrap)
    client_id = b"botmesh-probe"
    correlation = 0x5EED
    header = struct.pack(">hhih", 18, 0, correlation, len(client_id)) + client_id
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            sock.settimeout(timeout)
            sock.sendall(struct.pack(">i", len(header)) + header)
            head = _recv_exact(sock, 4)
            (size,) = struct.unpack(">i", head)
            body = _recv_exact(sock, min(size, 64 * 1024))
    except OSError:
        return False
    if len(body) < 6:
        return False
    got_corr, error_code = struct.unpack(">ih", body[:6])
    return bool(got_corr == correlation and error_code == 0)


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("connection closed by the broker")
        buf.extend(chunk)
    return bytes(buf)


# ------------------------------------------------------------------------------------ kafka.sh


def _kafka_sh_env() -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        KAFKA_PORT=str(TEST_PORT),
        KAFKA_CONTROLLER_PORT=str(TEST_CONTROLLER_PORT),
        KAFKA_DATA_DIR=str(TEST_DATA_DIR),
    )
    return env


def _run_kafka_sh(*args: str, timeout: float = START_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(KAFKA_SH), *args],
        env=_kafka_sh_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def kafka_tool(name: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Run a Kafka CLI tool (``kafka.sh tool NAME args...``); check ``returncode`` yourself.

    Pass ``--bootstrap-server`` explicitly. Each call is a fresh JVM (~1-2 s): prefer a client
    library in loops.
    """
    return subprocess.run(
        [str(KAFKA_SH), "tool", name, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


# ------------------------------------------------------------------------------------ leases


def _proc_start_time(pid: int) -> str | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def _me() -> str:
    return f"{os.getpid()} {_proc_start_time(os.getpid())}"


def _alive(owner: str) -> bool:
    try:
        pid_s, start = owner.split()
        return _proc_start_time(int(pid_s)) == start
    except ValueError:
        return False


@dataclass
class BrokerLease:
    """A broker for one test session; :meth:`release` once at the end."""

    bootstrap: str
    source: str  # "env", "docker" or "local"
    _release: Callable[[], None] = field(default=lambda: None, repr=False)

    def release(self) -> None:
        release, self._release = self._release, lambda: None
        release()


def acquire_broker() -> BrokerLease:
    """The broker for this session (see the module docstring); raises :class:`BrokerUnavailable`."""
    env = os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "").strip()
    if env:
        if not broker_answers(env, timeout=5):
            raise BrokerUnavailable(
                f"KAFKA_BOOTSTRAP_SERVERS={env!r} does not answer a Kafka ApiVersions request; "
                "start that broker or unset the variable to use the local one"
            )
        return BrokerLease(env, "env")
    docker = _docker_lease()
    if docker is not None:
        return docker
    return _local_lease()


def _docker_answers() -> bool:
    if not (os.environ.get("DOCKER_HOST") or Path("/var/run/docker.sock").exists()):
        return False
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import docker  # type: ignore[import-untyped]

            client = docker.from_env(timeout=3)
            try:
                return bool(client.ping())
            finally:
                client.close()
    except Exception:
        return False


def _docker_lease() -> BrokerLease | None:
    if not _docker_answers():
        return None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from testcontainers.community.kafka import KafkaContainer

        image = os.environ.get("KAFKA_TEST_IMAGE", "confluentinc/cp-kafka:7.6.0")
        container: Any = KafkaContainer(image).with_kraft()
        container.start()
    bootstrap = str(container.get_bootstrap_server())

    def stop() -> None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            container.stop()

    return BrokerLease(bootstrap, "docker", stop)


def _local_lease() -> BrokerLease:
    RUN_DIR.mkdir(parents=True, exist_ok=True)
    owner_file = RUN_DIR / "test.owner"
    users: IO[str] = open(RUN_DIR / "test.users", "a")  # noqa: SIM115 - held for the session
    started = False
    try:
        with _exclusive(RUN_DIR / "test.lock"):
            running = broker_answers(TEST_BOOTSTRAP)
            if running and _try_exclusive(users):
                owner = owner_file.read_text().strip() if owner_file.exists() else ""
                if not _alive(owner):
                    # left by a session that died: nobody uses it, restart it clean
                    _run_kafka_sh("stop", timeout=60)
                    running = broker_answers(TEST_BOOTSTRAP)
            fcntl.flock(users, fcntl.LOCK_SH)
            if not running:
                _start_local()
                owner_file.write_text(_me() + "\n")
                started = True
    except BaseException:
        users.close()
        raise

    def release() -> None:
        try:
            with _exclusive(RUN_DIR / "test.lock"):
                if not _try_exclusive(users):
                    return  # other sessions still use it; the last one stops it
                owner = owner_file.read_text().strip() if owner_file.exists() else ""
                if started or not _alive(owner):
                    _run_kafka_sh("stop", timeout=90)
                    with suppress(FileNotFoundError):
                        owner_file.unlink()
        finally:
            users.close()

    return BrokerLease(TEST_BOOTSTRAP, "local", release)


def _start_local() -> None:
    if not KAFKA_SH.exists():
        raise BrokerUnavailable(f"{KAFKA_SH} is missing")
    # a broker of ours that does not answer (its starter was killed mid-start): stop it first
    _run_kafka_sh("stop", timeout=60)
    shutil.rmtree(TEST_DATA_DIR, ignore_errors=True)
    try:
        proc = _run_kafka_sh("start")
    except subprocess.TimeoutExpired as exc:
        raise BrokerUnavailable(
            f"deploy/kafka/kafka.sh start did not finish in {START_TIMEOUT_S}s; "
            f"see {TEST_DATA_DIR / 'server.log'}"
        ) from exc
    if proc.returncode != 0:
        raise BrokerUnavailable(
            "could not start the local Kafka broker with deploy/kafka/kafka.sh start "
            f"(exit {proc.returncode}); java 17+ and mvn (first run) must be on PATH, "
            f"ports {TEST_PORT}/{TEST_CONTROLLER_PORT} free. Output:\n"
            f"{proc.stdout[-3000:]}{proc.stderr[-3000:]}"
        )


class _exclusive:
    """``with _exclusive(path):`` holds an exclusive flock on ``path``."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._fh: IO[str] | None = None

    def __enter__(self) -> None:
        self._fh = open(self._path, "a")
        fcntl.flock(self._fh, fcntl.LOCK_EX)

    def __exit__(self, *exc: object) -> None:
        assert self._fh is not None
        self._fh.close()


def _try_exclusive(fh: IO[str]) -> bool:
    """Turn our lock on ``fh`` exclusive if no other process holds it; keeps it shared if not."""
    try:
        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


# ------------------------------------------------------------------------------------ helpers


def _admin(bootstrap: str) -> Any:
    from confluent_kafka.admin import AdminClient

    from botmesh.streams.connection import ADMIN_IDLE_MS

    # idle connections closed as botmesh's own admin clients do (a group request left
    # behind by librdkafka is asked again: ``botmesh.streams.connection.admin``)
    conf: dict[str, str | int | float | bool] = {
        "bootstrap.servers": bootstrap,
        "log_level": 3,
        "connections.max.idle.ms": ADMIN_IDLE_MS,
    }
    return AdminClient(conf)


def create_topics(
    bootstrap: str,
    names: Iterable[str],
    partitions: int = 1,
    *,
    replication_factor: int = -1,
    config: Mapping[str, str] | None = None,
    timeout: float = 30,
) -> None:
    """Create ``names`` (existing ones are fine) and wait until every partition has a leader.

    ``replication_factor=-1`` takes the broker's default (1 on the test broker). ``config`` is
    per-topic config, e.g. ``{"cleanup.policy": "compact"}``.
    """
    from confluent_kafka import KafkaException
    from confluent_kafka.cimpl import NewTopic

    names = list(names)
    admin = _admin(bootstrap)
    new = [
        NewTopic(
            n,
            num_partitions=partitions,
            replication_factor=replication_factor,
            config=dict(config or {}),
        )
        for n in names
    ]
    for fut in admin.create_topics(new, operation_timeout=timeout).values():
        try:
            fut.result(timeout)
        except KafkaException as exc:
            if exc.args[0].name() != "TOPIC_ALREADY_EXISTS":
                raise
    deadline = time.monotonic() + timeout
    while True:
        md = admin.list_topics(timeout=timeout)
        ready = all(
            n in md.topics
            and md.topics[n].error is None
            and len(md.topics[n].partitions) >= partitions
            and all(p.leader >= 0 for p in md.topics[n].partitions.values())
            for n in names
        )
        if ready:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"topics {names} have no leader after {timeout}s")
        time.sleep(0.1)


def delete_topics(bootstrap: str, names: Iterable[str], timeout: float = 30) -> None:
    """Delete ``names``; missing topics are ignored."""
    from confluent_kafka import KafkaException

    names = list(names)
    if not names:
        return
    admin = _admin(bootstrap)  # held: a client collected early fails its futures (_DESTROY)
    for fut in admin.delete_topics(names, operation_timeout=timeout).values():
        try:
            fut.result(timeout)
        except KafkaException as exc:
            if exc.args[0].name() != "UNKNOWN_TOPIC_OR_PART":
                raise


def free_ports(count: int) -> list[int]:
    """``count`` consecutive ports of 127.0.0.1 that nothing listens on now, between 20000
    and 32000: below Linux's ephemeral range, so no client's socket takes one before the
    broker binds it, and apart from the fixed ports of the test servers. Drawn at random:
    the brokers that parallel test workers start each find their own."""
    rng = random.Random()
    for _ in range(200):
        first = rng.randrange(20000, 32000 - count)
        try:
            for port in range(first, first + count):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", port))
        except OSError:
            continue
        return list(range(first, first + count))
    raise AssertionError(f"no {count} free ports between 20000 and 32000")


def forget_prefix(bootstrap: str, prefix: str, timeout: float = 30) -> None:
    """Delete every topic of ``prefix`` (``prefix.*``: the catalog's, the worker's changelog
    and assignor topics) and its consumer groups, once a test is done with them.

    A broker's cost grows with its partitions: every client's first metadata request lists
    them all, and the broker answers it. On a broker left holding 17,000 partitions by
    earlier runs, Kafka tests took about twice the CPU they take on a fresh one
    (docs/measurements.md)."""
    from confluent_kafka import KafkaException

    admin = _admin(bootstrap)
    md = admin.list_topics(timeout=timeout)
    delete_topics(bootstrap, [n for n in md.topics if n.startswith(f"{prefix}.")], timeout)
    groups = [
        g.group_id
        for g in admin.list_consumer_groups(request_timeout=timeout).result(timeout).valid
        if g.group_id.startswith(prefix)
    ]
    if groups:  # a group with members (a worker a test left running) stays
        for fut in admin.delete_consumer_groups(groups, request_timeout=timeout).values():
            with contextlib.suppress(KafkaException):
                fut.result(timeout)


def end_offsets(bootstrap: str, topic: str, timeout: float = 30) -> dict[int, int]:
    """``{partition: last stable offset}`` of ``topic`` (the high watermark without open txns)."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "botmesh-offsets-probe",
            "log_level": 3,
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
        }
    )
    try:
        md = consumer.list_topics(topic, timeout=timeout)
        result: dict[int, int] = {}
        for p in md.topics[topic].partitions:
            _low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=timeout)
            result[p] = high
        return result
    finally:
        consumer.close()


def committed_offsets(
    bootstrap: str, group: str, timeout: float = 30
) -> dict[tuple[str, int], int]:
    """``{(topic, partition): committed offset}`` of consumer group ``group``."""
    from confluent_kafka import ConsumerGroupTopicPartitions

    admin = _admin(bootstrap)
    futs = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)])
    res = futs[group].result(timeout)
    return {(tp.topic, tp.partition): tp.offset for tp in res.topic_partitions if tp.offset >= 0}


class OwnBroker:
    """A single-node broker of one test only (``kafka.sh`` with its own ports and data)."""

    def __init__(self, data: Path) -> None:
        port, controller = free_ports(2)
        self.bootstrap = f"127.0.0.1:{port}"
        self.env = {
            **os.environ,
            "KAFKA_PORT": str(port),
            "KAFKA_CONTROLLER_PORT": str(controller),
            "KAFKA_DATA_DIR": str(data),
        }

    def run(self, command: str) -> None:
        done = subprocess.run(
            [str(KAFKA_SH), command],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=240,
            check=False,
        )
        assert done.returncode == 0, (
            f"kafka.sh {command}: {done.stdout[-2000:]}{done.stderr[-2000:]}"
        )
