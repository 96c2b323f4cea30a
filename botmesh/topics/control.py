"""Operator actions on the wire: requests on ``<prefix>.control`` and their results on
``<prefix>.control.results``.

An operator never writes the worker's journal behind its back: ``botmesh dlq retry`` (and
``replay``, ``discard``) produces a :class:`ControlRequest` keyed by the chat id, so it lands
on the partition of the chat's messages, and the worker that owns the chat carries it out
in the chat's order, through the journal (``botmesh.state.operations``). It answers with a
:class:`ControlResult` keyed by the request id.

===================  ===========================================================
``action``           what the owner does with ``target``
===================  ===========================================================
``retry_send``       sends the send ``target`` (its idempotency key) again, with a
                     fresh retry budget, when it is dead, failed or unknown; a send
                     recorded ``sent`` is refused (``outcome: "refused"``, its
                     ``state`` given) and nothing is sent
``replay_inbound``   runs the inbound ``target`` (its id) again with a fresh attempt
                     budget; its sends that went out are answered from the outbox
``discard``          forgets the send ``target``
``cancel``           cancels the send ``target`` before it goes out (a scheduled send, one
                     waiting its turn or a retry): settled ``cancelled``, never sent; a
                     key not journaled yet is cancelled ahead (its request, when it
                     comes, is answered ``cancelled``); a send that went out or is in
                     flight is refused
``restart_flow``     starts the chat's flow (``target``: the chat id) again from its
                     beginning under the worker's code (a checkpoint refused as
                     another version); refused when the chat has no flow checkpoint
``drop_flow``        ends the chat's active flow (``dropped``): its next message goes
                     to the handlers; refused when the flow ended already
``erase_chat``       deletes every journal record of the chat (``target``: the chat
                     id) once its sends in flight settled: tombstones on the
                     journal's changelog (``botmesh.state.erasure``); with
                     ``dry_run`` deletes nothing and says what would go. The result
                     carries the erasure's receipt (``erasure``); ``by`` is its note
===================  ===========================================================

A result's ``outcome`` is ``done``, ``refused`` (the record is not in a state the action
applies to, or is unknown: ``detail`` says which) or ``failed`` (the journal refused the
write; the request can be produced again). Pure data: no Kafka client.
"""

from __future__ import annotations

from typing import Literal

import msgspec

from botmesh.state.erasure import ErasureReceipt
from botmesh.state.errors import BadRecord, Reason

__all__ = [
    "ACTIONS",
    "ControlRequest",
    "ControlResult",
    "decode_control",
    "decode_result",
    "encode_control",
    "encode_result",
]

Action = Literal[
    "retry_send", "replay_inbound", "discard", "cancel", "restart_flow", "drop_flow", "erase_chat"
]
ACTIONS: tuple[str, ...] = (
    "retry_send",
    "replay_inbound",
    "discard",
    "cancel",
    "restart_flow",
    "drop_flow",
    "erase_chat",
)


class ControlRequest(msgspec.Struct, frozen=True, kw_only=True, tag_field="v", tag=1):
    """An operator's request, keyed by ``chat_id`` on ``<prefix>.control``."""

    id: str
    chat_id: str
    action: Action
    target: str
    #: Who asked (free text: a user name, ``botmesh-cli``), for the worker's log.
    by: str = ""
    #: ``erase_chat`` only: say what would be erased, erase nothing.
    dry_run: bool = False


class ControlResult(msgspec.Struct, frozen=True, kw_only=True, tag_field="v", tag=1):
    """The owner's answer, keyed by the request ``id`` on ``<prefix>.control.results``."""

    id: str
    chat_id: str
    action: str
    target: str
    outcome: Literal["done", "refused", "failed"]
    #: The record's state after the action (or the state that refused it).
    state: str | None = None
    detail: str = ""
    instance: str = ""
    ts: float = 0.0
    #: ``erase_chat``: the receipt of the erasure (no message text; the chat's dead records
    #: the journal held are listed in it, their copies on the dead-letter topics are not).
    erasure: ErasureReceipt | None = None


_requests = msgspec.json.Decoder(ControlRequest)
_results = msgspec.json.Decoder(ControlResult)
_encoder = msgspec.json.Encoder()


def encode_control(request: ControlRequest) -> bytes:
    return _encoder.encode(request)


def decode_control(raw: bytes | None) -> ControlRequest:
    """A control request; ``BadRecord`` (dead-lettered by the worker) when it is not one."""
    if not raw:
        raise BadRecord(Reason.EMPTY, "a control request needs a JSON value")
    try:
        request = _requests.decode(raw)
    except msgspec.DecodeError as exc:
        raise BadRecord(
            Reason.WRONG_TYPE,
            f"not a control request ({exc}); expected "
            '{"v": 1, "id", "chat_id", "action": "retry_send"|"replay_inbound"|"discard"|'
            '"cancel"|"restart_flow"|"drop_flow"|"erase_chat", "target"}',
        ) from exc
    if not request.id or not request.chat_id or not request.target:
        raise BadRecord(Reason.WRONG_TYPE, "a control request needs id, chat_id and target")
    return request


def encode_result(result: ControlResult) -> bytes:
    return _encoder.encode(result)


def decode_result(raw: bytes | None) -> ControlResult:
    return _results.decode(raw or b"")
