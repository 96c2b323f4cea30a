"""The Kafka worker: a Faust app whose inbound agent runs a bot's handlers.

``build_app(bot, WorkerConfig.from_env())`` makes the app; ``run_worker`` provisions the
topics and runs it with Faust's worker (SIGTERM / Ctrl-C stop it: the agent finishes its batch,
offsets are committed, then the bot stops).

The agent reads ``<prefix>.inbound`` in batches (``take_events``), decodes each record
(``topics.records``), runs ``bot.handle`` (per-chat order kept, chats of a batch concurrently),
produces one receipt per accepted send to ``<prefix>.sent`` and undecodable records to
``<prefix>.inbound.dlq`` (headers ``reason``, ``detail``, ``source.topic``,
``source.partition``, ``source.offset``). A batch is acked only after its receipts and dead
letters are acked by the broker (acks=all). Nothing raised in the batch body reaches Faust
(which would ack and commit the whole batch): the runner catches handler errors and exits the
process hard when it cannot write to Kafka, so the broker redelivers.

Known hazard (faust 0.15.3, ``streams.py`` ``take_events``): the batch's events are acked in a
``finally``, so an agent *cancelled* mid-batch acks events it did not process. A clean stop
does not cancel mid-batch (``stream_wait_empty``: Faust waits for the batch before stopping
the consumer); a SIGKILL acks nothing. A hard cancel (shutdown timeout) could; the durable
inbox journal is what covers that case.

Environment (``WorkerConfig.from_env``): ``KAFKA_BOOTSTRAP_SERVERS`` (default
``127.0.0.1:9092``), ``BOTMESH_TOPIC_PREFIX`` (``botmesh``), ``BOTMESH_DATA_DIR``
(``./botmesh-data``: the RocksDB table stores), ``BOTMESH_WEB_PORT`` (unset: web server off;
else Faust's web server on 127.0.0.1:<port>), ``BOTMESH_PARTITIONS`` (8, for topics the worker
creates), ``BOTMESH_REPLICATION`` (1), ``BOTMESH_BATCH_SIZE`` (500), ``BOTMESH_LOG_LEVEL``
(``info``).
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, NoReturn

import faust

from streams.provision import ensure_topics
from streams.runner import BotLike, Headers, InboundRunner, RawRecord
from topics.catalog import DEFAULT_PARTITIONS, Catalog, prefix_from_env

__all__ = ["DEFAULT_BOOTSTRAP", "WorkerConfig", "build_app", "run_worker"]

log = logging.getLogger("botmesh.streams")

DEFAULT_BOOTSTRAP = "127.0.0.1:9092"


def _int_env(env: Mapping[str, str], name: str, default: int | None) -> int | None:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not an integer; set a number or unset it") from None


@dataclass(frozen=True, slots=True)
class WorkerConfig:
    """Settings of one worker process (see the module docstring for the environment)."""

    bootstrap: str = DEFAULT_BOOTSTRAP
    prefix: str = "botmesh"
    data_dir: Path = field(default_factory=lambda: Path("botmesh-data"))
    web_port: int | None = None
    partitions: int = DEFAULT_PARTITIONS
    replication: int = 1
    batch_size: int = 500
    batch_within: float = 0.05
    handle_attempts: int = 3
    loglevel: str = "info"
    provision: bool = True

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> WorkerConfig:
        env = os.environ if environ is None else environ
        base = cls(
            bootstrap=env.get("KAFKA_BOOTSTRAP_SERVERS", "").strip() or DEFAULT_BOOTSTRAP,
            prefix=prefix_from_env(env),
            data_dir=Path(env.get("BOTMESH_DATA_DIR", "").strip() or "botmesh-data"),
            web_port=_int_env(env, "BOTMESH_WEB_PORT", None),
            partitions=_int_env(env, "BOTMESH_PARTITIONS", DEFAULT_PARTITIONS) or 1,
            replication=_int_env(env, "BOTMESH_REPLICATION", 1) or 1,
            batch_size=_int_env(env, "BOTMESH_BATCH_SIZE", 500) or 1,
            loglevel=env.get("BOTMESH_LOG_LEVEL", "").strip() or "info",
        )
        return replace(base, **{k: v for k, v in overrides.items() if v is not None})

    @property
    def catalog(self) -> Catalog:
        return Catalog(self.prefix)


class _BotApp(faust.App):
    """The Faust app with the bot's lifecycle: started before the agents, stopped after them."""

    botmesh_bot: BotLike | None = None
    botmesh_runner: InboundRunner | None = None
    _bot_started = False

    async def on_start(self) -> None:
        await super().on_start()
        if self.botmesh_bot is not None and not self._bot_started:
            await self.botmesh_bot.start()
            self._bot_started = True

    async def on_shutdown(self) -> None:
        await super().on_shutdown()
        if self.botmesh_bot is not None and self._bot_started:
            self._bot_started = False
            await self.botmesh_bot.stop()


def _exit_hard(exc: BaseException) -> NoReturn:
    """Kafka refused a receipt or dead letter: exit without acking, so the batch is redelivered."""
    log.critical("exiting without committing: %s", exc)
    logging.shutdown()
    sys.stderr.flush()
    os._exit(70)


def build_app(bot: BotLike, config: WorkerConfig) -> Any:
    """The Faust app (untyped, hence ``Any``) running ``bot`` on ``config``'s topics."""
    cat = config.catalog
    web: dict[str, Any] = {"web_enabled": False}
    if config.web_port is not None:
        web = {
            "web_enabled": True,
            "web_bind": "127.0.0.1",
            "web_host": "127.0.0.1",
            "web_port": config.web_port,
        }
    app = _BotApp(
        cat.app_id,
        broker=[f"kafka://{b.strip()}" for b in config.bootstrap.split(",") if b.strip()],
        store="rocksdb://",
        datadir=str(config.data_dir),
        processing_guarantee="at_least_once",
        producer_acks=-1,
        consumer_auto_offset_reset="earliest",
        topic_partitions=config.partitions,
        topic_replication_factor=config.replication,
        topic_allow_declare=True,
        worker_redirect_stdouts=False,
        **web,
    )
    app.botmesh_bot = bot

    def raw_topic(name: str) -> Any:
        return app.topic(
            name, key_type=bytes, value_type=bytes, key_serializer="raw", value_serializer="raw"
        )

    inbound = raw_topic(cat.inbound)
    names = {"sent": cat.sent, "dlq": cat.inbound_dlq}

    async def produce(role: str, key: bytes | None, value: bytes, headers: Headers) -> Any:
        # the driver's send (aiokafka accumulator), not Topic.send: ~2x less work per record
        producer = await app.maybe_start_producer()
        return await producer.send(names[role], key, value, None, None, headers or None)

    runner = InboundRunner(
        bot, produce, handle_attempts=config.handle_attempts, on_fatal=_exit_hard
    )
    app.botmesh_runner = runner

    async def process(stream: Any) -> None:
        async for events in stream.take_events(config.batch_size, within=config.batch_within):
            records = []
            for ev in events:
                msg = ev.message
                records.append(
                    RawRecord(
                        topic=msg.topic,
                        partition=msg.partition,
                        offset=msg.offset,
                        key=msg.key,
                        value=msg.value,
                        headers=_headers(msg.headers),
                    )
                )
            try:
                await runner.run_batch(records)
            except Exception as exc:  # never let Faust ack a batch that failed
                _exit_hard(exc)

    app.agent(inbound, name=f"{cat.app_id}.inbound", concurrency=1)(process)
    return app


def _headers(headers: Any) -> list[tuple[str, bytes]]:
    if not headers:
        return []
    items = headers.items() if isinstance(headers, Mapping) else headers
    return [(str(k), bytes(v) if v is not None else b"") for k, v in items]


def run_worker(bot: BotLike, config: WorkerConfig) -> None:
    """Provision the topics (idempotent), then run the worker until SIGTERM / Ctrl-C."""
    if config.provision:
        result = ensure_topics(
            config.bootstrap, config.catalog.specs(config.partitions, config.replication)
        )
        if result.created:
            log.info("created topics: %s", ", ".join(result.created))
    config.data_dir.mkdir(parents=True, exist_ok=True)
    app = build_app(bot, config)
    worker = faust.Worker(app, loglevel=config.loglevel, redirect_stdouts=False)
    worker.execute_from_commandline()
