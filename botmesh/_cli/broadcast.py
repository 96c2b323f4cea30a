"""``botmesh broadcast``: one send to many chats, as a campaign, on Kafka.

The recipients (one chat id a line, from ``--recipients FILE`` or ``-`` for stdin; blank
lines and lines starting with ``#`` skipped) each get one send request on
``<prefix>.requests``, keyed ``campaign:<campaign>:<chat id>``
(``botmesh.streams.ops.campaigns``): run it again after a crash or a timeout and no
recipient gets it twice. Then it follows the receipts on ``<prefix>.sent`` with a progress
bar until every recipient's send settled (``--no-follow``: it returns once produced).
Exit statuses: 0 every recipient settled (or produced, with ``--no-follow``), 2 bad input,
3 Kafka unreachable, 4 recipients still unsettled after ``--idle`` seconds without a receipt.

``botmesh broadcast cancel --campaign C --recipients FILE``: each recipient's owner cancels
its send if it has not gone out (a ``cancel`` operator action each); a recipient whose
request has not reached its owner yet is cancelled ahead. Exit statuses as ``botmesh
flows``'."""

# the Kafka clients load only when the command runs (import cost ~1 s):
# ruff: noqa: PLC0415

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import click

from botmesh._cli.dlq import progress, say
from botmesh._cli.exit import Exit
from botmesh._cli.options import (
    CONTEXT,
    bootstrap_of,
    catalog_of,
    connection_options,
    json_option,
    times_of,
    timing_options,
    wait_option,
)
from botmesh._cli.send import channel_options

__all__ = ["broadcast"]


def _recipients(path: str) -> list[str]:
    """The chat ids of a recipients file (``-``: stdin), each once, in order."""
    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ValueError(f"--recipients {path!r}: {exc.strerror or exc}") from None
    chats = (line.strip() for line in text.splitlines())
    found = list(dict.fromkeys(c for c in chats if c and not c.startswith("#")))
    if not found:
        raise ValueError(f"--recipients {path!r} names no chat id (one a line)")
    return found


@click.group("broadcast", context_settings=CONTEXT, invoke_without_command=True)
@connection_options
@click.option("--campaign", help="the campaign id (no ':' or '#'); the same id again sends once")
@click.option(
    "--recipients",
    type=click.Path(dir_okay=False, allow_dash=True),
    help="a file of chat ids, one a line ('-': stdin)",
)
@click.option("--text", help="the text to send (--text or --media-url is required)")
@click.option("--media-url", help="a media URL to send with the text, or instead of it")
@click.option("--media-mime", help="the media's MIME type, e.g. image/png")
@click.option(
    "--option",
    multiple=True,
    metavar="NAME=VALUE",
    help="a channel option passed to the provider (repeatable; VALUE is JSON if it parses)",
)
@timing_options
@click.option(
    "--follow/--no-follow", default=True, help="follow the receipts until every send settled"
)
@click.option(
    "--idle", type=float, default=120.0, help="stop following after SECONDS without a receipt"
)
@json_option
@click.pass_context
def broadcast(
    ctx: click.Context,
    *,
    prefix: str,
    bootstrap: str,
    campaign: str | None,
    recipients: str | None,
    text: str | None,
    media_url: str | None,
    media_mime: str | None,
    option: tuple[str, ...],
    at_: str | None,
    delay: str | None,
    deliver_within: str | None,
    expires_at: str | None,
    follow: bool,
    idle: float,
    as_json: bool,
) -> int:
    """Send to many chats as one campaign (one request per recipient); `broadcast cancel`
    cancels what has not gone out."""
    import asyncio

    from botmesh.state.messages import Media
    from botmesh.streams.ops import campaigns as ops

    if ctx.invoked_subcommand is not None:
        return Exit.OK
    if not campaign or recipients is None:
        raise click.UsageError("give --campaign and --recipients", ctx)
    if text is None and media_url is None:
        raise ValueError("give --text, --media-url, or both")
    chats = _recipients(recipients)
    at, expires = times_of(at_, delay, deliver_within, expires_at)
    cat, servers = catalog_of(prefix), bootstrap_of(bootstrap)
    media = Media(url=media_url, mime=media_mime) if media_url else None
    options = channel_options(list(option))
    requests = ops.campaign_requests(
        campaign, chats, text, media=media, options=options, at=at, expires_at=expires
    )
    took = asyncio.run(ops.produce_campaign(servers, cat, requests))
    if not as_json:
        print(f"campaign {campaign}: {len(requests)} requests on {cat.requests} ({took:.1f}s)")
    states: dict[str, str] = {}
    if follow:
        with progress(f"campaign {campaign}", as_json) as shown:
            states = asyncio.run(
                ops.follow_campaign(
                    servers,
                    cat,
                    campaign,
                    set(chats),
                    seen=lambda s: shown(len(s), len(chats)),
                    idle=idle,
                )
            )
    return _summary(campaign, len(chats), states, follow=follow, as_json=as_json)


def _summary(
    campaign: str, total: int, states: dict[str, str], *, follow: bool, as_json: bool
) -> int:
    counts = Counter(states.values())
    unsettled = total - len(states) if follow else None
    if as_json:
        doc: dict[str, Any] = {"campaign": campaign, "recipients": total, "states": counts}
        doc["unsettled"] = unsettled
        print(json.dumps(doc))
    elif follow:
        parts = ", ".join(f"{n} {state}" for state, n in sorted(counts.items())) or "none"
        print(f"campaign {campaign}: {total} recipients: {parts}; {unsettled} not settled")
    if unsettled:
        print(
            f"botmesh broadcast: {unsettled} recipients have no settled send yet; follow on "
            "with `botmesh receipts` or run the command again (it sends no one twice)",
            file=sys.stderr,
        )
        return Exit.NO_ANSWER
    return Exit.OK


@broadcast.command("cancel", context_settings=CONTEXT)
@connection_options
@click.option("--campaign", required=True, help="the campaign id")
@click.option(
    "--recipients",
    type=click.Path(dir_okay=False, allow_dash=True),
    required=True,
    help="the campaign's chat ids, one a line ('-': stdin)",
)
@wait_option
@json_option
def cancel(
    *, prefix: str, bootstrap: str, campaign: str, recipients: str, wait: float, as_json: bool
) -> int:
    """Cancel a campaign's sends that have not gone out (each recipient's owner does)."""
    import asyncio

    from botmesh.streams.ops import campaigns as ops
    from botmesh.streams.ops import dlq

    cat, servers = catalog_of(prefix), bootstrap_of(bootstrap)
    requests = ops.cancel_requests(campaign, _recipients(recipients), "botmesh-cli broadcast")
    with progress(f"cancelling campaign {campaign}", as_json) as shown:
        answers = asyncio.run(dlq.ask_owners(servers, cat, requests, wait_s=wait, progress=shown))
    report: list[dict[str, Any]] = []
    for r in requests:
        answer = answers.get(r.id)
        line: dict[str, Any] = {"target": r.target, "chat_id": r.chat_id, "outcome": "no answer"}
        if answer is not None:
            line.update(outcome=answer.outcome, state=answer.state or "", detail=answer.detail)
        report.append(line)
    done = sum(r["outcome"] == "done" for r in report)
    say(report, f"broadcast cancel {campaign}: {done} of {len(report)} cancelled", as_json)
    if any(r["outcome"] == "no answer" for r in report):
        return Exit.NO_ANSWER
    return Exit.OK if done == len(report) else Exit.REFUSED
