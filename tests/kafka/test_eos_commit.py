"""``JournalTable``'s transaction commit under ``exactly_once`` on stand-ins for Faust's
producer and aiokafka's transactional producer (no broker): one commit serves the records
waiting; a commit that fails aborts the transaction, fails every record in it and lets
none of them reach RocksDB; records of a producer Faust replaced are never vouched for."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest
from aiokafka.errors import KafkaError
from aiokafka.producer.transaction_manager import TransactionState

from botmesh.state.errors import JournalUnavailableError
from botmesh.streams.faust_app.table import JournalTable

TID = "app-1-0"


class FakeTxp:
    """aiokafka's transactional producer: sends resolve at once (offsets 0, 1, ...)."""

    def __init__(self, fail_commit: bool = False) -> None:
        self.fail_commit = fail_commit
        self.offset = 0
        self.calls: list[str] = []
        self._txn_manager = SimpleNamespace(state=TransactionState.IN_TRANSACTION)

    async def send(
        self,
        topic: str,
        value: bytes | None,
        *,
        key: bytes,
        partition: int,
        headers: list[tuple[str, bytes]] | None = None,
    ) -> Any:
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        fut.set_result(SimpleNamespace(offset=self.offset))
        self.offset += 1
        return fut

    async def commit_transaction(self) -> None:
        self.calls.append("commit")
        await asyncio.sleep(0.01)
        if self.fail_commit:
            raise KafkaError("the coordinator said no")
        self._txn_manager.state = TransactionState.READY

    async def abort_transaction(self) -> None:
        self.calls.append("abort")
        self._txn_manager.state = TransactionState.READY

    async def begin_transaction(self) -> None:
        self.calls.append("begin")
        self._txn_manager.state = TransactionState.IN_TRANSACTION


class Table(JournalTable):
    changelog_topic_name = "app-journal-changelog"

    def __init__(self, txp: FakeTxp) -> None:  # Faust's own __init__ is not needed here
        self.app: Any = SimpleNamespace(
            producer=SimpleNamespace(
                _transaction_producers={TID: txp}, _trn_locks={TID: asyncio.Lock()}
            )
        )
        self.persisted: list[tuple[bytes, int]] = []
        self.offsets: list[int] = []
        self.start_transactions()
        self._tids[0] = TID

    def persist_many(
        self,
        partition: int,
        records: list[tuple[bytes, bytes | None, int]],
        offset: int | None = None,
    ) -> None:
        self.persisted += [(key, o) for key, _, o in records]
        self.offsets.append(records[-1][2] if offset is None else offset)


async def test_one_transaction_commit_serves_every_record_waiting() -> None:
    txp = FakeTxp()
    table = Table(txp)
    done = [await table.produce(0, f"k{i}".encode(), b"v") for i in range(3)]
    table.commit_soon([0])
    table.commit_soon([0])  # a commit asked for again meanwhile: the same round
    await asyncio.gather(*done)
    assert txp.calls == ["commit", "begin"]
    assert table.persisted == [(b"k0", 0), (b"k1", 1), (b"k2", 2)]
    assert table.offsets == [3]  # the commit marker after the last record


async def test_a_failed_transaction_commit_fails_every_record_and_persists_none() -> None:
    txp = FakeTxp(fail_commit=True)
    table = Table(txp)
    done = [await table.produce(0, f"k{i}".encode(), b"v") for i in range(2)]
    table.commit_soon([0])
    for fut in done:
        with pytest.raises(JournalUnavailableError, match="not committed"):
            await fut
    assert txp.calls == ["commit", "abort", "begin"]  # aborted, and the next one begun
    assert table.persisted == [] and table.offsets == []


async def test_records_of_a_replaced_producer_are_not_vouched_for() -> None:
    old = FakeTxp()
    table = Table(old)
    done = await table.produce(0, b"k", b"v")
    table.app.producer._transaction_producers[TID] = FakeTxp()  # Faust replaced it
    table.commit_soon([0])
    with pytest.raises(JournalUnavailableError, match="replaced"):
        await done
    assert table.persisted == []


async def test_a_transaction_faust_ended_counts_as_committed() -> None:
    txp = FakeTxp()
    table = Table(txp)
    done = await table.produce(0, b"k", b"v")
    txp._txn_manager.state = TransactionState.READY  # Faust's commit_and_end_transactions
    table.commit_soon([0])
    await done
    assert txp.calls == []  # neither committed again nor begun: Faust begins the next one
    assert table.persisted == [(b"k", 0)]
