"""Manual probe: does faust-streaming work against this Kafka release? (not part of the test suite)

    deploy/kafka/kafka.sh start          # or any broker
    .venv/bin/python deploy/kafka/probe/faust_probe.py --bootstrap 127.0.0.1:9092 \
        --guarantee exactly_once         # and at_least_once

A tiny Faust app (RocksDB table via rocksdict, web server off) counts records per key from a
topic. The driver produces a first batch, runs the worker until the table holds the counts, stops
it (SIGTERM), produces a second batch, restarts the worker on the same RocksDB data dir and checks
that the counts continue (table recovered, no record counted twice for exactly_once, none lost).
Exit status 0 when the counts are right. Writes the worker logs to the work dir it prints.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

KEYS = ["a", "b", "c"]


def worker_main() -> None:
    """Run the Faust worker (child process); configuration comes from the environment."""
    import faust  # noqa: PLC0415 - only the worker child needs faust

    work = Path(os.environ["PROBE_WORK"])
    app = faust.App(
        os.environ["PROBE_APP"],
        broker=f"kafka://{os.environ['PROBE_BOOTSTRAP']}",
        store="rocksdb://",
        datadir=str(work / "data"),
        processing_guarantee=os.environ["PROBE_GUARANTEE"],
        web_enabled=False,
        web_host="127.0.0.1",
        topic_partitions=1,
        topic_replication_factor=1,
        broker_commit_every=10,
    )
    topic = app.topic(
        os.environ["PROBE_TOPIC"], key_serializer="raw", value_serializer="raw", partitions=1
    )
    counts = app.Table("counts", default=int, partitions=1)

    @app.agent(topic)
    async def count(stream):  # type: ignore[no-untyped-def]
        async for key, _value in stream.items():
            counts[key.decode()] += 1
            snapshot = {k: counts[k] for k in KEYS}
            tmp = work / "counts.json.tmp"
            tmp.write_text(json.dumps(snapshot))
            tmp.replace(work / "counts.json")

    sys.argv = [sys.argv[0], "worker", "-l", "info"]
    app.main()


async def produce(bootstrap: str, topic: str, n: int, start: int) -> None:
    from aiokafka import AIOKafkaProducer  # noqa: PLC0415

    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()
    try:
        for i in range(start, start + n):
            await producer.send_and_wait(topic, f"v{i}".encode(), key=KEYS[i % 3].encode())
    finally:
        await producer.stop()


def expected(total: int) -> dict[str, int]:
    return {k: sum(1 for i in range(total) if KEYS[i % 3] == k) for k in KEYS}


def run_worker(env: dict[str, str], work: Path, want: dict[str, int], run: int) -> dict[str, int]:
    log = open(work / f"worker{run}.log", "w")  # noqa: SIM115
    proc = subprocess.Popen(
        [sys.executable, __file__, "--worker"], env=env, stdout=log, stderr=subprocess.STDOUT
    )
    t0 = time.monotonic()
    got: dict[str, int] = {}
    try:
        while time.monotonic() - t0 < 120:
            if proc.poll() is not None:
                raise SystemExit(f"worker {run} exited with {proc.returncode}; see {log.name}")
            f = work / "counts.json"
            if f.exists():
                got = json.loads(f.read_text())
                if got == want:
                    break
            time.sleep(0.5)
        # let it commit, then stop it like a deploy would
        time.sleep(3)
        got = (
            json.loads((work / "counts.json").read_text())
            if (work / "counts.json").exists()
            else {}
        )
        print(f"run {run}: counts {got} (want {want}) after {time.monotonic() - t0:.1f} s")
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
    return got


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--worker", action="store_true")
    parser.add_argument("--bootstrap", default="127.0.0.1:9092")
    parser.add_argument(
        "--guarantee", default="exactly_once", choices=["exactly_once", "at_least_once"]
    )
    parser.add_argument("-n", type=int, default=30)
    args = parser.parse_args()
    if args.worker:
        worker_main()
        return 0
    work = Path(tempfile.mkdtemp(prefix="faust-probe-"))
    tag = uuid.uuid4().hex[:8]
    env = dict(os.environ)
    env.update(
        PROBE_WORK=str(work),
        PROBE_APP=f"probe{tag}",
        PROBE_BOOTSTRAP=args.bootstrap,
        PROBE_GUARANTEE=args.guarantee,
        PROBE_TOPIC=f"probe{tag}.in",
    )
    print(f"work dir {work}, guarantee {args.guarantee}, broker {args.bootstrap}")
    asyncio.run(produce(args.bootstrap, env["PROBE_TOPIC"], args.n, 0))
    first = run_worker(env, work, expected(args.n), 1)
    asyncio.run(produce(args.bootstrap, env["PROBE_TOPIC"], args.n, args.n))
    second = run_worker(env, work, expected(2 * args.n), 2)
    ok = first == expected(args.n) and second == expected(2 * args.n)
    print("OK" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
