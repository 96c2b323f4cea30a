"""``botmesh send``: a send from outside a handler, as one send request on
``<prefix>.requests`` (acks=all). The worker that owns the chat journals and delivers it in
order with the chat's other sends. It prints the request id and the send's idempotency key
(``--key``, else ``req:<request id>``): run it again with the same ``--id`` or ``--key`` and
the bot still sends once."""

# the Kafka producer loads only when the command runs (import cost ~1 s):
# asyncio too, so that --help and shell completion load fast:
# ruff: noqa: PLC0415

from __future__ import annotations

import json

import click

from botmesh._cli.options import (
    CONTEXT,
    bootstrap_of,
    catalog_of,
    connection_options,
    json_option,
)

__all__ = ["send"]


@click.command("send", context_settings=CONTEXT)
@connection_options
@click.option("--chat-id", required=True, help="the chat to send to")
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
@json_option
def send(
    *,
    prefix: str,
    bootstrap: str,
    chat_id: str,
    text: str | None,
    media_url: str | None,
    media_mime: str | None,
    key: str | None,
    request_id: str | None,
    option: tuple[str, ...],
    as_json: bool,
) -> int:
    """Ask the bot to send to a chat (a request on <prefix>.requests)."""
    import asyncio

    from botmesh.state.messages import Media
    from botmesh.streams.ops.tools import request_send
    from botmesh.topics.records import REQUEST_KEY_PREFIX

    cat, servers = catalog_of(prefix), bootstrap_of(bootstrap)
    if text is None and media_url is None:
        raise ValueError("give --text, --media-url, or both")
    media = Media(url=media_url, mime=media_mime) if media_url else None
    sent_id = asyncio.run(
        request_send(
            servers,
            cat.prefix,
            chat_id,
            text,
            key=key,
            media=media,
            options=_options(list(option)),
            request_id=request_id,
        )
    )
    send_key = key if key is not None else REQUEST_KEY_PREFIX + sent_id
    if as_json:
        where = {"chat_id": chat_id, "topic": cat.requests}
        print(json.dumps({"request_id": sent_id, "key": send_key, **where}))
        return 0
    print(f"request {sent_id} key {send_key} (chat {chat_id}, on {cat.requests})")
    return 0


def _options(pairs: list[str]) -> dict[str, object]:
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
