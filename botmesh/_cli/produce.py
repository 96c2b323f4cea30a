"""``botmesh produce``: demo inbound messages (N over M chats), or given texts to one chat, on
``<prefix>.inbound``."""

# the Kafka producer loads only when the command runs (import cost ~1 s):
# asyncio too, so that --help and shell completion load fast:
# ruff: noqa: PLC0415

from __future__ import annotations

import json
import uuid

import click

from botmesh._cli.options import (
    CONTEXT,
    bootstrap_of,
    catalog_of,
    connection_options,
    json_option,
)
from botmesh.state.messages import Inbound

__all__ = ["produce", "text_records"]


@click.command("produce", context_settings=CONTEXT)
@connection_options
@click.option("-n", "--messages", type=int, default=100, help="demo messages")
@click.option("--chats", type=int, default=10, help="over this many chats")
@click.option("--run", "run_id", help="id prefix of the messages  [default: random]")
@click.option(
    "--text",
    multiple=True,
    help="produce this text instead of demo messages (repeatable: one message each, in "
    "order, to --chat-id)",
)
@click.option("--chat-id", default="chat-0", help="the chat of the --text messages")
@json_option
def produce(
    *,
    prefix: str,
    bootstrap: str,
    messages: int,
    chats: int,
    run_id: str | None,
    text: tuple[str, ...],
    chat_id: str,
    as_json: bool,
) -> int:
    """Produce demo inbound messages (N over M chats), or given texts."""
    import asyncio

    from botmesh.streams.ops.tools import demo_records, produce_inbound

    cat, servers = catalog_of(prefix), bootstrap_of(bootstrap)
    run = run_id or f"run{uuid.uuid4().hex[:6]}"
    records = text_records(list(text), chat_id, run) if text else None
    if records is None:
        records = demo_records(messages, chats, run=run)
    took = asyncio.run(produce_inbound(servers, cat.inbound, records))
    rate = len(records) / took if took > 0 else 0.0
    over = 1 if text else chats
    if as_json:
        summary = {"topic": cat.inbound, "messages": len(records), "chats": over}
        print(json.dumps({**summary, "ids": [r.id for r in records], "seconds": took}))
        return 0
    print(
        f"produced {len(records)} messages over {over} chats to {cat.inbound} "
        f"(ids {run}-0..) in {took:.2f} s ({rate:.0f} msg/s)"
    )
    return 0


def text_records(texts: list[str], chat_id: str, run: str) -> list[Inbound]:
    """``botmesh produce --text``: one inbound per text, in order, to one chat."""
    return [Inbound(id=f"{run}-{i}", chat_id=chat_id, text=t) for i, t in enumerate(texts)]
