"""Fixtures of the gateway tests: the broker (``kafka_bootstrap``, one per session) and a
fresh ``topic_prefix`` per test, the same fixtures as ``tests/kafka`` uses."""

from __future__ import annotations

from tests.kafka.conftest import kafka_bootstrap, topic_prefix

__all__ = ["kafka_bootstrap", "topic_prefix"]
