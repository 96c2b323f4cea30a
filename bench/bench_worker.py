"""The durable worker path vs a bare aiokafka consume→produce loop, same broker, same records.

    .venv/bin/python bench/bench_worker.py [-n 10000] [--batch-size 500]

Both run as a subprocess consuming one 4-partition input topic (records of ~200 B keyed by
chat id, 50 chats) and producing one record per input (acks=all): the bare loop copies each
record to an output topic (getmany → send → commit); the worker is ``botmesh worker --app
examples.echo_bot:bot`` on its default journal, a file journal with an append log and fsync
in its data dir (decode, inbound journaled, handler, send journaled before the console
provider is called and recorded after, receipt journaled, produced and marked published,
inbound marked done). Each side is warmed up (one record through it) before the clock
starts; the clock runs from the first produced record to the last output record seen.
Prints the rates and the ratio worker / bare. Broker: ``KAFKA_BOOTSTRAP_SERVERS``, else the
local Kafka (started and stopped here if it is not running).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition  # noqa: E402

from examples.demo import stop_process as stop  # noqa: E402
from examples.demo import worker_command  # noqa: E402
from state.messages import Inbound  # noqa: E402
from streams.config import default_journal  # noqa: E402
from streams.provision import ensure_topics  # noqa: E402
from streams.tools import end_offsets  # noqa: E402
from topics import Catalog, chat_key, encode_inbound  # noqa: E402

KAFKA_SH = REPO / "deploy" / "kafka" / "kafka.sh"
PARTITIONS = 4


def records(n: int, run: str, chats: int = 50) -> list[tuple[bytes, bytes]]:
    out = []
    for i in range(n):
        chat = f"{run}-chat-{i % chats}"
        rec = Inbound(chat_id=chat, id=f"{run}-{i}", text="x", sender="bench", channel="b")
        raw = encode_inbound(rec)
        pad = max(0, 200 - len(raw))
        rec = Inbound(
            chat_id=chat, id=f"{run}-{i}", text="x" * (1 + pad), sender="bench", channel="b"
        )
        out.append((chat_key(chat), encode_inbound(rec)))
    return out


async def bare_loop(bootstrap: str, src: str, dst: str, group: str) -> None:
    consumer = AIOKafkaConsumer(
        src,
        bootstrap_servers=bootstrap,
        group_id=group,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
    )
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5)
    await consumer.start()
    await producer.start()
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    try:
        while not stop.is_set():
            batch = await consumer.getmany(timeout_ms=100, max_records=1000)
            futs = [
                await producer.send(dst, m.value, key=m.key)
                for msgs in batch.values()
                for m in msgs
            ]
            if futs:
                await asyncio.gather(*futs)
                await consumer.commit()
    finally:
        await producer.stop()
        await consumer.stop()


async def produce(bootstrap: str, topic: str, recs: list[tuple[bytes, bytes]]) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5)
    await producer.start()
    try:
        futs = [await producer.send(topic, v, key=k) for k, v in recs]
        await asyncio.gather(*futs)
    finally:
        await producer.stop()


async def count_until(
    bootstrap: str, topic: str, start: dict[int, int], n: int, proc: subprocess.Popen[bytes]
) -> float:
    """Consume ``topic`` from ``start`` until ``n`` records; the monotonic time of the last."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await consumer.start()
    try:
        tps = [TopicPartition(topic, p) for p in sorted(start)]
        consumer.assign(tps)
        for tp in tps:
            consumer.seek(tp, start[tp.partition])
        got, last, deadline = 0, time.monotonic(), time.monotonic() + 300
        while got < n:
            if proc.poll() is not None:
                raise SystemExit(f"the process under test exited with {proc.returncode}")
            if time.monotonic() > deadline:
                raise SystemExit(f"only {got}/{n} output records after 300 s")
            batch = await consumer.getmany(timeout_ms=200, max_records=5000)
            k = sum(len(v) for v in batch.values())
            if k:
                got += k
                last = time.monotonic()
        return last
    finally:
        await consumer.stop()


async def measure(
    bootstrap: str, src: str, dst: str, proc: subprocess.Popen[bytes], *, n: int, run: str
) -> float:
    start = await end_offsets(bootstrap, dst)
    await produce(bootstrap, src, records(1, f"{run}w"))
    await count_until(bootstrap, dst, start, 1, proc)  # warm: joined and flowing
    start = await end_offsets(bootstrap, dst)
    recs = records(n, run)
    t0 = time.monotonic()
    producing = asyncio.ensure_future(produce(bootstrap, src, recs))
    t_last = await count_until(bootstrap, dst, start, n, proc)
    await producing
    return n / (t_last - t0)


def broker() -> tuple[str, bool]:
    env = os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "").strip()
    if env:
        return env, False
    if subprocess.run([str(KAFKA_SH), "status"], capture_output=True, check=False).returncode == 0:
        return "127.0.0.1:9092", False
    subprocess.run([str(KAFKA_SH), "start"], check=True)
    return "127.0.0.1:9092", True


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("-n", type=int, default=10_000)
    parser.add_argument("--batch-size", type=int, default=500)
    parser.add_argument("--bare", nargs=4, metavar=("BOOTSTRAP", "SRC", "DST", "GROUP"))
    args = parser.parse_args()
    if args.bare:
        asyncio.run(bare_loop(*args.bare))
        return 0
    bootstrap, started = broker()
    tmp = Path(tempfile.mkdtemp(prefix="bench-worker-"))
    tag = uuid.uuid4().hex[:6]
    try:
        bare_cat, faust_cat = Catalog(f"benchbare{tag}"), Catalog(f"benchfaust{tag}")
        for cat in (bare_cat, faust_cat):
            ensure_topics(bootstrap, cat.specs(partitions=PARTITIONS))
        with open(tmp / "bare.log", "wb") as log:
            bare = subprocess.Popen(
                [
                    sys.executable,
                    __file__,
                    "--bare",
                    bootstrap,
                    bare_cat.inbound,
                    bare_cat.sent,
                    bare_cat.group,
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        try:
            bare_rate = asyncio.run(
                measure(bootstrap, bare_cat.inbound, bare_cat.sent, bare, n=args.n, run="bare")
            )
        finally:
            stop(bare)
        with open(tmp / "worker.log", "wb") as log:
            worker = subprocess.Popen(
                worker_command(
                    "--bootstrap",
                    bootstrap,
                    "--prefix",
                    faust_cat.prefix,
                    "--data-dir",
                    str(tmp / "data"),
                    "--batch-size",
                    str(args.batch_size),
                    "--loglevel",
                    "warning",
                ),
                cwd=REPO,
                env={
                    **{k: v for k, v in os.environ.items() if k != "BOTMESH_JOURNAL"},
                    "BOTMESH_CONSOLE_QUIET": "1",
                },
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        try:
            faust_rate = asyncio.run(
                measure(bootstrap, faust_cat.inbound, faust_cat.sent, worker, n=args.n, run="faust")
            )
        finally:
            stop(worker)
        print(f"records: {args.n} x ~200 B, {PARTITIONS} partitions, broker {bootstrap}")
        print(f"bare aiokafka consume->produce loop: {bare_rate:8.0f} records/s")
        print(
            f"durable worker (batch {args.batch_size}, journal {default_journal(tmp / 'data')}): "
            f"{faust_rate:8.0f} records/s"
        )
        print(f"ratio worker / bare: {faust_rate / bare_rate:.2f}")
    finally:
        if started:
            subprocess.run([str(KAFKA_SH), "stop"], check=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
