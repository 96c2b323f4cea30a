"""``botmesh dlq list|show|retry|replay|discard``: the dead letters, for an operator; and
``botmesh flows restart|drop``: a chat's conversation flow, through the chat's owner.

Exit codes (``EXIT_*``, from ``botmesh._exit``): 0 done; 1 refused (nothing matched, or an
owner refused an action: the output says why); 2 bad input; 3 Kafka unreachable or a topic
missing; 4 no answer from the chat's owner within ``--wait`` seconds (no worker running?).
"""

# Kafka code loads only when a dlq command runs (import cost ~1 s):
# ruff: noqa: PLC0415

from __future__ import annotations

import asyncio
import datetime as dt
import json
import sys
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from types import SimpleNamespace as Args
from typing import Any, Literal

from botmesh._exit import Exit
from botmesh.topics import Catalog
from botmesh.topics.dead_letters import DeadLetter

__all__ = [
    "EXIT_NO_ANSWER",
    "EXIT_OK",
    "EXIT_REFUSED",
    "EXIT_UNREACHABLE",
    "run_dlq",
    "run_flows",
]

# the statuses of every operator command, defined once in botmesh._exit
EXIT_OK = Exit.OK
EXIT_REFUSED = Exit.REFUSED
EXIT_USAGE = Exit.USAGE
EXIT_UNREACHABLE = Exit.UNREACHABLE
EXIT_NO_ANSWER = Exit.NO_ANSWER


@contextmanager
def _progress(label: str, quiet: bool) -> Iterator[Callable[[int, int], None]]:
    """A rich progress bar on stderr (none with --json or when stderr is not a terminal)."""
    if quiet or not sys.stderr.isatty():
        yield lambda done, total: None
        return
    from rich.console import Console
    from rich.progress import Progress

    with Progress(console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task(label, total=None)
        yield lambda done, total: bar.update(task, completed=done, total=total or None)


def _table(letters: Sequence[DeadLetter]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(show_lines=False)
    for col in ("dead at (UTC)", "where", "chat", "key / inbound id", "reason", "error"):
        table.add_column(col, overflow="fold")
    for d in letters:
        when = dt.datetime.fromtimestamp(d.dead_ts, dt.UTC).strftime("%Y-%m-%d %H:%M:%S")
        error = " ".join(
            x for x in (d.headers.get("error.class"), d.headers.get("error.message")) if x
        )
        ident = d.send_key or d.inbound_id or ""
        where = f"{d.topic}:{d.partition}:{d.offset}"
        table.add_row(when, where, d.chat_id or "", ident, d.reason, error[:80])
    Console().print(table)


def run_dlq(args: Args, cat: Catalog, bootstrap: str) -> int:
    try:
        return _run(args, cat, bootstrap)
    except (ConnectionError, LookupError) as exc:  # no broker, or a topic missing
        print(f"botmesh dlq {args.action}: {exc}", file=sys.stderr)
        return EXIT_UNREACHABLE
    except ValueError as exc:
        print(f"botmesh dlq {args.action}: {exc}", file=sys.stderr)
        return EXIT_USAGE


def _kinds(args: Args) -> list[str]:
    if args.action in ("retry", "discard"):
        return ["outbox"]
    if args.action == "replay":
        return ["inbound"]
    return [args.kind] if getattr(args, "kind", None) else ["inbound", "outbox", "requests"]


def _run(args: Args, cat: Catalog, bootstrap: str) -> int:
    from botmesh.streams.ops import dlq

    topics = [dlq.dlq_topic(cat, k) for k in _kinds(args)]
    if args.action == "show":
        flt = dlq.Filter()
    else:
        flt = dlq.Filter(
            chat=args.chat_id,
            key=args.key,
            reason=args.reason,
            since=dlq.parse_when(args.since, "--since"),
            until=dlq.parse_when(args.until, "--until"),
        )
    with _progress("reading dead letters", args.json) as progress:
        letters = asyncio.run(dlq.read_dead_letters(bootstrap, topics, flt, progress=progress))
    if args.action == "list":
        if args.limit is not None:
            letters = letters[-args.limit :] if args.limit > 0 else []
        if args.json:
            print(json.dumps([d.as_json() for d in letters], ensure_ascii=False))
        elif letters:
            _table(letters)
        else:
            print(f"no dead letters match (read {', '.join(topics)})")
        return EXIT_OK
    if args.action == "show":
        return _show(args, letters)
    return _act(args, cat, bootstrap, letters)


def _show(args: Args, letters: list[DeadLetter]) -> int:
    which = args.which
    found = [
        d
        for d in letters
        if f"{d.topic}:{d.partition}:{d.offset}" == which or which in (d.send_key, d.inbound_id)
    ]
    if not found:
        print(f"botmesh dlq show: no dead letter {which!r}", file=sys.stderr)
        return EXIT_REFUSED
    if args.json:
        print(json.dumps([d.as_json() for d in found], ensure_ascii=False))
        return EXIT_OK
    for d in found:
        print(f"{d.topic}:{d.partition}:{d.offset}  key={d.key!r}")
        for k, v in d.headers.items():
            print(f"  {k}: {v}")
        body = d.body()
        text = json.dumps(body, indent=2, ensure_ascii=False) if not isinstance(body, str) else body
        print(text if body is not None else f"<{len(d.value)} bytes, not UTF-8>")
    return EXIT_OK


def _act(args: Args, cat: Catalog, bootstrap: str, letters: list[DeadLetter]) -> int:
    from botmesh.streams.ops import dlq

    with _progress(f"waiting for the owners ({args.action})", args.json) as progress:
        report = asyncio.run(
            dlq.act(
                bootstrap,
                cat,
                args.action,
                letters,
                dry_run=args.dry_run,
                wait_s=args.wait,
                progress=progress,
            )
        )
    _say(args, report.results, report.summary)
    if report.nothing:
        return EXIT_REFUSED
    if report.unanswered:
        return EXIT_NO_ANSWER
    return EXIT_OK if report.complete else EXIT_REFUSED


def _say(args: Args, report: list[dict[str, Any]], summary: str) -> None:
    if args.json:
        print(json.dumps({"summary": summary, "results": report}, ensure_ascii=False))
        return
    for r in report:
        extra = "".join(f" {k}={r[k]}" for k in ("state", "worker") if r.get(k) not in (None, ""))
        detail = f" ({r['detail']})" if r.get("detail") else ""
        print(f"{r['outcome']:>14}  {r['target']}  chat {r['chat_id']}{extra}{detail}")
    print(summary)


def run_flows(args: Args, cat: Catalog, bootstrap: str) -> int:
    """Ask each chat's owner to restart or drop its flow (``<prefix>.control``)."""
    from botmesh.streams.ops import dlq
    from botmesh.topics.control import ControlRequest

    action: Literal["restart_flow", "drop_flow"] = (
        "restart_flow" if args.action == "restart" else "drop_flow"
    )
    chats = list(dict.fromkeys(c.strip() for c in args.chat_id))
    if not all(chats):
        print(f"botmesh flows {args.action}: --chat-id must not be empty", file=sys.stderr)
        return EXIT_USAGE
    by = "botmesh-cli flows"
    requests = [
        ControlRequest(id=uuid.uuid4().hex, chat_id=c, action=action, target=c, by=by)
        for c in chats
    ]
    try:
        with _progress(f"waiting for the owners ({args.action})", args.json) as progress:
            answers = asyncio.run(
                dlq.ask_owners(bootstrap, cat, requests, wait_s=args.wait, progress=progress)
            )
    except (ConnectionError, LookupError) as exc:
        print(f"botmesh flows {args.action}: {exc}", file=sys.stderr)
        return EXIT_UNREACHABLE
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
    done = sum(r["outcome"] == "done" for r in report)
    _say(args, report, f"flows {args.action}: {done} of {len(report)} done")
    if any(r["outcome"] == "no answer" for r in report):
        return EXIT_NO_ANSWER
    return EXIT_OK if done == len(report) else EXIT_REFUSED
