"""``botmesh send``: a send from outside a handler, as one send request on
``<prefix>.requests`` (acks=all). The worker that owns the chat journals and delivers it in
order with the chat's other sends. It prints the request id and the send's idempotency key
(``--key``, else ``req:<request id>``): run it again with the same ``--id`` or ``--key`` and
the bot still sends once. ``--at``/``--delay`` schedule it, ``--deliver-within``/
``--expires-at`` give it a deadline.

``botmesh send edit --key K --chat-id C --text T`` and ``botmesh send delete --key K
--chat-id C``: the chat's owner edits or deletes the send ``K`` (a request with ``edit`` or
``delete``), once; it prints the request id.

``botmesh send cancel --key K --chat-id C``: the chat's owner cancels the send ``K`` before
it goes out (a ``cancel`` operator action on ``<prefix>.control``; exit statuses as
``botmesh flows``': 0 cancelled, 1 refused, 4 no answer within ``--wait``)."""

# the Kafka producer loads only when the command runs (import cost ~1 s):
# asyncio too, so that --help and shell completion load fast:
# ruff: noqa: PLC0415

from __future__ import annotations

import json
import uuid

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

__all__ = ["channel_options", "send"]


@click.group("send", context_settings=CONTEXT, invoke_without_command=True)
@connection_options
@click.option("--chat-id", help="the chat to send to  [required]")
@click.option("--text", help="the text to send (--text or --media-url is required)")
@click.option("--media-url", help="a media URL to send with the text, or instead of it")
@click.option("--media-mime", help="the media's MIME type, e.g. image/png")
@click.option("--key", help="the send's idempotency key, no '#'  [default: req:<request id>]")
@click.option(
    "--id", "request_id", help="the request id; the same id again sends once  [default: random]"
)
@click.option(
    "--option",
    multiple=True,
    metavar="NAME=VALUE",
    help="a channel option passed to the provider (repeatable; VALUE is JSON if it parses)",
)
@timing_options
@json_option
@click.pass_context
def send(
    ctx: click.Context,
    *,
    prefix: str,
    bootstrap: str,
    chat_id: str | None,
    text: str | None,
    media_url: str | None,
    media_mime: str | None,
    key: str | None,
    request_id: str | None,
    option: tuple[str, ...],
    at_: str | None,
    delay: str | None,
    deliver_within: str | None,
    expires_at: str | None,
    as_json: bool,
) -> int:
    """Ask the bot to send to a chat (a request on <prefix>.requests); `send cancel` cancels
    one before it goes out."""
    import asyncio

    from botmesh.state.messages import Media
    from botmesh.streams.ops.tools import request_send
    from botmesh.topics.records import REQUEST_KEY_PREFIX

    if ctx.invoked_subcommand is not None:
        return Exit.OK
    if not chat_id:
        raise click.UsageError("Missing option '--chat-id'.", ctx)
    cat, servers = catalog_of(prefix), bootstrap_of(bootstrap)
    if text is None and media_url is None:
        raise ValueError("give --text, --media-url, or both")
    at, expires = times_of(at_, delay, deliver_within, expires_at)
    media = Media(url=media_url, mime=media_mime) if media_url else None
    sent_id = asyncio.run(
        request_send(
            servers,
            cat.prefix,
            chat_id,
            text,
            key=key,
            media=media,
            options=channel_options(list(option)),
            request_id=request_id,
            at=at,
            expires_at=expires,
        )
    )
    send_key = key if key is not None else REQUEST_KEY_PREFIX + sent_id
    if as_json:
        where = {"chat_id": chat_id, "topic": cat.requests}
        print(json.dumps({"request_id": sent_id, "key": send_key, **where}))
        return 0
    print(f"request {sent_id} key {send_key} (chat {chat_id}, on {cat.requests})")
    return 0


def channel_options(pairs: list[str]) -> dict[str, object]:
    """The channel options of ``--option NAME=VALUE`` (VALUE as JSON when it parses)."""
    out: dict[str, object] = {}
    for pair in pairs:
        name, sep, raw = pair.partition("=")
        if not sep or not name:
            raise ValueError(f"--option {pair!r}: expected NAME=VALUE, e.g. parse_mode=HTML")
        try:
            out[name] = json.loads(raw)
        except ValueError:
            out[name] = raw
    return out


def _change(
    prefix: str, bootstrap: str, chat_id: str, key: str, *, text: str | None, as_json: bool
) -> int:
    """Produce an edit (``text``) or a delete request of the send ``key``."""
    import asyncio

    from botmesh.state.keys import check_explicit
    from botmesh.streams.ops.tools import request_send

    cat, servers = catalog_of(prefix), bootstrap_of(bootstrap)
    target = check_explicit(key)
    what = "edit" if text is not None else "delete"
    sent_id = asyncio.run(
        request_send(
            servers,
            cat.prefix,
            chat_id,
            text,
            edit=target if text is not None else None,
            delete=target if text is None else None,
        )
    )
    if as_json:
        print(json.dumps({"request_id": sent_id, what: target, "chat_id": chat_id}))
    else:
        print(f"request {sent_id}: {what} {target} (chat {chat_id}, on {cat.requests})")
    return Exit.OK


@send.command("edit", context_settings=CONTEXT)
@connection_options
@click.option("--key", required=True, help="the idempotency key of the send to edit")
@click.option("--chat-id", required=True, help="the chat the send went to (its owner edits it)")
@click.option("--text", required=True, help="the new text")
@json_option
def edit(*, prefix: str, bootstrap: str, key: str, chat_id: str, text: str, as_json: bool) -> int:
    """Edit a send that went out, by its key (on channels whose API can edit)."""
    return _change(prefix, bootstrap, chat_id, key, text=text, as_json=as_json)


@send.command("delete", context_settings=CONTEXT)
@connection_options
@click.option("--key", required=True, help="the idempotency key of the send to delete")
@click.option("--chat-id", required=True, help="the chat the send went to (its owner deletes it)")
@json_option
def delete(*, prefix: str, bootstrap: str, key: str, chat_id: str, as_json: bool) -> int:
    """Delete a send that went out, by its key (on channels whose API can delete)."""
    return _change(prefix, bootstrap, chat_id, key, text=None, as_json=as_json)


@send.command("cancel", context_settings=CONTEXT)
@connection_options
@click.option("--key", required=True, help="the idempotency key of the send to cancel")
@click.option("--chat-id", required=True, help="the chat the send goes to (its owner cancels it)")
@wait_option
@json_option
def cancel(
    *, prefix: str, bootstrap: str, key: str, chat_id: str, wait: float, as_json: bool
) -> int:
    """Cancel a send before it goes out (a scheduled send, one waiting its turn or a retry);
    a send not journaled yet is cancelled ahead of its request."""
    import asyncio

    from botmesh.state.keys import check_explicit
    from botmesh.streams.ops import dlq as ops
    from botmesh.topics.control import ControlRequest

    cat, servers = catalog_of(prefix), bootstrap_of(bootstrap)
    request = ControlRequest(
        id=uuid.uuid4().hex,
        chat_id=chat_id,
        action="cancel",
        target=check_explicit(key),
        by="botmesh-cli send cancel",
    )
    with progress("waiting for the chat's owner (cancel)", as_json) as shown:
        answers = asyncio.run(ops.ask_owners(servers, cat, [request], wait_s=wait, progress=shown))
    answer = answers.get(request.id)
    report = {"target": key, "chat_id": chat_id, "outcome": "no answer"}
    if answer is not None:
        report.update(outcome=answer.outcome, state=answer.state or "", detail=answer.detail)
        report["worker"] = answer.instance
    say([report], f"send cancel: {report['outcome']}", as_json)
    if answer is None:
        return Exit.NO_ANSWER
    return Exit.OK if answer.outcome == "done" else Exit.REFUSED
