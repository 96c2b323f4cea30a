"""Kafka fixtures: ``kafka_bootstrap`` (one broker per session), ``topic_prefix`` (per test), and
for the kill tests ``recorder`` (provider calls, counted in this process) and ``tally``
(receipts and dead letters as they arrive).

The broker comes from ``KAFKA_BOOTSTRAP_SERVERS``, else Docker (testcontainers), else the local
JVM broker of ``deploy/kafka/kafka.sh`` on 127.0.0.1:19092 (see ``tests/kafka/broker.py``). A test
that needs a broker and cannot get one fails; it is never skipped.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from botmesh.streams.provision import ensure_topics
from botmesh.topics import Catalog
from tests.kafka.broker import BrokerUnavailable, OwnBroker, acquire_broker, forget_prefix
from tests.kafka.recorder import Recorder, Tally
from tests.kafka.worker import PARTITIONS


@pytest.fixture(scope="session")
def kafka_bootstrap() -> Iterator[str]:
    """``host:port`` of a Kafka broker for this session (started once, stopped if we started it)."""
    try:
        lease = acquire_broker()
    except BrokerUnavailable as exc:
        pytest.fail(f"no Kafka broker for the kafka tests: {exc}", pytrace=False)
    try:
        yield lease.bootstrap
    finally:
        lease.release()


@pytest.fixture
def topic_prefix(request: pytest.FixtureRequest) -> Iterator[str]:
    """A unique topic/group name prefix for one test, e.g. ``t1a2b3c4d``. When the test ran
    on the broker, its topics and groups are deleted after it (``forget_prefix``)."""
    prefix = f"t{uuid.uuid4().hex[:8]}"
    yield prefix
    if "kafka_bootstrap" in request.fixturenames:
        forget_prefix(request.getfixturevalue("kafka_bootstrap"), prefix)


@pytest.fixture
def recorder() -> Iterator[Recorder]:
    with Recorder() as rec:
        yield rec


@pytest.fixture
async def tally(kafka_bootstrap: str, topic_prefix: str) -> AsyncIterator[Tally]:
    cat = Catalog(topic_prefix)
    ensure_topics(kafka_bootstrap, cat.specs(partitions=PARTITIONS))
    t = await Tally(kafka_bootstrap, cat.sent, cat.inbound_dlq).start()
    try:
        yield t
    finally:
        await t.close()


@pytest.fixture
def own_broker(tmp_path: Path) -> Iterator[OwnBroker]:
    """A single-node broker of the test's own, to stop and start (``OwnBroker``)."""
    broker = OwnBroker(tmp_path / "kafka")
    broker.run("start")
    try:
        yield broker
    finally:
        broker.run("stop")
