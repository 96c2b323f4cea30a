"""``botmesh gateway``: the webhook gateway (``botmesh._gateway``) from the command line.

It serves ``GET|POST /<channel>`` for each ``--channel`` (or
``BOTMESH_GATEWAY_CHANNELS=telegram,whatsapp``), verifies each webhook with the channel's
secret (from the environment only: a missing one exits 2 naming the variable) and produces
its records to ``<prefix>.inbound``, answering the channel once the broker acked them.
"""

# the gateway's server and Kafka side load only when the command runs (import cost ~1 s):
# ruff: noqa: PLC0415

from __future__ import annotations

import os

import click

from botmesh._cli.options import (
    CONTEXT,
    bootstrap_of,
    catalog_of,
    check_port,
    connection_options,
    count,
    logging_options,
)

__all__ = ["gateway"]


@click.command("gateway", context_settings=CONTEXT)
@click.option(
    "--channel",
    multiple=True,
    metavar="NAME",
    help="a channel to serve at /NAME (repeatable, or comma-separated)  "
    "[env var: BOTMESH_GATEWAY_CHANNELS]",
)
@click.option(
    "--host",
    default="127.0.0.1",
    envvar="BOTMESH_GATEWAY_HOST",
    show_envvar=True,
    help="address to listen on (0.0.0.0 in a container)",
)
@click.option(
    "--port",
    type=int,
    default=8080,
    envvar="BOTMESH_GATEWAY_PORT",
    show_envvar=True,
    help="port to listen on",
)
@click.option(
    "--public-url",
    envvar="BOTMESH_GATEWAY_PUBLIC_URL",
    show_envvar=True,
    help="the URL the channels call, without the channel path (Twilio signs it)",
)
@connection_options
@click.option("--max-body", type=int, default=1 << 20, help="largest body in bytes (then 413)")
@click.option(
    "--request-timeout",
    type=float,
    default=10.0,
    help="seconds a webhook may take, broker ack included (then 503)",
)
@click.option(
    "--seen-max", type=int, default=200_000, help="event ids remembered to drop retried webhooks"
)
@logging_options
def gateway(
    *,
    channel: tuple[str, ...],
    host: str,
    port: int,
    public_url: str | None,
    prefix: str,
    bootstrap: str,
    max_body: int,
    request_timeout: float,
    seen_max: int,
    loglevel: str,
    log_format: str | None,
) -> int:
    """Receive the channels' webhooks and produce them to <prefix>.inbound: GET|POST
    /<channel> for each channel, /healthz, /readyz, /metrics."""
    from botmesh import _gateway
    from botmesh.observability import logs, tracing
    from botmesh.providers.channels import CHANNELS, webhook_from_env

    raw = list(channel) or [os.environ.get("BOTMESH_GATEWAY_CHANNELS", "")]
    names = [n.strip().lower() for item in raw for n in item.split(",") if n.strip()]
    if not names:
        raise ValueError(
            "name the channels to serve: --channel NAME (repeatable) or "
            f"BOTMESH_GATEWAY_CHANNELS=a,b; known: {', '.join(sorted(CHANNELS))}"
        )
    webhooks = {name: webhook_from_env(name, os.environ) for name in dict.fromkeys(names)}
    public = public_url or os.environ.get("BOTMESH_GATEWAY_PUBLIC_URL", "").strip()
    config = _gateway.GatewayConfig(
        bootstrap=bootstrap_of(bootstrap),
        prefix=catalog_of(prefix).prefix,
        public_url=public or None,
        max_body=max_body,
        request_timeout=request_timeout,
        seen_max=seen_max,
        replication=count(None, "", "BOTMESH_REPLICATION", 1),
    )
    check_port(port)
    logs.setup_logging(loglevel, logs.log_format(log_format))
    tracing.configure("botmesh-gateway")
    return _gateway.run_gateway(_gateway.Gateway(webhooks, config), host, port)
