"""Fixtures of the gateway tests: ``kafka_bootstrap`` (one broker per session, from
``tests.kafka.broker.acquire_broker``: ``KAFKA_BOOTSTRAP_SERVERS``, else Docker, else the
local JVM broker) and ``topic_prefix`` (a fresh prefix per test), as in ``tests/kafka``."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from tests.kafka.broker import BrokerUnavailable, acquire_broker


@pytest.fixture(scope="session")
def kafka_bootstrap() -> Iterator[str]:
    try:
        lease = acquire_broker()
    except BrokerUnavailable as exc:
        pytest.fail(f"no Kafka broker for the gateway tests: {exc}", pytrace=False)
    try:
        yield lease.bootstrap
    finally:
        lease.release()


@pytest.fixture
def topic_prefix() -> str:
    return f"g{uuid.uuid4().hex[:8]}"
