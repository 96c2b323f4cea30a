"""``botmesh dlq list|show|retry|replay|discard``: the dead letters, for an operator.

``list`` and ``show`` read the dead-letter topics; ``retry``, ``replay`` and ``discard`` ask
each matching letter's chat owner to act on it (``botmesh.streams.ops.dlq.act``). Exit
statuses (``botmesh._cli.exit``): 0 done; 1 refused (nothing matched, or an owner refused
an action: the output says why); 2 bad input; 3 Kafka unreachable or a topic missing; 4 no
answer from the chat's owner within ``--wait`` seconds (no worker running?). The progress
bar and the owners' report (``progress``, ``say``) serve ``botmesh flows`` too.
"""

# Kafka code loads only when a dlq command runs (import cost ~1 s):
# asyncio too, so that --help and shell completion load fast:
# ruff: noqa: PLC0415

from __future__ import annotations

import datetime as dt
import json
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, TypeVar

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
from botmesh.topics.dead_letters import DeadLetter

if TYPE_CHECKING:
    from botmesh.streams.ops.dlq import Filter

__all__ = ["dlq", "progress", "say"]

F = TypeVar("F", bound=Callable[..., Any])
#: The dead-letter topics (``botmesh.streams.ops.dlq.KINDS``): all three unless ``--kind``.
_ALL_KINDS = ("inbound", "outbox", "requests")
_KINDS = click.Choice(_ALL_KINDS)


@contextmanager
def progress(label: str, quiet: bool) -> Iterator[Callable[[int, int], None]]:
    """A rich progress bar on stderr (none with --json or when stderr is not a terminal)."""
    if quiet or not sys.stderr.isatty():
        yield lambda done, total: None
        return
    from rich.console import Console
    from rich.progress import Progress

    with Progress(console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task(label, total=None)
        yield lambda done, total: bar.update(task, completed=done, total=total or None)


def say(report: list[dict[str, Any]], summary: str, as_json: bool) -> None:
    """The owners' answers, one line each, and the summary (``--json``: one document)."""
    if as_json:
        print(json.dumps({"summary": summary, "results": report}, ensure_ascii=False))
        return
    for r in report:
        extra = "".join(f" {k}={r[k]}" for k in ("state", "worker") if r.get(k) not in (None, ""))
        detail = f" ({r['detail']})" if r.get("detail") else ""
        print(f"{r['outcome']:>14}  {r['target']}  chat {r['chat_id']}{extra}{detail}")
    print(summary)


def _dead_letter_filters(f: F) -> F:
    """The options that choose dead letters, passed on to ``_filter``."""
    for option in reversed(
        [
            click.option("--chat-id", help="only this chat"),
            click.option("--key", help="only this send key (outbox) or inbound id (inbound)"),
            click.option("--reason", help="only this reason (send-refused, retries-exhausted...)"),
            click.option("--since", help="dead at or after (ISO 8601 or Unix seconds)"),
            click.option("--until", help="dead before (ISO 8601 or Unix seconds)"),
        ]
    ):
        f = option(f)
    return f


def _filter(
    chat_id: str | None, key: str | None, reason: str | None, since: str | None, until: str | None
) -> Filter:
    from botmesh.streams.ops import dlq as ops

    return ops.Filter(
        chat=chat_id,
        key=key,
        reason=reason,
        since=ops.parse_when(since, "--since"),
        until=ops.parse_when(until, "--until"),
    )


def _guarded(action: str, work: Callable[[], int]) -> int:
    """``work()``'s status; no broker or a topic missing: 3, bad input: 2 (said on stderr)."""
    try:
        return work()
    except (ConnectionError, LookupError) as exc:
        print(f"botmesh dlq {action}: {exc}", file=sys.stderr)
        return Exit.UNREACHABLE
    except ValueError as exc:
        print(f"botmesh dlq {action}: {exc}", file=sys.stderr)
        return Exit.USAGE


def _read(
    servers: str, cat: Catalog, kinds: Sequence[str], flt: Filter | None, quiet: bool
) -> tuple[list[str], list[DeadLetter]]:
    """The dead-letter topics of ``kinds`` and their letters that ``flt`` matches."""
    import asyncio

    from botmesh.streams.ops import dlq as ops

    topics = [ops.dlq_topic(cat, k) for k in kinds]
    with progress("reading dead letters", quiet) as shown:
        letters = asyncio.run(
            ops.read_dead_letters(servers, topics, flt or ops.Filter(), progress=shown)
        )
    return topics, letters


@click.group("dlq", context_settings=CONTEXT)
def dlq() -> None:
    """List, show, retry, replay or discard dead letters."""


@dlq.command("list", context_settings=CONTEXT)
@connection_options
@json_option
@click.option("--kind", type=_KINDS, help="one DLQ  [default: all three]")
@click.option("--limit", type=int, help="at most N (the newest)")
@_dead_letter_filters
def list_(
    *,
    prefix: str,
    bootstrap: str,
    as_json: bool,
    kind: str | None,
    limit: int | None,
    chat_id: str | None,
    key: str | None,
    reason: str | None,
    since: str | None,
    until: str | None,
) -> int:
    """The dead letters that match (all three DLQs unless --kind)."""
    cat, servers = catalog_of(prefix), bootstrap_of(bootstrap)

    def work() -> int:
        kinds = [kind] if kind else list(_ALL_KINDS)
        flt = _filter(chat_id, key, reason, since, until)
        topics, letters = _read(servers, cat, kinds, flt, as_json)
        if limit is not None:
            letters = letters[-limit:] if limit > 0 else []
        if as_json:
            print(json.dumps([d.as_json() for d in letters], ensure_ascii=False))
        elif letters:
            _table(letters)
        else:
            print(f"no dead letters match (read {', '.join(topics)})")
        return Exit.OK

    return _guarded("list", work)


def _table(letters: Sequence[DeadLetter]) -> None:
    """The letters of ``dlq list``, a row each."""
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


@dlq.command("show", context_settings=CONTEXT)
@connection_options
@json_option
@click.argument("which")
@click.option("--kind", type=_KINDS, help="one DLQ  [default: all three]")
def show(*, prefix: str, bootstrap: str, as_json: bool, which: str, kind: str | None) -> int:
    """One dead letter in full: WHICH is topic:partition:offset, a send key or an inbound
    id."""
    cat, servers = catalog_of(prefix), bootstrap_of(bootstrap)

    def work() -> int:
        kinds = [kind] if kind else list(_ALL_KINDS)
        _, letters = _read(servers, cat, kinds, None, as_json)
        return _show(which, letters, as_json)

    return _guarded("show", work)


def _show(which: str, letters: list[DeadLetter], as_json: bool) -> int:
    """The letters ``which`` names, in full (headers and body); none: refused."""
    found = [
        d
        for d in letters
        if f"{d.topic}:{d.partition}:{d.offset}" == which or which in (d.send_key, d.inbound_id)
    ]
    if not found:
        print(f"botmesh dlq show: no dead letter {which!r}", file=sys.stderr)
        return Exit.REFUSED
    if as_json:
        print(json.dumps([d.as_json() for d in found], ensure_ascii=False))
        return Exit.OK
    for d in found:
        print(f"{d.topic}:{d.partition}:{d.offset}  key={d.key!r}")
        for k, v in d.headers.items():
            print(f"  {k}: {v}")
        body = d.body()
        text = json.dumps(body, indent=2, ensure_ascii=False) if not isinstance(body, str) else body
        print(text if body is not None else f"<{len(d.value)} bytes, not UTF-8>")
    return Exit.OK


def _action(name: str, kind: str, text: str) -> None:
    """``botmesh dlq NAME``: the matching dead letters of ``kind``, acted on by their
    owners."""

    @dlq.command(name, context_settings=CONTEXT, help=text)
    @connection_options
    @json_option
    @_dead_letter_filters
    @click.option("--dry-run", is_flag=True, help="say what would be done; do nothing")
    @wait_option
    def action(
        *,
        prefix: str,
        bootstrap: str,
        as_json: bool,
        chat_id: str | None,
        key: str | None,
        reason: str | None,
        since: str | None,
        until: str | None,
        dry_run: bool,
        wait: float,
    ) -> int:
        cat, servers = catalog_of(prefix), bootstrap_of(bootstrap)

        def work() -> int:
            flt = _filter(chat_id, key, reason, since, until)
            _, letters = _read(servers, cat, [kind], flt, as_json)
            return _act(name, servers, cat, letters, dry_run=dry_run, wait=wait, as_json=as_json)

        return _guarded(name, work)


def _act(
    name: str,
    servers: str,
    cat: Catalog,
    letters: list[DeadLetter],
    *,
    dry_run: bool,
    wait: float,
    as_json: bool,
) -> int:
    """The owners' answers to ``name`` (retry, replay, discard) of ``letters``, said, and the
    exit status: nothing to act on or a refusal 1, an owner that did not answer 4."""
    import asyncio

    from botmesh.streams.ops import dlq as ops

    with progress(f"waiting for the owners ({name})", as_json) as shown:
        report = asyncio.run(
            ops.act(servers, cat, name, letters, dry_run=dry_run, wait_s=wait, progress=shown)
        )
    say(report.results, report.summary, as_json)
    if report.nothing:
        return Exit.REFUSED
    if report.unanswered:
        return Exit.NO_ANSWER
    return Exit.OK if report.complete else Exit.REFUSED


_action("retry", "outbox", "Send the matching dead sends (outbox.dlq) again, through their owners.")
_action(
    "replay", "inbound", "Run the matching dead inbounds (inbound.dlq) again, through their owners."
)
_action("discard", "outbox", "Make the owners forget the matching dead sends (outbox.dlq).")
