"""The worker's ``/healthz``, ``/readyz`` and ``/metrics`` on a real broker
(``botmesh.observability``): the probes answer through the start, ``/readyz`` turns 200 once
the worker owns and has recovered its partitions; a second worker joining answers 503 until
its share is restored while the first keeps serving what it keeps; the scrape, read by
Prometheus' own parser, carries the engine's counters and the histograms of the work the
worker did."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from pathlib import Path

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from botmesh.observability.metrics import metric_names
from botmesh.streams.clients import AsyncProducer
from botmesh.streams.ops.tools import demo_records, end_offsets, produce_inbound
from botmesh.topics import Catalog
from tests.kafka.broker import free_ports
from tests.kafka.worker import PARTITIONS, WAIT_S, Worker, collect

pytestmark = pytest.mark.kafka

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


async def get(url: str) -> tuple[int, str]:
    """The status and body of ``GET url``; 0 when nothing answers (not listening yet)."""
    try:
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as session,
            session.get(url) as resp,
        ):
            return resp.status, await resp.text()
    except (aiohttp.ClientError, TimeoutError):
        return 0, ""


def scraped(text: str) -> Samples:
    """A scrape read by ``prometheus_client``'s parser (it raises on a malformed one)."""
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def total(samples: Samples, name: str, **labels: str) -> float:
    """The sum of ``name``'s samples whose labels include ``labels``."""
    want = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and want <= set(ls))


async def until(worker: Worker, url: str, check: Callable[[int, str], bool]) -> str:
    """Poll ``url`` until ``check(status, body)`` holds; the body then."""
    deadline = time.monotonic() + WAIT_S  # hang guard
    while time.monotonic() < deadline:
        worker.check_alive()
        status, body = await get(url)
        if check(status, body):
            return body
        await asyncio.sleep(0.05)
    raise AssertionError(f"{url} never answered as expected; last: {status} {body!r}")


def serving(tmp: Path, prefix: str, bootstrap: str, instance: str, port: int) -> Worker:
    return Worker(
        bootstrap,
        prefix,
        tmp,
        instance=instance,
        loglevel="info",
        env={"BOTMESH_HTTP_PORT": str(port)},
    )


async def test_the_probes_and_the_scrape_of_a_worker_at_work(
    kafka_bootstrap: str, topic_prefix: str, tmp_path: Path
) -> None:
    port = free_ports(1)[0]
    base = f"http://127.0.0.1:{port}"
    worker = serving(tmp_path, topic_prefix, kafka_bootstrap, "0", port)
    worker.start()
    try:
        assert await until(worker, f"{base}/healthz", lambda s, _: s == 200) == "ok\n"
        ready = await until(worker, f"{base}/readyz", lambda s, _: s == 200)
        assert (
            ready == f"ready: owns partitions {list(range(PARTITIONS))} of {topic_prefix}.inbound\n"
        )

        cat = Catalog(topic_prefix)
        start = await end_offsets(kafka_bootstrap, cat.sent)
        records = demo_records(20, 5, run="health")
        await produce_inbound(kafka_bootstrap, cat.inbound, records)
        await collect(worker, cat.sent, start, {r.id for r in records})
        producer = AsyncProducer(kafka_bootstrap)
        try:  # a record that is not an inbound message: dead-lettered with its reason
            await producer.send_and_wait(cat.inbound, b"not json", key=b"c1")
        finally:
            await producer.close()

        def settled(status: int, body: str) -> bool:  # observed just after each receipt
            samples = scraped(body) if status == 200 else {}
            return (
                total(samples, "botmesh_inbound_to_receipt_seconds_count") >= 20
                and total(samples, "botmesh_dead_letters_total") >= 1
            )

        samples = scraped(await until(worker, f"{base}/metrics", settled))
        status, _ = await get(f"{base}/nowhere")
    finally:
        worker.close()
    assert status == 404
    names = {name for name, _ in samples}
    assert names <= metric_names()  # what the alert rules and the dashboard are checked against
    # every family the worker exports, but the gateway's and the statuses' by channel (a
    # labelled family has samples once a channel's status came; none comes here)
    later = ("botmesh_gateway_", "botmesh_delivery_statuses_")
    assert {n for n in metric_names() if not n.startswith(later)} <= names
    assert total(samples, "botmesh_inbound_journaled_total") >= 20
    assert total(samples, "botmesh_outbox_journaled_total") >= 20
    assert total(samples, "botmesh_handler_seconds_count") >= 20
    assert total(samples, "botmesh_provider_call_seconds_count", result="ok") >= 20
    assert total(samples, "botmesh_provider_call_seconds_count", result="error") == 0
    assert total(samples, "botmesh_journal_write_seconds_count") >= 20
    assert total(samples, "botmesh_dead_letters_total") == 1
    assert total(samples, "botmesh_dead_letters_total", kind="inbound", reason="bad-json") == 1
    assert samples[("botmesh_worker_ready", ())] == 1
    assert samples[("botmesh_partitions_owned", ())] == PARTITIONS
    assert samples[("botmesh_partitions_restoring", ())] == 0
    lags = {dict(ls)["partition"] for (n, ls), _ in samples.items() if n == "botmesh_consumer_lag"}
    assert lags == {str(p) for p in range(PARTITIONS)}
    assert all(v >= 0 for (n, _), v in samples.items() if n == "botmesh_consumer_lag")


async def test_readyz_while_a_second_worker_joins_503_until_its_share_is_restored(
    kafka_bootstrap: str, topic_prefix: str, tmp_path: Path
) -> None:
    """The group rebalances cooperatively: the first worker keeps serving the partitions it
    keeps (its ``/readyz`` stays 200, or says why not while partitions move), the joining one
    answers 503 with its reason until its share is restored and recovered, then 200; between
    them they own every partition."""
    port_a, port_b = free_ports(2)
    a = serving(tmp_path / "a", topic_prefix, kafka_bootstrap, "0", port_a)
    b = serving(tmp_path / "b", topic_prefix, kafka_bootstrap, "1", port_b)
    ready_a, ready_b = f"http://127.0.0.1:{port_a}/readyz", f"http://127.0.0.1:{port_b}/readyz"
    a.start()
    try:
        await until(a, ready_a, lambda s, _: s == 200)
        seen_a: list[tuple[int, str]] = []
        seen_b: list[tuple[int, str]] = []
        joined = asyncio.Event()

        async def watch() -> None:  # every answer of both from b's start on
            while not joined.is_set():
                seen_a.append(await get(ready_a))
                with contextlib.suppress(aiohttp.ClientError):  # b's server not up yet
                    seen_b.append(await get(ready_b))
                await asyncio.sleep(0.02)

        watching = asyncio.create_task(watch())
        b.start()
        try:
            owned_b = await until(b, ready_b, lambda s, _: s == 200)
            # a ready with what it kept (b took its share)
            owned_a = await until(a, ready_a, lambda s, body: s == 200 and body != seen_a[0][1])
        finally:
            joined.set()
            await watching
    finally:
        b.close()
        a.close()
    not_ready_b = [body for status, body in seen_b if status == 503]
    assert not_ready_b, f"b's /readyz never said 503 before it was ready: {seen_b[:5]}"
    assert all(body.startswith("not ready: ") for body in not_ready_b)
    assert all(body.startswith("not ready: ") for status, body in seen_a if status == 503)
    mine = [_owned(owned_a), _owned(owned_b)]
    assert all(mine) and sorted(mine[0] + mine[1]) == list(range(PARTITIONS))


def _owned(body: str) -> list[int]:
    """The partitions a ``ready: owns partitions [..] of ..`` answer names."""
    assert body.startswith("ready: owns partitions ["), body
    inside = body.split("[", 1)[1].split("]", 1)[0]
    return [int(p) for p in inside.split(",")]
