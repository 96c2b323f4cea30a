"""Stops of a worker that cannot go the usual way.

A stop that cannot end: the worker gives it ``BOTMESH_STOP_TIMEOUT`` seconds, then prints
its threads' stacks and exits with status 70, acking nothing it had not finished; the
next run settles the message it was in the middle of.

The provider here is the test bot's HTTP provider pointed at a server that takes the POST and
never answers (a channel's API that hangs): the batch in progress cannot finish, so neither
can the stop. The next run finds the send journaled in flight and reports it ``unknown``
(the API may have taken it), so nothing is lost and nothing is sent twice.

A stop before the worker started: a SIGTERM while it is still importing and provisioning
ends it with status 0 (nothing consumed), not by the signal."""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from botmesh import Inbound
from botmesh.streams.provision import ensure_topics
from botmesh.streams.worker.loop import EXIT_SOFTWARE
from botmesh.topics import Catalog
from tests.kafka.test_journal_outage import produce
from tests.kafka.worker import PARTITIONS, WAIT_S, Worker, collect, wait_line

pytestmark = [pytest.mark.kafka]


class SilentApi:
    """A TCP server on 127.0.0.1 that reads what it is sent and never answers."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen()
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}/send"
        self.asked = threading.Event()
        self.requests = 0
        self.held: list[socket.socket] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return  # closed
            self.held.append(conn)
            if conn.recv(65536):
                self.requests += 1
                self.asked.set()

    def close(self) -> None:
        self.sock.close()
        for conn in self.held:
            conn.close()


@pytest.fixture
def silent_api() -> Iterator[SilentApi]:
    api = SilentApi()
    yield api
    api.close()


@pytest.mark.timeout(300)  # a hang guard: a healthy run takes about half a minute
async def test_a_stop_past_its_limit_exits_70_with_the_stacks_and_loses_nothing(
    kafka_bootstrap: str, topic_prefix: str, tmp_path: Path, silent_api: SilentApi
) -> None:
    cat = Catalog(topic_prefix)
    ensure_topics(kafka_bootstrap, cat.specs(partitions=PARTITIONS))
    worker = Worker(
        kafka_bootstrap,
        topic_prefix,
        tmp_path / "w",
        recorder=silent_api.url,
        env={"BOTMESH_STOP_TIMEOUT": "3"},
        loglevel="info",
    )
    worker.start()
    try:
        await produce(kafka_bootstrap, cat.inbound, [Inbound(id="m1", chat_id="c1", text="hi")])
        deadline = asyncio.get_running_loop().time() + WAIT_S
        while not silent_api.asked.is_set():  # the provider call is under way, and hangs
            worker.check_alive()
            assert asyncio.get_running_loop().time() < deadline, "the send never reached the API"
            await asyncio.sleep(0.1)
        status = worker.stop()  # SIGTERM; its stop waits on the send, past the limit
        lines = worker.lines()
        assert status == EXIT_SOFTWARE, worker.child and worker.child.tail(40)
        said = "\n".join(lines)
        assert "the worker did not stop within 3s (BOTMESH_STOP_TIMEOUT)" in said, said[-3000:]
        assert "Thread 0x" in said and "most recent call first" in said, said[-3000:]
        assert "exiting without acking the batch in progress" in said, said[-3000:]
    finally:
        worker.close()

    # the next run settles it: the send may have reached the API, so it is not made again
    # (that could answer twice) but reported unknown, and the message is done
    worker.start()
    try:
        seen = await collect(worker, cat.sent, {}, {"m1"})
        assert [(s.receipt.inbound_id, s.receipt.state) for s in seen] == [("m1", "unknown")]
        # the handler runs again (handlers run at least once: the restart's recovery replays
        # the inbound, and the redelivered record can run it too), the send never again
        assert worker.handled()["m1"] >= 1
        assert silent_api.requests == 1
        assert worker.stop() == 0
    finally:
        worker.close()


@pytest.mark.timeout(120)  # a hang guard: a healthy run takes a few seconds
def test_a_sigterm_while_the_worker_starts_ends_it_with_status_0(
    kafka_bootstrap: str, topic_prefix: str, tmp_path: Path
) -> None:
    """A supervisor stops a worker that is still starting (its bot module being imported,
    the topics provisioned, before the worker handles signals): it exits with status 0,
    having consumed nothing, not by the signal (-15), which reads as a crash."""
    worker = Worker(kafka_bootstrap, topic_prefix, tmp_path / "w", loglevel="info")
    worker.start()
    try:
        wait_line(worker, "botmesh worker: starting")
        status = worker.stop()  # SIGTERM at once: the worker's runtime has not started
        said = "\n".join(worker.lines())
        assert status == 0, said[-3000:]
        assert "SIGTERM before the worker started consuming" in said, said[-3000:]
        assert "worker started: " not in said, said[-3000:]
        assert not worker.handled()
    finally:
        worker.close()
