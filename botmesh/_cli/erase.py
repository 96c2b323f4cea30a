"""``botmesh erase --chat-id X [--yes] [--dry-run]``: erase a chat's journal records through
the worker that owns it, and print the receipt.

Without ``--yes`` it is a dry run: the owner says what an erasure would delete, nothing is
deleted. With ``--yes`` (and no ``--dry-run``) the owner erases the chat
(``botmesh.state.erasure``: its inbounds, sends, flow checkpoint, turn and message log;
tombstones on the journal's changelog) and answers on ``<prefix>.control.results`` with the
receipt, which stays there as the evidence (``ControlResult.erasure``). Either way the chat's
dead letters on the dead-letter topics (copies the erasure does not delete, for the operator
to handle) are read and added to the printed receipt (``where``: ``topic:partition:offset``).

Output: the receipt as JSON (one line with ``--json``, indented otherwise), then, without
``--json``, a one-line summary on stderr. Exit codes (``botmesh._cli.exit``): 0 done (a dry run:
answered); 1 refused (the chat's records stayed in flight for the owner's wait: erase again
later); 2 bad input; 3 Kafka unreachable or a topic missing; 4 no answer from the chat's owner
within ``--wait`` seconds (no worker running?).
"""

# Kafka code loads only when the command runs (import cost ~1 s):
# asyncio too, so that --help and shell completion load fast:
# ruff: noqa: PLC0415

from __future__ import annotations

import json
import sys
import uuid
from typing import TYPE_CHECKING, Any

import click

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

if TYPE_CHECKING:
    from botmesh.state.erasure import ErasureReceipt
    from botmesh.topics.control import ControlResult

__all__ = ["erase"]


@click.command("erase", context_settings=CONTEXT)
@connection_options
@json_option
@click.option("--chat-id", required=True, help="the chat to erase")
@click.option("--yes", is_flag=True, help="erase it (without --yes: a dry run)")
@click.option("--dry-run", is_flag=True, help="say what would be erased; erase nothing")
@click.option("--note", help="who asks, a ticket: goes in the receipt  [default: botmesh-cli]")
@wait_option
def erase(
    *,
    prefix: str,
    bootstrap: str,
    as_json: bool,
    chat_id: str,
    yes: bool,
    dry_run: bool,
    note: str | None,
    wait: float,
) -> int:
    """Erase a chat's journal records (inbounds, sends, flow checkpoint, message log)
    through the worker that owns it, once its sends in flight finished; print the receipt
    (JSON) with the chat's dead letters to handle. A dry run unless --yes."""
    import asyncio

    cat, servers = catalog_of(prefix), bootstrap_of(bootstrap)
    chat = (chat_id or "").strip()
    if not chat:
        print("botmesh erase: --chat-id must not be empty", file=sys.stderr)
        return Exit.USAGE
    dry_run = bool(dry_run or not yes)
    try:
        answer, letters = asyncio.run(
            _ask(servers, cat, chat, dry_run=dry_run, wait=wait, note=note)
        )
    except (ConnectionError, LookupError) as exc:
        print(f"botmesh erase: {exc}", file=sys.stderr)
        return Exit.UNREACHABLE
    if answer is None:
        print(
            f"botmesh erase: no answer from the owner of chat {chat!r} within {wait:g} s "
            "(is a worker running on this prefix?); nothing is known to be erased",
            file=sys.stderr,
        )
        return Exit.NO_ANSWER
    if answer.outcome != "done" or answer.erasure is None:
        print(
            f"botmesh erase: the owner ({answer.instance}) {answer.outcome}: {answer.detail}",
            file=sys.stderr,
        )
        return Exit.REFUSED
    return _print_receipt(
        chat, answer.detail, answer.erasure, letters, cat, dry_run=dry_run, as_json=as_json
    )


def _print_receipt(
    chat: str,
    detail: str,
    erasure: ErasureReceipt,
    letters: list[dict[str, Any]],
    cat: Catalog,
    *,
    dry_run: bool,
    as_json: bool,
) -> int:
    """The owner's erasure receipt (``detail``: its summary) with the chat's dead letters on
    stdout (``--json``: one line), and without ``--json`` a summary on stderr."""
    receipt = erasure.as_json()
    receipt["dead"] = [d.as_json() for d in erasure.dead] + letters
    if as_json:
        print(json.dumps(receipt, ensure_ascii=False))
        return Exit.OK
    print(json.dumps(receipt, ensure_ascii=False, indent=2))
    tail = (
        "dry run, nothing deleted: add --yes to erase"
        if dry_run
        else "erased (the receipt is on " + cat.control_results + ")"
    )
    print(
        f"chat {chat}: {detail}; {len(letters)} dead letters on the dead-letter topics "
        f"to handle; {tail}",
        file=sys.stderr,
    )
    return Exit.OK


async def _ask(
    bootstrap: str, cat: Catalog, chat: str, *, dry_run: bool, wait: float, note: str | None
) -> tuple[ControlResult | None, list[dict[str, Any]]]:
    """The owner's answer to an ``erase_chat`` request (``None``: none within ``wait``), and
    the chat's dead letters on the dead-letter topics (as the receipt lists dead records)."""
    from botmesh.streams.ops import dlq
    from botmesh.topics.control import ControlRequest

    topics = [dlq.dlq_topic(cat, kind) for kind in dlq.KINDS]
    letters = await dlq.read_dead_letters(bootstrap, topics, dlq.Filter(chat=chat))
    by = note if note else f"botmesh-cli erase@{uuid.uuid4().hex[:8]}"
    request = ControlRequest(
        id=uuid.uuid4().hex,
        chat_id=chat,
        action="erase_chat",
        target=chat,
        by=by,
        dry_run=dry_run,
    )
    answers = await dlq.ask_owners(bootstrap, cat, [request], wait_s=wait)
    kinds = {cat.inbound_dlq: "inbox", cat.outbox_dlq: "outbox", cat.requests_dlq: "request"}
    listed = [
        {
            "kind": kinds.get(d.topic, "outbox"),
            "id": d.send_key or d.inbound_id or "",
            "reason": d.reason,
            "dead_ts": d.dead_ts,
            "where": f"{d.topic}:{d.partition}:{d.offset}",
        }
        for d in letters
    ]
    return answers.get(request.id), listed
