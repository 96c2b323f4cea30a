"""``groups.coordinated``: a request to a group's coordinator asked again while the
coordinator loads or moves, after an attempt whose connection went down, and after an
attempt that timed out (librdkafka leaves a group
request waiting out its whole timeout once its ``FindCoordinator`` retries are spent),
each attempt given twice the time of the one before, up to the caller's timeout.

The futures are the ones the admin client hands out (``concurrent.futures.Future``), here
settled with the errors librdkafka settles them with; what librdkafka does on a broker
whose coordinator is loading is in ``tests/kafka/test_oauthbearer.py`` (a broker's first
group request) and the ops tests."""

from __future__ import annotations

from concurrent.futures import Future
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

from botmesh.streams.groups import coordinated

BOOTSTRAP = "127.0.0.1:9"


def settled(value: Any = None, *, error: int | None = None) -> Future[Any]:
    fut: Future[Any] = Future()
    if error is None:
        fut.set_result(value)
    else:
        fut.set_exception(KafkaException(KafkaError(error)))
    return fut


class Asked:
    """``ask``: hands out the futures given, one per attempt, and keeps each attempt's
    request timeout."""

    def __init__(self, *futures: Future[Any]) -> None:
        self.futures = list(futures)
        self.timeouts: list[float] = []

    def __call__(self, request_timeout: float) -> Future[Any]:
        self.timeouts.append(request_timeout)
        return self.futures.pop(0)


def test_an_attempt_that_timed_out_is_asked_again_with_twice_the_time() -> None:
    ask = Asked(
        settled(error=KafkaError._TIMED_OUT),
        settled(error=KafkaError.COORDINATOR_LOAD_IN_PROGRESS),
        settled(error=KafkaError.NOT_COORDINATOR),
        settled("described"),
    )
    assert coordinated(ask, BOOTSTRAP, 60.0) == "described"
    assert ask.timeouts == [2.0, 4.0, 8.0, 16.0]


def test_no_attempt_outlasts_the_callers_timeout() -> None:
    ask = Asked(settled(error=KafkaError._TIMED_OUT), settled("described"))
    assert coordinated(ask, BOOTSTRAP, 3.0) == "described"
    assert ask.timeouts[0] == 2.0
    assert 2.0 < ask.timeouts[1] <= 3.0  # twice 2 s, but only what is left of 3 s


def test_an_attempt_whose_connection_went_down_is_asked_again() -> None:
    """An admin client closes a connection idle for 5 s, and a request that meets it
    closing fails at once (``_TRANSPORT``): seen three times in a row in a worker's
    membership questions, which then refused its journal writes."""
    ask = Asked(*(settled(error=KafkaError._TRANSPORT) for _ in range(3)), settled("described"))
    assert coordinated(ask, BOOTSTRAP, 60.0) == "described"
    assert len(ask.timeouts) == 4


def test_another_error_is_raised_at_once() -> None:
    ask = Asked(settled(error=KafkaError.GROUP_AUTHORIZATION_FAILED), settled("never asked"))
    with pytest.raises(KafkaException) as raised:
        coordinated(ask, BOOTSTRAP, 60.0)
    assert raised.value.args[0].code() == KafkaError.GROUP_AUTHORIZATION_FAILED
    assert len(ask.timeouts) == 1


def test_timed_out_to_the_end_names_the_bootstrap_setting() -> None:
    ask = Asked(*(settled(error=KafkaError._TIMED_OUT) for _ in range(50)))
    with pytest.raises(ConnectionError, match=r"cannot reach Kafka at '127\.0\.0\.1:9'"):
        coordinated(ask, BOOTSTRAP, 0.0)
    assert len(ask.timeouts) == 1
