"""``botmesh worker``: a bot on the inbound topic, the Kafka worker.

The worker loads a bot *definition* (``--app``) and supplies what it runs on: the provider
(``--provider`` / ``BOTMESH_PROVIDER``, default ``console``; a channel name such as
``telegram`` builds that channel's adapter from its environment variables,
``botmesh.providers.channels``), the journal (``--journal`` / ``BOTMESH_JOURNAL``, default
``kafka``: the journal on Kafka itself, a changelogged table the group shares; or
``file:///path`` for one worker alone; never none and never ``memory://``) and the instance
id (``--instance-id`` / ``BOTMESH_INSTANCE_ID``). Every other option falls back to the
environment (``botmesh.streams.config.WorkerConfig.from_env``).
"""

# the worker (and Kafka with it) loads only when the command runs (import cost ~1 s):
# ruff: noqa: PLC0415

from __future__ import annotations

from pathlib import Path

import click

from botmesh._cli.exit import stop_on_sigterm_until_started
from botmesh._cli.load import fallbacks_of_env, load_app, provider_of
from botmesh._cli.options import CONTEXT, log_format_option
from botmesh.topics.catalog import DEFAULT_PARTITIONS, check_prefix

__all__ = ["worker"]


@click.command("worker", context_settings=CONTEXT)
@click.option("--app", required=True, help="the bot definition, module:attribute")
@click.option(
    "--provider",
    help="console, mock, a channel (telegram, whatsapp, ...: its adapter, configured from "
    "the environment) or module:attribute naming a provider or a zero-argument factory  "
    "[env var: BOTMESH_PROVIDER; default: console]",
)
@click.option(
    "--journal",
    help="kafka (on Kafka itself, shared by the group) or file:///path (one worker alone); "
    "never none, never memory://  [env var: BOTMESH_JOURNAL; default: kafka]",
)
@click.option(
    "--instance-id",
    help="lease owner and static group member id: stable across restarts, unique per "
    "replica  [env var: BOTMESH_INSTANCE_ID; default: the runtime's]",
)
@click.option(
    "--bootstrap",
    help="Kafka bootstrap servers  [env var: KAFKA_BOOTSTRAP_SERVERS; default: 127.0.0.1:9092]",
)
@click.option("--prefix", help="topic prefix  [env var: BOTMESH_TOPIC_PREFIX; default: botmesh]")
@click.option(
    "--data-dir",
    help="the journal's RocksDB databases  [env var: BOTMESH_DATA_DIR; default: ./botmesh-data]",
)
@click.option(
    "--http-host",
    help="address of /healthz, /readyz and /metrics  [env var: BOTMESH_HTTP_HOST; default: "
    "127.0.0.1]",
)
@click.option(
    "--http-port",
    type=int,
    help="their port (unset: not served)  [env var: BOTMESH_HTTP_PORT]",
)
@click.option(
    "--partitions",
    type=int,
    help=f"partitions of the topics it creates  [env var: BOTMESH_PARTITIONS; default: "
    f"{DEFAULT_PARTITIONS}]",
)
@click.option(
    "--batch-size",
    type=int,
    help="records per batch  [env var: BOTMESH_BATCH_SIZE; default: 500]",
)
@click.option(
    "--guarantee",
    type=click.Choice(["at_least_once", "exactly_once"]),
    help="processing guarantee; exactly_once commits the journal, the receipts and the "
    "offsets in Kafka transactions  [env var: BOTMESH_PROCESSING_GUARANTEE; default: "
    "at_least_once]",
)
@click.option("--loglevel", help="log level  [env var: BOTMESH_LOG_LEVEL; default: info]")
@log_format_option
def worker(
    *,
    app: str,
    provider: str | None,
    journal: str | None,
    instance_id: str | None,
    bootstrap: str | None,
    prefix: str | None,
    data_dir: str | None,
    http_host: str | None,
    http_port: int | None,
    partitions: int | None,
    batch_size: int | None,
    guarantee: str | None,
    loglevel: str | None,
    log_format: str | None,
) -> int:
    """Run a bot on the inbound topic (the Kafka worker)."""
    from botmesh.observability import logs, tracing
    from botmesh.streams.config import WorkerConfig, check_worker_journal

    if journal is not None:
        check_worker_journal(journal, "--journal")
    line_format = logs.log_format(log_format)
    stop_on_sigterm_until_started()  # done already when started as python -m botmesh
    bot = load_app(app)
    bot_provider = provider_of(provider)
    fallbacks = fallbacks_of_env()
    if instance_id is not None and not instance_id.strip():
        raise ValueError("--instance-id: must not be empty; leave it out for the default")
    config = WorkerConfig.from_env(
        bootstrap=bootstrap,
        prefix=check_prefix(prefix) if prefix else None,
        data_dir=Path(data_dir) if data_dir else None,
        journal=journal,
        instance_id=instance_id,
        http_host=http_host,
        http_port=http_port,
        partitions=partitions,
        batch_size=batch_size,
        loglevel=loglevel,
        guarantee=guarantee,
    )
    logs.setup_logging(config.loglevel, line_format)
    tracing.configure("botmesh-worker")  # after the bot module: a provider it installed counts
    from botmesh.streams.worker.loop import run_worker

    return run_worker(
        bot,
        bot_provider,
        config,
        fallbacks=fallbacks,
        # the record's log context and span: nothing reads them under text lines untraced
        record_scope=logs.record_scope if line_format == "json" or tracing.ENABLED else None,
        journal_written=tracing.journal_write if tracing.ENABLED else None,
    )
