"""Kafka fixtures: ``kafka_bootstrap`` (one broker per session) and ``topic_prefix`` (per test).

The broker comes from ``KAFKA_BOOTSTRAP_SERVERS``, else Docker (testcontainers), else the local
JVM broker of ``deploy/kafka/kafka.sh`` on 127.0.0.1:19092 (see ``tests/kafka/broker.py``). A test
that needs a broker and cannot get one fails; it is never skipped.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from tests.kafka.broker import BrokerUnavailable, acquire_broker


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
def topic_prefix() -> str:
    """A unique topic/group name prefix for one test, e.g. ``t1a2b3c4d``."""
    return f"t{uuid.uuid4().hex[:8]}"
