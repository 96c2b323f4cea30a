"""``botmesh replay``, ``status`` and ``metrics`` against a real broker and real ``botmesh
worker`` processes (``tests/kafka/worker.py``): their output (``--json`` and the tables),
their exit statuses (``botmesh._cli.exit``) and what they change on the broker.

Every wait below ends as soon as its condition holds; the time limits are hang guards."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from botmesh.state.counters import Metric
from botmesh.state.kv import Entry
from botmesh.streams.clients import AsyncProducer
from botmesh.streams.membership import WORKER_COUNTERS
from botmesh.streams.ops.operator import (
    decode_metrics,
    is_ambiguous_send,
    metrics_record,
    parse_time,
    status,
)
from botmesh.streams.ops.tools import demo_records, end_offsets, produce_inbound
from botmesh.streams.provision import ensure_topics
from botmesh.streams.table_kv import encode_entry
from botmesh.topics import Catalog
from tests.kafka.broker import committed_offsets
from tests.kafka.worker import PARTITIONS, WAIT_S, Worker

REPO = Path(__file__).resolve().parents[2]


def botmesh(*args: str, bootstrap: str, prefix: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "botmesh", *args, "--bootstrap", bootstrap, "--prefix", prefix],
        cwd=REPO,
        env=dict(os.environ, COLUMNS="200"),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def as_json(out: subprocess.CompletedProcess[str]) -> Any:
    assert "Traceback" not in out.stderr, out.stderr
    return json.loads(out.stdout)


def wait_for(what: str, cond: Callable[[], bool], *workers: Worker) -> None:
    deadline = time.monotonic() + WAIT_S  # hang guard only
    while not cond():
        for w in workers:
            w.check_alive()
        if time.monotonic() > deadline:
            pytest.fail(f"waited {WAIT_S:.0f} s for {what}")
        time.sleep(0.2)


@pytest.fixture
def topics(kafka_bootstrap: str, topic_prefix: str) -> Catalog:
    cat = Catalog(topic_prefix)
    ensure_topics(kafka_bootstrap, cat.specs(partitions=PARTITIONS))
    return cat


@pytest.fixture
def workers(kafka_bootstrap: str, topic_prefix: str, tmp_path: Path) -> Iterator[list[Worker]]:
    made: list[Worker] = []
    yield made
    for w in made:
        w.close()


def new_worker(
    made: list[Worker], bootstrap: str, prefix: str, tmp: Path, instance: str, **env: str
) -> Worker:
    folder = tmp / f"worker-{instance}"
    folder.mkdir()
    w = Worker(bootstrap, prefix, folder, instance=instance, env=env)
    made.append(w)
    return w


def inbound_committed(bootstrap: str, cat: Catalog) -> dict[int, int]:
    return {
        p: o for (t, p), o in committed_offsets(bootstrap, cat.group).items() if t == cat.inbound
    }


# -- no broker needed --------------------------------------------------------------------------


def test_an_unreachable_broker_exits_3_naming_it() -> None:
    out = botmesh("status", "--timeout", "1", bootstrap="127.0.0.1:1", prefix="nobody")
    assert out.returncode == 3, out.stderr
    assert "cannot reach Kafka at '127.0.0.1:1'" in out.stderr
    assert "Traceback" not in out.stderr


@pytest.mark.parametrize(
    "args",
    [
        ["replay"],  # one of --from-offset, --from-time, --to-earliest
        ["replay", "--to-earliest", "--from-offset", "3"],
        ["replay", "--from-time", "last tuesday"],
        ["replay", "--to-earliest", "--topic", "sent"],
        ["status", "--timeout", "0"],
    ],
)
def test_usage_errors_exit_2(args: list[str]) -> None:
    out = botmesh(*args, bootstrap="127.0.0.1:1", prefix="nobody")
    assert out.returncode == 2, out.stderr
    assert "Traceback" not in out.stderr


def test_time_formats_and_the_metrics_record() -> None:
    assert parse_time("1796299200") == 1796299200000
    assert parse_time("1796299200.5") == 1796299200500
    assert parse_time("2026-12-03T12:00:00Z") == parse_time("2026-12-03T12:00:00")
    assert parse_time("2026-12-03T13:00:00+01:00") == parse_time("2026-12-03T12:00:00Z")
    key, value = metrics_record("w-1", {"inboundJournaled": 3}, 12.5)
    got = decode_metrics(key, value)
    assert got is not None and (got.instance, got.ts, got.counters) == (
        "w-1",
        12.5,
        {"inboundJournaled": 3},
    )
    assert got.ready is None  # a record without readiness (an earlier worker's)
    key, value = metrics_record(
        "w-1", {}, 13.0, ready=False, why="restoring 2 journal partitions", restoring=2
    )
    got = decode_metrics(key, value)
    assert got is not None and (got.ready, got.why, got.restoring) == (
        False,
        "restoring 2 journal partitions",
        2,
    )
    assert decode_metrics(b"w-1", None) is None
    assert decode_metrics(b"w-1", b"{not json") is None
    scope = "t:e:kafka-test:c"
    assert is_ambiguous_send(f"{scope}/out/m1:1", {"state": "unknown", "ambiguous": True})
    assert not is_ambiguous_send(f"{scope}/out/m1:1", {"state": "unknown"})
    assert not is_ambiguous_send(f"{scope}/out/m1:1", {"state": "sent", "ambiguous": True})
    assert not is_ambiguous_send(f"{scope}/in/m1", {"state": "unknown", "ambiguous": True})


# -- status ------------------------------------------------------------------------------------


@pytest.mark.kafka
async def test_status_shows_the_lag_without_a_worker_then_the_member_and_no_lag(
    kafka_bootstrap: str, topics: Catalog, tmp_path: Path, workers: list[Worker]
) -> None:
    cat, b = topics, kafka_bootstrap
    records = demo_records(40, 8, run="st")
    await produce_inbound(b, cat.inbound, records)
    producer = AsyncProducer(b)
    try:
        await producer.send_and_wait(cat.inbound, b"{not json", key=b"bad")
    finally:
        await producer.close()
    ends = await end_offsets(b, cat.inbound)
    assert sum(ends.values()) == 41

    before = botmesh("status", "--json", bootstrap=b, prefix=cat.prefix)
    assert before.returncode == 0, before.stderr
    s = as_json(before)
    assert s["group"] == cat.group and s["members"] == []
    assert s["total_lag"] == 41
    inbound = {x["partition"]: x for x in s["lag"] if x["topic"] == cat.inbound}
    assert {p: x["lag"] for p, x in inbound.items()} == ends
    assert all(x["committed"] is None for x in inbound.values())
    assert {x["topic"] for x in s["lag"]} == {cat.inbound, cat.requests}
    assert {d["topic"]: d["records"] for d in s["dead_letters"]} == {
        cat.inbound_dlq: 0,
        cat.requests_dlq: 0,
        cat.outbox_dlq: 0,
    }
    table = botmesh("status", bootstrap=b, prefix=cat.prefix)
    assert table.returncode == 0, table.stderr
    assert "lag (total 41)" in table.stdout and "0 member(s)" in table.stdout

    w = new_worker(workers, b, cat.prefix, tmp_path, "0")
    w.start()
    wait_for("every message handled", lambda: set(w.handled()) >= {r.id for r in records}, w)

    def drained() -> bool:
        now = as_json(botmesh("status", "--json", bootstrap=b, prefix=cat.prefix))
        owners = [m for m in now["members"] if m["instance_id"] == w.instance_id]
        return now["total_lag"] == 0 and len(owners) == 1 and now["dead_letters"][0]["records"] == 1

    wait_for("no lag, the worker a member and the bad record dead-lettered", drained, w)
    done = botmesh("status", "--json", bootstrap=b, prefix=cat.prefix)
    assert done.returncode == 0, done.stderr
    s = as_json(done)
    assert s["state"] == "stable"
    (member,) = s["members"]
    assert member["instance_id"] == w.instance_id and member["host"] and member["client_id"]
    assert member["partitions"][cat.inbound] == list(range(PARTITIONS))
    # the group assigns the inbound alone: the worker takes the same partitions of the
    # requests and control topics itself (co-partitioned), which the group does not list
    assert set(member["partitions"]) == {cat.inbound}
    assert {x["owner"] for x in s["lag"]} == {w.instance_id}
    committed = {x["partition"]: x["committed"] for x in s["lag"] if x["topic"] == cat.inbound}
    assert {p: c for p, c in committed.items() if ends[p]} == {p: e for p, e in ends.items() if e}
    assert all(x["lag"] == 0 for x in s["lag"])
    journal = s["journal"]
    assert journal["topic"] == cat.changelog("journal")
    # an inbox record per message (the bad one never reached the journal) and an outbox
    # record per reply, at least; a message's record holds its reply's (one record a turn),
    # so at least a record per message was read
    assert journal["keys"] >= 80 and journal["records"] >= 40
    assert journal["bytes"] > 0 and journal["offsets"] >= journal["records"]
    assert journal["ambiguous"] == 0
    table = botmesh("status", bootstrap=b, prefix=cat.prefix)
    assert table.returncode == 0, table.stderr
    assert w.instance_id in table.stdout and "lag (total 0)" in table.stdout
    assert "ambiguous sends (outbox state unknown, ambiguous): 0" in table.stdout
    assert w.stop() == 0


@pytest.mark.kafka
async def test_status_counts_ambiguous_sends_by_the_last_value_of_each_key(
    kafka_bootstrap: str, topics: Catalog
) -> None:
    """Journal records written to the changelog as the worker writes them (no worker here):
    only a key whose *last* value is an outbox record ``unknown`` and ``ambiguous`` counts."""
    cat, b = topics, kafka_bootstrap
    scope = "t:e:kafka-test:c"
    lost = {"key": "k", "state": "unknown", "ambiguous": True}
    history: list[tuple[str, dict[str, Any] | None]] = [
        (f"{scope}/out/a:1", {"key": "a:1", "state": "pending", "inflight": True}),
        (f"{scope}/out/a:1", lost),  # counts
        (f"{scope}/out/b:1", lost),
        (f"{scope}/out/b:1", {"key": "b:1", "state": "sent"}),  # settled after all
        (f"{scope}/out/c:1", lost),
        (f"{scope}/out/c:1", None),  # purged
        (f"{scope}/in/d", {"id": "d", "state": "unknown", "ambiguous": True}),  # not a send
        (f"{scope}/out/e:1", {"key": "e:1", "state": "unknown"}),  # not ambiguous
        (f"{scope}/out/f:1", lost),  # counts
    ]
    producer = AsyncProducer(b)
    try:
        for n, (key, value) in enumerate(history):
            record = None if value is None else encode_entry(Entry(key, value, n + 1))
            await producer.send_and_wait(
                cat.changelog("journal"), record, key=key.encode(), partition=n % 2
            )
    finally:
        await producer.close()
    out = botmesh("status", "--json", bootstrap=b, prefix=cat.prefix)
    assert out.returncode == 0, out.stderr
    journal = as_json(out)["journal"]
    assert journal["ambiguous"] == 2
    assert journal["records"] == journal["offsets"] == len(history)
    assert journal["keys"] == 5  # a, b, d, e, f
    no_journal = as_json(
        botmesh("status", "--json", "--no-journal", bootstrap=b, prefix=cat.prefix)
    )
    assert no_journal["journal"] is None


@pytest.mark.kafka
def test_status_right_after_the_topics_are_created(kafka_bootstrap: str, topic_prefix: str) -> None:
    """A topic created a moment ago answers "not leader" to an offsets request until its
    broker has taken the lead (here, every time within a few milliseconds of creating it);
    ``status`` asks again instead of failing with that error."""
    cat = Catalog(topic_prefix)
    ensure_topics(kafka_bootstrap, cat.specs(partitions=PARTITIONS))
    s = status(kafka_bootstrap, cat, journal=False)
    assert s.group.members == [] and s.total_lag == 0
    assert {(x.topic, x.partition) for x in s.lags} == {
        (t, p) for t in (cat.inbound, cat.requests) for p in range(PARTITIONS)
    }


@pytest.mark.kafka
async def test_the_tools_see_a_topic_created_a_moment_ago(
    kafka_bootstrap: str, topic_prefix: str
) -> None:
    """Right after a topic is created a broker's metadata can leave it out (here about 4 in
    10 times); ``end_offsets`` and ``tail_receipts`` ask again instead of taking it as
    absent (``tail_receipts`` raised "does not exist", ``end_offsets`` returned nothing)."""
    for i in range(10):
        cat = Catalog(f"{topic_prefix}.{i}")
        ensure_topics(
            kafka_bootstrap, [s for s in cat.specs(partitions=PARTITIONS) if s.name == cat.sent]
        )
        assert await end_offsets(kafka_bootstrap, cat.sent) == dict.fromkeys(range(PARTITIONS), 0)


@pytest.mark.kafka
def test_status_and_metrics_refuse_a_prefix_without_topics(
    kafka_bootstrap: str, topic_prefix: str
) -> None:
    for command in ("status", "metrics"):
        out = botmesh(command, bootstrap=kafka_bootstrap, prefix=topic_prefix)
        assert out.returncode == 3, out.stderr
        assert "does not exist" in out.stderr and "botmesh topics create" in out.stderr


# -- replay ------------------------------------------------------------------------------------


@pytest.mark.kafka
async def test_replay_is_refused_while_the_group_has_members_and_replays_without_resending(
    kafka_bootstrap: str, topics: Catalog, tmp_path: Path, workers: list[Worker]
) -> None:
    cat, b = topics, kafka_bootstrap
    # a static member stays listed this long after its worker stopped (so the refusal
    # after the stop below holds however slow this machine is)
    w = new_worker(workers, b, cat.prefix, tmp_path, "0", BOTMESH_SESSION_TIMEOUT="60")
    w.start()
    records = demo_records(20, 5, run="rp")
    await produce_inbound(b, cat.inbound, records)
    ids = {r.id for r in records}
    wait_for("every message handled", lambda: set(w.handled()) >= ids, w)

    alive = botmesh("replay", "--to-earliest", bootstrap=b, prefix=cat.prefix)
    assert alive.returncode == 1, alive.stdout + alive.stderr
    assert "refused" in alive.stderr and w.instance_id in alive.stderr
    assert "--force" in alive.stderr and "Stop the workers first" in alive.stderr

    assert w.stop() == 0  # a clean stop commits every offset
    ends = await end_offsets(b, cat.inbound)
    committed = inbound_committed(b, cat)
    assert committed == {p: e for p, e in ends.items() if e}  # nothing for an empty one

    # the stopped worker is a static member: still listed until its session expires
    listed = botmesh(
        "replay", "--to-earliest", "--dry-run", "--json", bootstrap=b, prefix=cat.prefix
    )
    assert listed.returncode == 1, listed.stderr
    plan = as_json(listed)
    assert plan["refused"] and w.instance_id in plan["refused"]
    assert [m["instance_id"] for m in plan["members"]] == [w.instance_id]
    assert {m["partition"]: (m["current"], m["new"]) for m in plan["moves"]} == {
        p: (e or None, 0) for p, e in ends.items()
    }
    dry = botmesh(
        "replay", "--to-earliest", "--dry-run", "--force", "--json", bootstrap=b, prefix=cat.prefix
    )
    assert dry.returncode == 0, dry.stderr
    assert as_json(dry)["applied"] is False and as_json(dry)["removed"] == []
    table = botmesh(
        "replay", "--to-earliest", "--dry-run", "--force", bootstrap=b, prefix=cat.prefix
    )
    assert table.returncode == 0, table.stderr
    assert "dry run: nothing changed" in table.stdout and cat.inbound in table.stdout
    assert inbound_committed(b, cat) == committed  # the dry runs changed nothing
    still = as_json(botmesh("status", "--json", "--no-journal", bootstrap=b, prefix=cat.prefix))
    assert [m["instance_id"] for m in still["members"]] == [w.instance_id]

    forced = botmesh("replay", "--to-earliest", "--force", "--json", bootstrap=b, prefix=cat.prefix)
    assert forced.returncode == 0, forced.stderr
    result = as_json(forced)
    assert result["applied"] is True and result["removed"] == [w.instance_id]
    assert sum(m["records"] for m in result["moves"]) == 20
    assert inbound_committed(b, cat) == dict.fromkeys(ends, 0)
    after = as_json(botmesh("status", "--json", "--no-journal", bootstrap=b, prefix=cat.prefix))
    assert after["members"] == [] and after["total_lag"] == 20

    w.start()  # reads every record again: the handlers run again, the journal sends nothing
    wait_for("every message handled twice", lambda: set(w.handled().values()) == {2}, w)
    assert w.stop() == 0
    assert inbound_committed(b, cat) == ends
    assert sorted(w.handled()) == sorted(ids)
    sends = w.sends()
    assert len(sends) == 20, "a reply was sent twice"
    assert len({json.dumps(s, sort_keys=True) for s in sends}) == 20


@pytest.mark.kafka
async def test_replay_from_a_time_picks_the_first_offset_at_or_after_it(
    kafka_bootstrap: str, topics: Catalog
) -> None:
    cat, b = topics, kafka_bootstrap
    await produce_inbound(b, cat.inbound, demo_records(24, 8, run="early"))
    ends_early = await end_offsets(b, cat.inbound)
    await asyncio.sleep(0.01)  # the records' timestamps (ms) stay before the time below
    at = time.time()
    await asyncio.sleep(0.01)
    await produce_inbound(b, cat.inbound, demo_records(24, 8, run="late"))
    ends_late = await end_offsets(b, cat.inbound)
    assert all(ends_late[p] > ends_early[p] for p in ends_early), "a partition got no record"

    def moves(*args: str) -> dict[int, tuple[int | None, int]]:
        out = botmesh("replay", *args, "--dry-run", "--json", bootstrap=b, prefix=cat.prefix)
        assert out.returncode == 0, out.stderr
        return {m["partition"]: (m["current"], m["new"]) for m in as_json(out)["moves"]}

    want = {p: (None, e) for p, e in ends_early.items()}
    assert moves("--from-time", repr(at)) == want
    iso = datetime.fromtimestamp(at, UTC).isoformat()
    assert moves("--from-time", iso) == want
    assert moves("--from-time", str(at + 3600)) == {p: (None, e) for p, e in ends_late.items()}
    assert moves("--from-time", "0") == dict.fromkeys(ends_early, (None, 0))
    assert moves("--from-time", repr(at), "--partition", "1") == {1: (None, ends_early[1])}
    assert committed_offsets(b, cat.group) == {}  # dry runs

    applied = botmesh("replay", "--from-time", repr(at), bootstrap=b, prefix=cat.prefix)
    assert applied.returncode == 0, applied.stderr
    assert f"set {PARTITIONS} partition(s) of {cat.group}" in applied.stdout
    assert inbound_committed(b, cat) == ends_early
    offset = botmesh(
        "replay",
        "--from-offset",
        "2",
        "--topic",
        "inbound",
        "--topic",
        "requests",
        "--json",
        bootstrap=b,
        prefix=cat.prefix,
    )
    assert offset.returncode == 0, offset.stderr
    both = {(m["topic"], m["partition"]): m["new"] for m in as_json(offset)["moves"]}
    assert both == {
        **{(cat.inbound, p): min(2, e) for p, e in ends_late.items()},
        **{(cat.requests, p): 0 for p in range(PARTITIONS)},  # empty: clamped to the end
    }
    assert inbound_committed(b, cat) == {p: min(2, e) for p, e in ends_late.items()}


# -- metrics -----------------------------------------------------------------------------------


@pytest.mark.kafka
async def test_metrics_shows_each_workers_counters_and_their_sum(
    kafka_bootstrap: str, topics: Catalog, tmp_path: Path, workers: list[Worker]
) -> None:
    cat, b = topics, kafka_bootstrap
    pair = [
        new_worker(workers, b, cat.prefix, tmp_path, i, BOTMESH_METRICS_INTERVAL="1")
        for i in ("0", "1")
    ]
    for w in pair:
        w.start()

    def both_own_partitions() -> bool:
        s = as_json(botmesh("status", "--json", "--no-journal", bootstrap=b, prefix=cat.prefix))
        owned = {m["instance_id"]: m["partitions"].get(cat.inbound, []) for m in s["members"]}
        return (
            s["state"] == "stable"
            and set(owned) == {w.instance_id for w in pair}
            and all(owned.values())
        )

    wait_for("both workers in the group with partitions", both_own_partitions, *pair)
    records = demo_records(40, 20, run="mx")
    await produce_inbound(b, cat.inbound, records)
    ids = {r.id for r in records}
    wait_for(
        "every message handled",
        lambda: set(pair[0].handled()) | set(pair[1].handled()) >= ids,
        *pair,
    )

    def published() -> dict[str, Any]:
        out = botmesh("metrics", "--json", bootstrap=b, prefix=cat.prefix)
        assert out.returncode == 0, out.stderr
        return as_json(out)  # type: ignore[no-any-return]

    def all_counted() -> bool:
        m = published()
        return len(m["workers"]) == 2 and m["sum"].get("inboundJournaled") == 40

    wait_for("the periodic counters of both workers", all_counted, *pair)
    m = published()
    assert m["topic"] == cat.metrics
    assert [x["instance"] for x in m["workers"]] == sorted(w.instance_id for w in pair)
    for x in m["workers"]:
        assert sorted(x["counters"]) == sorted([*(m.value for m in Metric), *WORKER_COUNTERS])
        assert x["counters"]["inboundJournaled"] > 0 and x["counters"]["outboxJournaled"] > 0
    assert m["sum"] == {
        name: sum(x["counters"][name] for x in m["workers"]) for name in m["workers"][0]["counters"]
    }
    assert m["sum"]["outboxJournaled"] == 40
    table = botmesh("metrics", bootstrap=b, prefix=cat.prefix)
    assert table.returncode == 0, table.stderr
    assert all(w.instance_id in table.stdout for w in pair) and "sum" in table.stdout
    row = next(line for line in table.stdout.splitlines() if "inboundJournaled" in line)
    assert re.findall(r"\d+", row)[-1] == "40"  # the last column: the sum

    for w in pair:
        assert w.stop() == 0
    final = published()  # published once more at the clean stop
    assert final["sum"]["inboundJournaled"] == 40
    assert all(x["ts"] >= y["ts"] for x, y in zip(final["workers"], m["workers"], strict=True))
