"""What a changelog record's failure says, for the errors librdkafka ends a transaction
with: a fence names the newer producer; ``INVALID_TXN_STATE`` (the coordinator aborted the
transaction already, past its timeout: the worker stood still longer) says so in words, so
an operator reading the worker's last line knows why it gave its batch up."""

from __future__ import annotations

from confluent_kafka import KafkaError

from botmesh.state.errors import JournalUnavailableError
from botmesh.streams.worker.changelog import TIMED_OUT_TXN, ProducerFencedError, _failure


def test_a_transaction_the_coordinator_timed_out_is_said_in_words() -> None:
    failure = _failure(KafkaError(KafkaError.INVALID_TXN_STATE), b"in/42", "not committed")
    assert isinstance(failure, JournalUnavailableError)
    assert TIMED_OUT_TXN in str(failure) and "INVALID_TXN_STATE" in str(failure)


def test_a_fence_names_the_newer_producer_and_an_outage_only_its_error() -> None:
    fenced = _failure(KafkaError(KafkaError.PRODUCER_FENCED), b"in/42", "not committed")
    assert isinstance(fenced, ProducerFencedError) and "fenced this one" in str(fenced)
    lost = _failure(KafkaError(KafkaError._MSG_TIMED_OUT), b"in/42")
    assert isinstance(lost, JournalUnavailableError) and TIMED_OUT_TXN not in str(lost)
