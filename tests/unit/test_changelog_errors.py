"""What a changelog record's failure says, for the errors librdkafka ends a transaction
with: a fence names the newer producer; ``INVALID_TXN_STATE`` (the coordinator aborted the
transaction already, past its timeout: the worker stood still longer) says so in words, so
an operator reading the worker's last line knows why it gave its batch up."""

from __future__ import annotations

from confluent_kafka import KafkaError

from botmesh.state.errors import JournalUnavailableError
from botmesh.streams.worker.changelog import TIMED_OUT_TXN, ProducerFencedError, _failure
from botmesh.streams.worker.loop import producer_failure


def test_a_transaction_the_coordinator_timed_out_is_said_in_words() -> None:
    failure = _failure(KafkaError(KafkaError.INVALID_TXN_STATE), b"in/42", "not committed")
    assert isinstance(failure, JournalUnavailableError)
    assert TIMED_OUT_TXN in str(failure) and "INVALID_TXN_STATE" in str(failure)


def test_a_fence_names_the_newer_producer_and_an_outage_only_its_error() -> None:
    fenced = _failure(KafkaError(KafkaError.PRODUCER_FENCED), b"in/42", "not committed")
    assert isinstance(fenced, ProducerFencedError) and "fenced this one" in str(fenced)
    lost = _failure(KafkaError(KafkaError._MSG_TIMED_OUT), b"in/42")
    assert isinstance(lost, JournalUnavailableError) and TIMED_OUT_TXN not in str(lost)


def test_a_worker_whose_producer_failed_says_why_on_its_last_line() -> None:
    """The worker's exit (status 75) when the producer fails for good: a transaction the
    coordinator aborted over a freeze (librdkafka ends it with a fatal ``INVALID_TXN_STATE``)
    is said in the same words as a record's failure; a fence names the newer epoch."""
    lost = producer_failure(KafkaError(KafkaError.INVALID_TXN_STATE, "Failed to end transaction"))
    assert lost.startswith("the producer failed: " + TIMED_OUT_TXN), lost
    assert lost.endswith("INVALID_TXN_STATE: Failed to end transaction"), lost
    fenced = producer_failure(KafkaError(KafkaError._FENCED))
    assert fenced.startswith("the producer fenced by a newer producer epoch"), fenced
    other = producer_failure(KafkaError(KafkaError._FATAL, "idempotence"))
    assert other == "the producer failed: _FATAL: idempotence" and TIMED_OUT_TXN not in other
