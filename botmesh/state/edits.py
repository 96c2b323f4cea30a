"""Edits and deletes of a sent send, by its key.

``ctx.edit(key, text)`` and ``ctx.delete(key)`` address a send the bot made, by its
idempotency key; the channel's message id is the one its journal recorded (never one the
bot keeps by itself). Each is journaled as a send is, under a key of its own (in a handler
``<inbound id>:<n>``, the n-th send or change of the message), so that:

- a replayed handler's edit is answered from the journal: the channel is called once;
- it is retried, dead-lettered, resolved after a crash and ordered in its chat as a send
  is. An edit or a delete left in flight by a crash is made again (the same change twice
  is harmless; a message already deleted is no error), never marked unknown.

Its records are outbox records with ``op`` (``edit``, ``delete``) and ``target`` (the
message id of the send's part they change), one per part of the send: an edit's text is
split to the channel's limit as a send's is, and part ``n`` of the edit changes part ``n``
of the send; a send of more parts than the edit needs has its last parts deleted. The
message log and the message-id index (``botmesh.state.statuses``) keep the send, not its
changes.

Refused before anything is journaled, with a ``RecordStateError`` that says why: a key
that was never journaled, a send still pending or in flight, one that did not go out
(dead, unknown, cancelled), or one that went out as its fallback; with an
``UnsupportedContentError``: a channel whose API cannot edit (or delete); with a
``ValueError``: an edit whose text needs more messages than the send had.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from botmesh.state.common import Common
from botmesh.state.errors import RecordStateError, SendError, UnsupportedContentError
from botmesh.state.fallback import Route
from botmesh.state.keys import part_key
from botmesh.state.messages import Outbound, OutboxState, SendResult
from botmesh.state.outbox import Plan
from botmesh.state.ports import Deletes, Edits, Provider
from botmesh.state.records import Json
from botmesh.state.splitter import split_text, unit_of

__all__ = ["Change", "change_message", "plan_change"]

#: What a change does.
Change = Literal["edit", "delete"]

_WHY: dict[str | None, str] = {
    OutboxState.PENDING: "it has not gone out yet (pending or in flight): wait for its receipt",
    OutboxState.FAILED: "it has not gone out yet (waiting for a retry): wait for its receipt",
    OutboxState.DEAD: "it never went out (dead)",
    OutboxState.UNKNOWN: "its outcome is unknown (a crash): the channel's message id was lost",
    OutboxState.CANCELLED: "it was cancelled and never went out",
}


async def change_message(provider: Provider, route: Route) -> SendResult:
    """Make the change ``route`` names (``op``, ``target``) through ``provider``."""
    target = str(route.target)
    if route.op == "edit":
        if not isinstance(provider, Edits):
            raise _unsupported(provider, "edit")
        return await provider.edit(route.message, target)
    if not isinstance(provider, Deletes):
        raise _unsupported(provider, "delete")
    await provider.delete(route.message.chat_id, target)
    return SendResult(target)


def _unsupported(provider: Provider, what: str) -> SendError:
    return UnsupportedContentError(
        f"{provider.name}: the channel's API cannot {what} a message it accepted "
        "(docs/delivery-outcomes.md lists the channels that can)"
    )


def check_capable(provider: Provider, op: Change) -> None:
    """Refuse a change the channel cannot make, before anything is journaled."""
    if not isinstance(provider, Edits if op == "edit" else Deletes):
        raise _unsupported(provider, op)


async def plan_change(
    common: Common,
    provider: Provider,
    key: str,
    op: Change,
    *,
    text: str | None = None,
    options: Mapping[str, Any] | None = None,
) -> tuple[Outbound, Plan]:
    """The message and the plan of an edit (``text``) or a delete of the send ``key``,
    whose parts' message ids the journal recorded."""
    check_capable(provider, op)
    sent = await _sent_parts(common, key)
    chat = str(sent[0]["payload"]["chat_id"])
    targets = [str(v["message_id"]) for v in sent]
    opts = dict(options or {})
    texts: list[str | None] = []
    if op == "edit":
        if not isinstance(text, str) or not text:
            raise ValueError(f"edit({key!r}, text): the new text must be a non-empty string")
        texts = list(split_text(text, provider.text_limit, unit_of(provider)))
        if len(texts) > len(targets):
            raise ValueError(
                f"the new text of {key!r} needs {len(texts)} messages on {provider.name} "
                f"(at most {provider.text_limit} characters each) and the send went out as "
                f"{len(targets)}: shorten it, or send it anew"
            )
    plan = Plan(chat, total=len(targets))
    for i, target in enumerate(targets):
        if i < len(texts):
            payload: Json = {"chat_id": chat, "text": texts[i]}
            if opts:
                payload["options"] = opts
            plan.parts.append(Outbound(chat, texts[i], options=opts))
            plan.changes.append({"op": "edit", "target": target})
        else:
            payload = {"chat_id": chat}
            plan.parts.append(Outbound(chat))
            plan.changes.append({"op": "delete", "target": target})
        plan.payloads.append(payload)
    return Outbound(chat, text, options=opts), plan


async def _sent_parts(common: Common, key: str) -> list[Json]:
    """The records of every part of the send ``key``, each sent with its message id."""
    prefix = common.keys.outbox
    first = await common.kv.get(prefix + key)
    if first is None:
        raise RecordStateError(
            key, None, "no send was journaled under this key (or it was purged or erased)"
        )
    parts = int(first.value.get("parts", 1))
    keys = [prefix + part_key(key, n) for n in range(1, parts + 1)]
    got = await common.kv.get_many(keys)
    values = [got[k].value for k in keys if k in got]
    if len(values) < parts:
        raise RecordStateError(key, None, "a part of this send is no longer in the journal")
    for value in values:
        _check_sent(key, value)
    return values


def _check_sent(key: str, value: Json) -> None:
    state = value.get("state")
    if value.get("op"):
        raise RecordStateError(key, state, "this is an edit or a delete, not a send")
    spec = value.get("fallback")
    if isinstance(spec, dict) and spec.get("used"):
        raise RecordStateError(
            key, state, f"it went out as its fallback ({spec.get('key')}), not as itself"
        )
    if state != OutboxState.SENT or value.get("inflight"):
        raise RecordStateError(key, state, _WHY.get(state, "it has not gone out"))
    if not value.get("message_id"):
        raise RecordStateError(key, state, "the channel gave no message id for it")
