"""Erasure of a chat on Kafka: the ``erase_chat`` control action in the worker's inbound path
(the runner, no broker), then ``botmesh erase --chat-id`` against a real ``botmesh worker``
on the real broker: a dry run deletes nothing; the erasure leaves tombstones on the journal's
compacted changelog for every key of the chat (read from the topic), the other chat keeps its
records, a restart of the worker (its data dir deleted: restored from the changelog) does
not bring the chat back, the receipt is printed and published on ``<prefix>.control.results``,
and the chat's dead letters on the dead-letter topics are listed in it, not deleted.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from botmesh import Inbound
from botmesh.errors import RecipientUnreachableError
from botmesh.journal import MemoryKv
from botmesh.streams.journal_db import JournalView
from botmesh.streams.ops.dlq import read_dead_letters
from botmesh.streams.ops.tools import produce_inbound
from botmesh.streams.provision import ensure_topics
from botmesh.streams.runner import RawRecord
from botmesh.streams.sink import KafkaReceipts
from botmesh.streams.table_kv import changelog_topic, decode_entry
from botmesh.testing import MockProvider
from botmesh.topics import Catalog
from botmesh.topics.control import ControlRequest, decode_result, encode_control
from tests.kafka.bot import reply_text
from tests.kafka.test_control import control, runner_of
from tests.kafka.test_dlq import botmesh, wait_for
from tests.kafka.test_runner import Produced, make_bot, record
from tests.kafka.worker import PARTITIONS, Worker, read_all, read_journal


async def test_erase_chat_through_control_answers_with_the_receipt() -> None:
    provider, produced = MockProvider(), Produced()
    provider.fail_next(RecipientUnreachableError("no such user"))
    async with make_bot([]).bind(
        provider, MemoryKv(), instance_id="w", receipts=KafkaReceipts(produced)
    ) as rt:
        runner = runner_of(rt, produced)
        await runner.run_batch([record(0, "A", "a1", "secret"), record(1, "A", "a2", "more")])
        await runner.run_batch([record(2, "B", "b1", "other")])
        await runner.run_batch(
            [
                erase_control(3, "dry", dry_run=True),
                control(4, 5.0, "A", "e1", "erase_chat", "A"),
                control(5, 6.0, "A", "e2", "erase_chat", "A"),
            ]
        )
        ops = rt.durability
        assert ops is not None
        assert [r.message["chat_id"] for r in await ops.inbox.list()] == ["B"]
        assert [r.key for r in await ops.outbox.list()] == ["b1:1"]
    answers = [decode_result(v) for role, _, v, _ in produced.records if role == "control-results"]
    dry, first, again = answers
    assert dry.outcome == "done" and dry.state is None and dry.erasure is not None
    assert dry.erasure.dry_run and dry.erasure.deleted == first.erasure.deleted  # type: ignore[union-attr]
    assert first.outcome == "done" and first.state == "erased" and first.erasure is not None
    assert first.erasure.deleted.inbox == 2 and first.erasure.deleted.outbox == 2
    assert [(d.kind, d.id, d.reason) for d in first.erasure.dead] == [
        ("outbox", "a1:1", "send-refused")
    ]
    assert again.erasure is not None and again.erasure.deleted.total == 0
    results = b"".join(v for role, _, v, _ in produced.records if role == "control-results")
    assert b"secret" not in results


def erase_control(offset: int, rid: str, *, dry_run: bool) -> RawRecord:
    request = ControlRequest(
        id=rid, chat_id="A", action="erase_chat", target="A", by="test", dry_run=dry_run
    )
    return RawRecord("t.control", 0, offset, b"A", encode_control(request), [], 4.0)


@pytest.fixture
def worker(kafka_bootstrap: str, topic_prefix: str, tmp_path: Path) -> Any:
    ensure_topics(kafka_bootstrap, Catalog(topic_prefix).specs(partitions=PARTITIONS))
    w = Worker(kafka_bootstrap, topic_prefix, tmp_path)
    yield w
    w.close()


def erase(worker: Worker, chat: str, *args: str) -> tuple[int, dict[str, Any], str]:
    out = botmesh(worker, "erase", "--chat-id", chat, "--json", "--wait", "120", *args)
    receipt = json.loads(out.stdout) if out.returncode == 0 else {}
    return out.returncode, receipt, out.stderr


def of_chat(journal: dict[str, dict[str, Any]], chat: str) -> set[str]:
    return {
        k
        for k, v in journal.items()
        if (v.get("message") or {}).get("chat_id") == chat
        or (v.get("payload") or {}).get("chat_id") == chat
        or k.endswith((f"/flow/{chat}", f"/turn/{chat}"))
        or f"/log/{chat}/" in k
    }


async def last_records(bootstrap: str, topic: str) -> dict[str, bytes | None]:
    """Each journal key's last value on the changelog topic, group records opened
    (``JournalView``; None: a tombstone, or deleted from its group's record)."""
    view = JournalView(keep=False)
    found: dict[str, bytes | None] = {}
    for m in await read_all(bootstrap, topic, committed=True):
        found.update(view.apply(m.key, m.value))
    return found


@pytest.mark.kafka
async def test_botmesh_erase_tombstones_the_chat_on_the_changelog_and_a_restart_keeps_it_gone(
    worker: Worker,
) -> None:
    cat = Catalog(worker.prefix)
    gone, kept = "e1", "e2"
    messages = [
        Inbound(id="g1", chat_id=gone, text="my address is 1 Main St"),
        Inbound(id="g2", chat_id=gone, text="refuse"),  # its reply dies: a dead letter
        Inbound(id="k1", chat_id=kept, text="keep me"),
    ]
    await produce_inbound(worker.bootstrap, cat.inbound, messages)
    worker.start()
    replies = {reply_text("g1", messages[0].text), reply_text("k1", "keep me")}
    await wait_for(
        "the replies and the dead letter",
        lambda: (
            replies <= {s["text"] for s in worker.sends()} and _dead_letter_count(worker, cat) >= 1
        ),
        worker,
    )

    # a dry run (no --yes) deletes nothing and says what would go
    status, plan, err = erase(worker, gone)
    assert status == 0, err
    assert plan["dry_run"] is True and plan["deleted"]["inbox"] == 2
    assert plan["deleted"]["outbox"] == 2  # the reply sent and the dead one
    before = await last_records(worker.bootstrap, changelog_topic(cat))
    keys = {k for k, v in before.items() if v is not None and _chat_of(k, v) == gone}
    assert len(keys) == sum(plan["deleted"].values())

    status, receipt, err = erase(worker, gone, "--yes", "--note", "gdpr ticket 7")
    assert status == 0, err
    assert receipt["dry_run"] is False and receipt["chat_id"] == gone
    assert receipt["note"] == "gdpr ticket 7" and receipt["instance"]
    assert receipt["deleted"] == plan["deleted"]
    where = {(d["kind"], d["id"], d["where"].split(":")[0]) for d in receipt["dead"]}
    assert ("outbox", "g2:1", "journal") in where  # the journal's record, read before
    assert ("outbox", "g2:1", cat.outbox_dlq) in where  # its dead letter, left for you
    assert "1 Main St" not in json.dumps(receipt)

    # tombstones on the compacted changelog for every key of the chat; the other chat's stay
    after = await last_records(worker.bootstrap, changelog_topic(cat))
    assert {k: after[k] for k in keys} == dict.fromkeys(keys, None)
    assert [k for k, v in after.items() if v is not None and f'"{gone}"'.encode() in v] == []
    assert {k for k, v in after.items() if v is not None and _chat_of(k, v) == kept}
    # the receipt is published with the owner's answer on <prefix>.control.results
    published = [
        decode_result(m.value) for m in await read_all(worker.bootstrap, cat.control_results)
    ]
    mine = [r for r in published if r.action == "erase_chat" and r.state == "erased"]
    assert len(mine) == 1 and mine[0].erasure is not None
    assert mine[0].erasure.deleted.total == sum(receipt["deleted"].values())
    # the dead letter stays on its topic (the erasure does not reach it)
    letters = await read_dead_letters(worker.bootstrap, [cat.outbox_dlq])
    assert [d.chat_id for d in letters] == [gone]

    # a restart rebuilt from the changelog alone does not bring the chat back
    assert worker.stop() == 0
    journal = await read_journal(worker)
    assert of_chat(journal, gone) == set() and of_chat(journal, kept)
    shutil.rmtree(worker.data_dir, ignore_errors=True)
    worker.start()
    status, again, err = erase(worker, gone, "--yes")
    assert status == 0, err
    assert sum(again["deleted"].values()) == 0 and again["discarded"] == []
    # the other chat is still there after the restore, and a new message of the erased one
    # is a new conversation
    await produce_inbound(
        worker.bootstrap, cat.inbound, [Inbound(id="g3", chat_id=gone, text="hello again")]
    )
    await wait_for(
        "the new conversation's reply",
        lambda: reply_text("g3", "hello again") in {s["text"] for s in worker.sends()},
        worker,
    )
    status, plan2, err = erase(worker, kept)
    assert status == 0 and plan2["deleted"]["inbox"] == 1, err
    assert worker.stop() == 0


@pytest.mark.kafka
def test_botmesh_erase_names_bad_input_and_a_missing_owner(worker: Worker) -> None:
    empty = botmesh(worker, "erase", "--chat-id", " ")
    assert empty.returncode == 2 and "--chat-id must not be empty" in empty.stderr
    lonely = botmesh(worker, "erase", "--chat-id", "x", "--yes", "--wait", "1")
    assert lonely.returncode == 4, lonely.stderr  # no worker runs: no owner answers
    assert "no answer from the owner of chat 'x'" in lonely.stderr


def _chat_of(key: str, raw: bytes) -> str | None:
    entry = decode_entry(key.encode(), raw)
    if entry is None:
        return None
    v = entry.value
    chat = (v.get("message") or {}).get("chat_id") or (v.get("payload") or {}).get("chat_id")
    if chat is None and ("/flow/" in key or "/turn/" in key):
        chat = key.rsplit("/", 1)[1]
    if chat is None and "/log/" in key:
        chat = key.split("/log/", 1)[1].split("/", 1)[0]
    return chat


def _dead_letter_count(worker: Worker, cat: Catalog) -> int:
    out = botmesh(worker, "dlq", "list", "--json", "--kind", "outbox")
    return len(json.loads(out.stdout)) if out.returncode == 0 else 0
