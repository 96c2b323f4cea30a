"""Rate limits kept by a real worker on a real broker (docs/rate-limits.md): ``N`` send
requests, one per chat, produced to ``<prefix>.requests`` and handled by a ``botmesh
worker`` whose provider POSTs each send to a recorder in this process
(``tests.kafka.recorder.Recorder``) that enforces a channel rate limit as a channel's API
does (a token bucket; a send over it is answered 429 with a ``Retry-After``).

The worker is told that limit (``BOTMESH_RATE_LIMIT``) and paces its sends under it: the
recorder answers no 429, and the sends take ``N / limit`` seconds from the first to the
last, within 10 %: the pacing neither lets a burst through nor leaves the limit unused (a
worker keeping too small a share of it would take longer). The elapsed time is measured
from the recorder's arrival times, once every send arrived; the test waits for that
condition, never for a time.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from botmesh.streams.ops.tools import produce_requests
from botmesh.streams.provision import ensure_topics
from botmesh.topics import Catalog, SendRequest
from tests.kafka.recorder import Recorder, wait_until
from tests.kafka.worker import Worker

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

#: Send requests, one chat each.
N = 600
#: The channel's limit, sends a second, at the recorder and told to the worker: well under
#: what one worker sends on a loaded 2-core machine (the test measures the pacing, not the
#: worker's top speed: docs/measurements.md has 1,500 at 100/s).
LIMIT = 40
#: The recorder's bucket: up to 0.5 s of arrival jitter passes (each send opens its own
#: connection, whose setup takes longer for one than the next on a loaded machine: CI saw
#: one 429 with 0.25 s), no more.
BURST = 20


async def test_a_worker_paces_its_sends_under_the_channel_limit(
    kafka_bootstrap: str, topic_prefix: str, tmp_path: Path
) -> None:
    cat = Catalog(topic_prefix)
    ensure_topics(kafka_bootstrap, cat.specs(partitions=4))
    requests = [SendRequest(id=f"r{i}", chat_id=f"c{i}", text=f"notice {i}") for i in range(N)]
    with Recorder() as recorder:
        recorder.limit(LIMIT, burst=BURST)
        worker = Worker(
            kafka_bootstrap,
            topic_prefix,
            tmp_path,
            recorder=recorder.url,
            env={"BOTMESH_RATE_LIMIT": f"{LIMIT}/s"},
        )
        try:
            await produce_requests(kafka_bootstrap, cat.requests, requests)
            worker.start()
            await wait_until(
                lambda: len(recorder) >= N,
                f"{N} sends at the recorder",
                check=worker.check_alive,
                limit=120.0,
            )
            assert worker.stop() == 0
        finally:
            worker.close()
        calls = recorder.calls()
        elapsed = calls[-1].at - calls[0].at
        expected = N / LIMIT
        gaps = sorted(
            ((b.at - a.at, i) for i, (a, b) in enumerate(itertools.pairwise(calls))),
            reverse=True,
        )
        print(
            f"\n  {N} sends at {LIMIT}/s: {elapsed:.2f} s from the first to the last "
            f"(expected {expected:.1f} s), {recorder.limited} refused with 429; longest "
            f"gaps: {', '.join(f'{g * 1000:.0f} ms after send {i}' for g, i in gaps[:4])}"
        )
        assert recorder.limited == 0, f"{recorder.limited} sends over the channel's limit"
        assert {c.text for c in calls} == {r.text for r in requests}
        assert len(calls) == N  # each once
        assert abs(elapsed - expected) <= 0.1 * expected, (elapsed, expected)
