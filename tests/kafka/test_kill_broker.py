"""The broker stopped and started again under traffic, counting effects at the recorder.

The test starts a broker of its own (``deploy/kafka/kafka.sh start`` on two free ports of
127.0.0.1 below 32768, its data dir under the test's tmp dir): the session broker other tests
share is never stopped. A worker (the test bot on its default journal, an inbox budget long
enough to ride out the outage) handles a first wave of inbounds; the broker is stopped
(``kafka.sh stop``) while that wave is in flight, left down a moment and started again on
the same data; a second wave follows. A worker that exits during the outage (a batch it
cannot settle exits without acking) is started again, as a supervisor would. Then: 0 lost,
0 sent twice (``check_effects``), and the figures (restarts, time to the first reply after
the broker came back).
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from botmesh.streams.ops.tools import produce_inbound
from botmesh.streams.provision import ensure_topics
from botmesh.topics import Catalog
from tests.kafka.broker import OwnBroker
from tests.kafka.recorder import Recorder, Tally, check_effects, traffic, wait_until
from tests.kafka.worker import PARTITIONS, WAIT_S, Worker

pytestmark = [pytest.mark.kafka, pytest.mark.crash]

WAVE = 1500  # the first wave: still in flight when the broker goes down


@pytest.mark.timeout(600)  # a hang guard
async def test_broker_stopped_and_started_under_traffic_loses_nothing(
    own_broker: OwnBroker, topic_prefix: str, tmp_path: Path
) -> None:
    bootstrap = own_broker.bootstrap
    cat = Catalog(topic_prefix)
    ensure_topics(bootstrap, cat.specs(partitions=PARTITIONS))
    first, second = traffic("bs", WAVE), traffic("bt", WAVE // 5)
    ids = {r.id for r in first + second}
    restarts = 0
    with Recorder() as recorder:
        tally = await Tally(bootstrap, cat.sent, cat.inbound_dlq).start()
        worker = Worker(
            bootstrap,
            topic_prefix,
            tmp_path / "w",
            recorder=recorder.url,
            env={"BOTMESH_TEST_INBOX_ATTEMPTS": "60", "BOTMESH_TEST_INBOX_BACKOFF_MS": "250"},
        )

        def supervise() -> None:  # a worker that exited is started again
            nonlocal restarts
            if worker.child is not None and not worker.child.alive():
                worker.child.stop()  # reap it
                restarts += 1
                worker.start()

        try:
            worker.start()
            await produce_inbound(bootstrap, cat.inbound, first)
            first_ids = {r.id for r in first}
            await wait_until(
                lambda: len(first_ids & recorder.answered()) >= WAVE // 4,
                "a quarter of the first wave answered",
                check=worker.check_alive,
                limit=WAIT_S,
            )
            at_stop = len(first_ids & recorder.answered())
            own_broker.run("stop")  # the wave is in flight
            stopped = time.monotonic()
            await asyncio.sleep(3)  # down a moment (a chosen outage, not a wait)
            own_broker.run("start")
            down_s = time.monotonic() - stopped
            at_start = len(first_ids & recorder.answered())
            back, since = time.monotonic(), len(recorder)
            await produce_inbound(bootstrap, cat.inbound, second)
            first_reply = await wait_until(
                lambda: len(recorder) > since,
                "a reply after the broker came back",
                check=supervise,
                limit=WAIT_S,
            )
            await tally.until_accounted(recorder, ids, supervise, WAIT_S)
            assert worker.stop() == 0
        finally:
            worker.close()
            await tally.close()
        print(
            f"\n  broker stopped with {at_stop}/{WAVE} of the first wave answered, "
            f"{at_start} when it was back; down {down_s:.1f}s (stop and start included); "
            f"worker restarts {restarts}; first reply {first_reply:.1f}s after the broker was "
            f"back ({time.monotonic() - back:.1f}s to the end)"
        )
        check_effects(recorder, tally, ids)
