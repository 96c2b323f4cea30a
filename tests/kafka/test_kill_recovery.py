"""A worker recovering what it lost besides its process: its committed offsets (reset to
the earliest with Kafka's own tool) or its data dir (deleted while it was down).

Effects are counted at the recorder of the test process (``tests.kafka.recorder``), as in
``test_kills.py``:

- ``test_offsets_reset_to_the_earliest_send_nothing_again``: 1,000 inbounds answered, the
  worker stopped, the group's offsets on the inbound topic reset to the earliest with
  ``kafka-consumer-groups.sh --reset-offsets --to-earliest --execute``, the worker started
  again and left until its committed offsets reach the end of the inbound topic: every
  inbound is read again where it was journaled from, so its handler runs again (counted in
  the handler's file), its send is answered from the outbox (the provider gets 0 sends
  again) and its receipt is published again (every key is on the receipts topic twice);
  the journal stays settled.
- ``test_deleted_data_dir_is_rebuilt_and_sends_nothing_again``: the worker SIGKILLed after
  its inbounds were answered, its whole data dir (the journal's RocksDB databases in
  it) deleted, the worker started on an empty dir and the same inbounds produced again
  (same ids, new offsets) with new ones after them: 0 old ones sent again, every new one
  answered once. With the journal on Kafka this is the table rebuilt from its
  changelog; with a file journal in the data dir it cannot hold (the journal is gone).
"""

from __future__ import annotations

import asyncio
import re
import shutil
import time
from pathlib import Path

import pytest

from botmesh.streams.ops.tools import end_offsets, produce_inbound
from botmesh.topics import Catalog
from tests.kafka.bot import bot
from tests.kafka.broker import committed_offsets, kafka_tool
from tests.kafka.recorder import (
    SESSION_TIMEOUT,
    Recorder,
    Tally,
    check_effects,
    describe_group,
    traffic,
    wait_until,
)
from tests.kafka.worker import PARTITIONS, WAIT_S, Worker, journal_source, read_journal

pytestmark = [pytest.mark.kafka, pytest.mark.crash]


async def caught_up(bootstrap: str, cat: Catalog) -> bool:
    """The group's committed offsets on the inbound topic are at its end offsets."""
    ends = await end_offsets(bootstrap, cat.inbound)
    committed = committed_offsets(bootstrap, cat.group)
    return all(committed.get((cat.inbound, p), -1) >= end for p, end in ends.items())


async def wait_caught_up(bootstrap: str, cat: Catalog, worker: Worker) -> float:
    """Seconds until the worker's committed offsets reach the end of the inbound topic."""
    t0 = time.monotonic()
    while not await caught_up(bootstrap, cat):
        worker.check_alive()
        assert time.monotonic() - t0 < WAIT_S, "the worker did not commit to the end"
        await asyncio.sleep(0.2)
    return time.monotonic() - t0


def settled_journal(journal: dict[str, dict[str, object]], ids: set[str]) -> dict[str, int]:
    inbox = {v["id"]: v for k, v in journal.items() if k.startswith(f"{bot.scope}/in/")}
    missing = ids - set(inbox)
    assert missing == set(), f"{len(missing)} inbounds not in the journal"
    states: dict[str, int] = {}
    for i in ids:
        state = str(inbox[i]["state"])
        states[state] = states.get(state, 0) + 1
    assert set(states) <= {"done", "dead"}, states
    return states


# -- offsets reset to the earliest ------------------------------------------------------------

RESET_MESSAGES = 1000


async def test_offsets_reset_to_the_earliest_send_nothing_again(
    kafka_bootstrap: str,
    topic_prefix: str,
    tmp_path: Path,
    recorder: Recorder,
    tally: Tally,
) -> None:
    cat = Catalog(topic_prefix)
    worker = Worker(
        kafka_bootstrap, topic_prefix, tmp_path, recorder=recorder.url, env=SESSION_TIMEOUT
    )
    records = traffic("or", RESET_MESSAGES)
    ids = {r.id for r in records}
    await produce_inbound(kafka_bootstrap, cat.inbound, records)
    try:
        worker.start()
        await tally.until_accounted(recorder, ids, worker.check_alive, WAIT_S)
        await wait_caught_up(kafka_bootstrap, cat, worker)
        assert worker.stop() == 0
        calls, receipts = len(recorder), len(tally.receipts)

        # Kafka's tool, on an inactive group (a static member's session has to lapse first)
        empty_s = await wait_until(
            lambda: describe_group(kafka_bootstrap, cat.group, cat.inbound)[0] == "EMPTY",
            f"the group {cat.group} empty",
            poll=0.5,
            limit=WAIT_S,
        )
        reset = kafka_tool(
            "consumer-groups",
            "--bootstrap-server",
            kafka_bootstrap,
            "--group",
            cat.group,
            "--topic",
            cat.inbound,
            "--reset-offsets",
            "--to-earliest",
            "--execute",
        )
        assert reset.returncode == 0, reset.stdout + reset.stderr
        committed = committed_offsets(kafka_bootstrap, cat.group)
        rewound = {p: committed.get((cat.inbound, p)) for p in range(PARTITIONS)}
        assert rewound == dict.fromkeys(range(PARTITIONS), 0), (rewound, reset.stdout)

        first_runs = worker.handled()
        worker.start()
        again_s = await wait_caught_up(kafka_bootstrap, cat, worker)
        assert worker.stop() == 0
        keys = {f"{i}:1" for i in ids}  # the one send of each inbound
        await wait_until(
            lambda: {r.key for r in tally.receipts[receipts:]} >= keys,
            "every receipt published again",
            limit=WAIT_S,
        )
    finally:
        worker.close()

    sent_again = recorder.calls()[calls:]
    out = check_effects(recorder, tally, ids)
    assert sent_again == [], f"{len(sent_again)} replies sent again, e.g. {sent_again[:3]}"
    runs = worker.handled()
    assert set(first_runs) == ids and set(first_runs.values()) == {1}, first_runs
    rerun = {i for i in ids if runs[i] > first_runs[i]}
    assert rerun == ids, f"{len(ids - rerun)} handlers did not run again"
    states = settled_journal(await read_journal(worker), ids)
    print(
        f"  offsets reset to the earliest after {RESET_MESSAGES} inbounds ({out['provider calls']}"
        f" replies, {receipts} receipts): group empty {empty_s:.1f}s after the stop, the "
        f"restarted worker committed to the end in {again_s:.1f}s; {len(rerun)} handlers ran "
        f"again, {len(sent_again)} replies sent again, {len(tally.receipts) - receipts} "
        f"receipts published again; journal ({journal_source(worker)}) {states}"
    )


# -- the data dir deleted while the worker is down ------------------------------------------

OLD, NEW = 500, 100


async def test_deleted_data_dir_is_rebuilt_and_sends_nothing_again(
    kafka_bootstrap: str,
    topic_prefix: str,
    tmp_path: Path,
    recorder: Recorder,
    tally: Tally,
) -> None:
    cat = Catalog(topic_prefix)
    worker = Worker(kafka_bootstrap, topic_prefix, tmp_path, recorder=recorder.url)
    records = traffic("dd", OLD + NEW)
    old, new = records[:OLD], records[OLD:]
    old_ids, new_ids = {r.id for r in old}, {r.id for r in new}
    await produce_inbound(kafka_bootstrap, cat.inbound, old)
    try:
        worker.start()
        await tally.until_accounted(recorder, old_ids, worker.check_alive, WAIT_S)
        worker.kill()
        calls = len(recorder)
        rocksdb = sorted(
            str(p.parent.relative_to(worker.data_dir)) for p in worker.data_dir.rglob("CURRENT")
        )
        assert rocksdb, f"no RocksDB database in {sorted(worker.data_dir.rglob('*'))[:20]}"
        shutil.rmtree(worker.data_dir)

        worker.loglevel = "info"  # to see how its journal came back
        worker.start()
        started = time.monotonic()
        await produce_inbound(kafka_bootstrap, cat.inbound, [*old, *new])
        await tally.until_accounted(recorder, new_ids, worker.check_alive, WAIT_S)
        await wait_caught_up(kafka_bootstrap, cat, worker)
        first = recorder.first_from(worker.pid, calls)
        # the journal came back from the changelog through the worker's own reader
        restored = [
            line
            for line in worker.lines()
            if re.search(r"journal partition \d+ restored: [1-9]\d* changelog records", line)
        ]
        assert worker.stop() == 0
    finally:
        worker.close()
    assert restored, "the worker did not restore its journal from the changelog"

    again = [c for c in recorder.calls()[calls:] if c.inbound_id in old_ids]
    out = check_effects(recorder, tally, old_ids | new_ids, killed=worker.killed)
    assert again == [], f"{len(again)} old inbounds answered again, e.g. {again[:3]}"
    states = settled_journal(await read_journal(worker), old_ids | new_ids)
    first_s = f"{first.at - started:.1f}s" if first is not None else "none"
    print(
        f"  data dir (RocksDB {', '.join(rocksdb)} in it) deleted after {OLD} inbounds; restarted "
        f"on an empty dir, the same {OLD} again and {NEW} new: {len(again)} old ones sent "
        f"again, first reply {first_s} after the start; journal ({journal_source(worker)}) "
        f"{states}; {out['duplicates']} duplicates, {out['lost']} lost"
    )
