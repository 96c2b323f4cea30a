"""What ``bench_worker.py`` runs in its child processes, besides ``botmesh worker`` itself.

    python bench/_worker_baselines.py aiokafka BOOTSTRAP SRC DST GROUP
    python bench/_worker_baselines.py faust BOOTSTRAP SRC DST APP_ID DATA_DIR
    python bench/_worker_baselines.py unjournaled WORKER_ARGS...
    python bench/_worker_baselines.py profile OUT.prof WORKER_ARGS...

- ``aiokafka``: the bare consume->produce loop (``getmany`` -> ``send`` each record to DST,
  acks=all -> wait for the acks -> commit), no decoding, no journal;
- ``faust``: the bare per-event Faust agent: the worker's app settings (at_least_once,
  acks=all), ``async for event in stream.events()`` producing one record per event to DST;
- ``profile``: ``botmesh worker WORKER_ARGS...`` in this process under ``cProfile``; the
  stats go to OUT.prof when the worker stops (SIGTERM);
- ``unjournaled``: ``botmesh worker WORKER_ARGS... --journal memory://``, which the worker
  refuses (a restart would forget everything): the worker's whole path around a journal
  that costs next to nothing, to tell the journal's share of a record's cost from the rest.

``slow_provider`` is a zero-argument provider factory for ``botmesh worker --provider
bench._worker_baselines:slow_provider``: the mock provider with ``BENCH_PROVIDER_DELAY``
seconds (default 0.05) per send.
"""

from __future__ import annotations

import asyncio
import cProfile
import os
import signal
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from botmesh.providers.mock import MockProvider  # noqa: E402

__all__ = [
    "aiokafka_loop",
    "faust_per_event",
    "profile_worker",
    "slow_provider",
    "unjournaled_worker",
]


def slow_provider() -> MockProvider:
    """The mock provider, ``BENCH_PROVIDER_DELAY`` seconds per send (default 0.05)."""
    return MockProvider("slow", delay=float(os.environ.get("BENCH_PROVIDER_DELAY", "0.05")))


async def aiokafka_loop(bootstrap: str, src: str, dst: str, group: str) -> None:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

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


def faust_per_event(bootstrap: str, src: str, dst: str, app_id: str, data_dir: str) -> None:
    import faust

    app = faust.App(
        app_id,
        broker=f"kafka://{bootstrap}",
        store="memory://",
        datadir=data_dir,
        processing_guarantee="at_least_once",
        producer_acks=-1,
        consumer_auto_offset_reset="earliest",
        topic_allow_declare=False,
        web_enabled=False,
        worker_redirect_stdouts=False,
    )

    def raw(name: str) -> Any:
        return app.topic(
            name, key_type=bytes, value_type=bytes, key_serializer="raw", value_serializer="raw"
        )

    out = raw(dst)

    async def copy(stream: Any) -> None:
        async for event in stream.events():
            await out.send(key=event.key, value=event.value)

    app.agent(raw(src), name=f"{app_id}.copy", concurrency=1)(copy)
    faust.Worker(app, loglevel="warning", redirect_stdouts=False).execute_from_commandline()


def profile_worker(out: str, worker_args: list[str]) -> int:
    """``botmesh worker worker_args`` under cProfile; stats dumped to ``out`` at exit."""
    from botmesh._cli import main

    profile = cProfile.Profile()
    profile.enable()
    try:
        return main(["worker", *worker_args])
    finally:
        profile.disable()
        profile.dump_stats(out)


def unjournaled_worker(worker_args: list[str]) -> int:
    """``botmesh worker worker_args --journal memory://`` (bench only: see the module doc)."""
    import botmesh.streams.config
    from botmesh._cli import main

    check = botmesh.streams.config.check_worker_journal

    def allow_memory(url: str, source: str = "--journal") -> str:
        return url.strip() if url.strip() == "memory://" else check(url, source)

    botmesh.streams.config.check_worker_journal = allow_memory
    return main(["worker", *worker_args, "--journal", "memory://"])


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    mode, rest = argv[0], argv[1:]
    if mode == "aiokafka" and len(rest) == 4:
        asyncio.run(aiokafka_loop(*rest))
        return 0
    if mode == "faust" and len(rest) == 5:
        faust_per_event(*rest)
        return 0
    if mode == "profile" and len(rest) >= 1:
        return profile_worker(rest[0], rest[1:])
    if mode == "unjournaled":
        return unjournaled_worker(rest)
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
