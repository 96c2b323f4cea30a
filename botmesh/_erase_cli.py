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
``--json``, a one-line summary on stderr. Exit codes (``botmesh._exit``): 0 done (a dry run:
answered); 1 refused (the chat's records stayed in flight for the owner's wait: erase again
later); 2 bad input; 3 Kafka unreachable or a topic missing; 4 no answer from the chat's owner
within ``--wait`` seconds (no worker running?).
"""

# Kafka code loads only when the command runs (import cost ~1 s):
# ruff: noqa: PLC0415

from __future__ import annotations

import asyncio
import json
import sys
import uuid
from types import SimpleNamespace as Args
from typing import Any

from botmesh._exit import Exit
from botmesh.topics import Catalog

__all__ = ["run_erase"]


def run_erase(args: Args, cat: Catalog, bootstrap: str) -> int:
    """``botmesh erase``: the exit status (see the module doc)."""
    chat = (args.chat_id or "").strip()
    if not chat:
        print("botmesh erase: --chat-id must not be empty", file=sys.stderr)
        return Exit.USAGE
    dry_run = bool(args.dry_run or not args.yes)
    try:
        answer, letters = asyncio.run(
            _ask(bootstrap, cat, chat, dry_run=dry_run, wait=args.wait, note=args.note)
        )
    except (ConnectionError, LookupError) as exc:
        print(f"botmesh erase: {exc}", file=sys.stderr)
        return Exit.UNREACHABLE
    if answer is None:
        print(
            f"botmesh erase: no answer from the owner of chat {chat!r} within {args.wait:g} s "
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
    receipt = answer.erasure.as_json()
    receipt["dead"] = [d.as_json() for d in answer.erasure.dead] + letters
    if args.json:
        print(json.dumps(receipt, ensure_ascii=False))
        return Exit.OK
    print(json.dumps(receipt, ensure_ascii=False, indent=2))
    tail = (
        "dry run, nothing deleted: add --yes to erase"
        if dry_run
        else "erased (the receipt is on " + cat.control_results + ")"
    )
    print(
        f"chat {chat}: {answer.detail}; {len(letters)} dead letters on the dead-letter topics "
        f"to handle; {tail}",
        file=sys.stderr,
    )
    return Exit.OK


async def _ask(
    bootstrap: str, cat: Catalog, chat: str, *, dry_run: bool, wait: float, note: str | None
) -> tuple[Any, list[dict[str, Any]]]:
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
