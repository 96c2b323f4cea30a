"""What ``bench_worker.py`` runs in its child processes, besides ``botmesh worker`` itself.

    python bench/_worker_baselines.py confluent BOOTSTRAP SRC DST GROUP
    python bench/_worker_baselines.py unjournaled WORKER_ARGS...
    python bench/_worker_baselines.py profile OUT.prof WORKER_ARGS...

- ``confluent``: the bare consume->produce loop on confluent-kafka (librdkafka, the client
  the worker runs on): take a batch (``poll``, then ``consume`` what else is there, up to
  1,000 records) -> ``produce`` each record to DST (acks=all, keys by murmur2) -> ``flush``
  (wait for every ack) -> ``commit`` (synchronous), no decoding, no journal;
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

import cProfile
import os
import signal
import sys
from pathlib import Path
from types import FrameType

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from botmesh.providers.mock import MockProvider  # noqa: E402

__all__ = [
    "confluent_loop",
    "profile_worker",
    "slow_provider",
    "unjournaled_worker",
]


def slow_provider() -> MockProvider:
    """The mock provider, ``BENCH_PROVIDER_DELAY`` seconds per send (default 0.05)."""
    return MockProvider("slow", delay=float(os.environ.get("BENCH_PROVIDER_DELAY", "0.05")))


def confluent_loop(bootstrap: str, src: str, dst: str, group: str) -> None:
    """consume -> produce each (acks=all) -> flush -> commit, until SIGTERM."""
    from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
        }
    )
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "acks": "all",
            "linger.ms": 5,
            "partitioner": "murmur2_random",  # as the worker's producer (and Java's) key
        }
    )
    failed: list[KafkaError] = []

    def delivered(err: KafkaError | None, _msg: Message) -> None:
        if err is not None:
            failed.append(err)

    stop = False

    def on_term(_signum: int, _frame: FrameType | None) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_term)
    consumer.subscribe([src])
    try:
        while not stop:
            # as soon as there is a record, what else is there (up to 1,000): consume()
            # alone would wait out its timeout unless 1,000 came
            first = consumer.poll(0.1)
            msgs = [] if first is None else [first, *consumer.consume(999, 0)]
            got = False
            for m in msgs:
                err = m.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        continue
                    raise KafkaException(err)
                got = True
                while True:
                    try:
                        producer.produce(dst, m.value(), m.key(), on_delivery=delivered)
                        break
                    except BufferError:  # the local queue is full: serve the acks
                        producer.poll(0.05)
            if got:
                if producer.flush(60.0):
                    raise SystemExit("confluent loop: records not acked within 60 s")
                if failed:
                    raise KafkaException(failed[0])
                consumer.commit(asynchronous=False)
    finally:
        producer.flush(10.0)
        consumer.close()


def profile_worker(out: str, worker_args: list[str]) -> int:
    """``botmesh worker worker_args`` under cProfile; stats dumped to ``out`` at exit."""
    from botmesh._cli.main import main

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
    from botmesh._cli.main import main

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
    if mode == "confluent" and len(rest) == 4:
        confluent_loop(*rest)
        return 0
    if mode == "profile" and len(rest) >= 1:
        return profile_worker(rest[0], rest[1:])
    if mode == "unjournaled":
        return unjournaled_worker(rest)
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
