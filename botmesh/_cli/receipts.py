"""``botmesh receipts``: tail the sent-receipts topic (``<prefix>.sent``), one JSON line a
receipt, until ``--limit`` receipts, ``--idle`` seconds without one, or Ctrl-C."""

# the Kafka consumer loads only when the command runs (import cost ~1 s):
# asyncio too, so that --help and shell completion load fast:
# ruff: noqa: PLC0415

from __future__ import annotations

import contextlib
import json

import click

from botmesh._cli.options import CONTEXT, bootstrap_of, catalog_of, connection_options

__all__ = ["receipts"]


@click.command("receipts", context_settings=CONTEXT)
@connection_options
@click.option("--from-beginning", is_flag=True, help="from the topic's start, not its end")
@click.option("--limit", type=int, help="stop after N receipts")
@click.option("--idle", type=float, help="stop after SECONDS without a receipt")
def receipts(
    *, prefix: str, bootstrap: str, from_beginning: bool, limit: int | None, idle: float | None
) -> int:
    """Tail the sent-receipts topic (JSON lines)."""
    import asyncio

    from botmesh.streams.ops.tools import tail_receipts

    cat, servers = catalog_of(prefix), bootstrap_of(bootstrap)

    async def tail() -> None:
        n = 0
        async for seen in tail_receipts(
            servers, cat.sent, from_beginning=from_beginning, idle_timeout=idle
        ):
            r = seen.receipt
            print(
                json.dumps(
                    {
                        "key": r.key,
                        "chat_id": r.chat_id,
                        "message_id": r.message_id,
                        "state": r.state,
                        "inbound_id": r.inbound_id,
                        "part": r.part,
                        "ts": r.ts,
                        "fallback_key": r.fallback_key,
                        "delivery": r.delivery,
                        "delivery_code": r.delivery_code,
                    }
                ),
                flush=True,
            )
            n += 1
            if limit is not None and n >= limit:
                return

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(tail())
    return 0
