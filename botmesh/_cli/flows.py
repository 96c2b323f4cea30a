"""``botmesh flows restart|drop``: a chat's conversation flow, restarted or dropped by the
chat's owner (a request on ``<prefix>.control``, its answer on ``<prefix>.control.results``).
Exit statuses as ``botmesh dlq``'s: 0 done, 1 refused, 2 bad input, 3 Kafka unreachable, 4
no answer from an owner within ``--wait`` seconds."""

# Kafka code loads only when a flows command runs (import cost ~1 s):
# asyncio too, so that --help and shell completion load fast:
# ruff: noqa: PLC0415

from __future__ import annotations

import sys
import uuid
from typing import Any, Literal

import click

from botmesh._cli.dlq import progress, say
from botmesh._cli.exit import Exit
from botmesh._cli.options import (
    CONTEXT,
    bootstrap_of,
    catalog_of,
    connection_options,
    json_option,
    wait_option,
)
from botmesh.topics import Catalog

__all__ = ["flows"]


@click.group("flows", context_settings=CONTEXT)
def flows() -> None:
    """Restart or drop a chat's conversation flow (its owner does)."""


def _action(name: Literal["restart", "drop"], text: str) -> None:
    """``botmesh flows NAME``: ask each chat's owner to restart or drop its flow."""

    @flows.command(name, context_settings=CONTEXT, help=text)
    @connection_options
    @json_option
    @click.option("--chat-id", multiple=True, required=True, help="the chat (repeatable)")
    @wait_option
    def action(
        *, prefix: str, bootstrap: str, as_json: bool, chat_id: tuple[str, ...], wait: float
    ) -> int:
        cat, servers = catalog_of(prefix), bootstrap_of(bootstrap)
        chats = list(dict.fromkeys(c.strip() for c in chat_id))
        if not all(chats):
            print(f"botmesh flows {name}: --chat-id must not be empty", file=sys.stderr)
            return Exit.USAGE
        try:
            report = _ask(name, servers, cat, chats, wait=wait, as_json=as_json)
        except (ConnectionError, LookupError) as exc:
            print(f"botmesh flows {name}: {exc}", file=sys.stderr)
            return Exit.UNREACHABLE
        done = sum(r["outcome"] == "done" for r in report)
        say(report, f"flows {name}: {done} of {len(report)} done", as_json)
        if any(r["outcome"] == "no answer" for r in report):
            return Exit.NO_ANSWER
        return Exit.OK if done == len(report) else Exit.REFUSED


def _ask(
    name: Literal["restart", "drop"],
    servers: str,
    cat: Catalog,
    chats: list[str],
    *,
    wait: float,
    as_json: bool,
) -> list[dict[str, Any]]:
    """The owners' answers to a ``restart_flow`` or ``drop_flow`` request for each chat, one
    report line each (``no answer`` within ``wait`` seconds)."""
    import asyncio

    from botmesh.streams.ops import dlq as ops
    from botmesh.topics.control import ControlRequest

    action: Literal["restart_flow", "drop_flow"] = (
        "restart_flow" if name == "restart" else "drop_flow"
    )
    by = "botmesh-cli flows"
    requests = [
        ControlRequest(id=uuid.uuid4().hex, chat_id=c, action=action, target=c, by=by)
        for c in chats
    ]
    with progress(f"waiting for the owners ({name})", as_json) as shown:
        answers = asyncio.run(ops.ask_owners(servers, cat, requests, wait_s=wait, progress=shown))
    report: list[dict[str, Any]] = []
    for r in requests:
        answer = answers.get(r.id)
        if answer is None:
            report.append({"target": r.target, "chat_id": r.chat_id, "outcome": "no answer"})
            continue
        report.append(
            {
                "target": r.target,
                "chat_id": r.chat_id,
                "outcome": answer.outcome,
                "state": answer.state,
                "detail": answer.detail,
                "worker": answer.instance,
            }
        )
    return report


_action(
    "restart",
    "Start the chat's flow again from its beginning under the worker's code (a checkpoint "
    "refused as another version).",
)
_action("drop", "End the chat's flow (dropped): its next message goes to the handlers.")
