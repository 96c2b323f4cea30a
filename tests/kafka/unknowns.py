"""What kills may leave ``unknown`` in the Kafka kill tests, and no more
(``check_unknown_sends``), with the provider calls it is checked against: the test bot's
file provider's (``file_callers``) or the recorder's (``recorder_callers``)."""

from __future__ import annotations

import collections
import re
from collections.abc import Sequence
from typing import Any

__all__ = ["check_unknown_sends", "file_callers", "recorder_callers"]


#: The test bot's reply (``echo <inbound id>: <text>``): its send's key is ``<id>:1``.
_REPLY = re.compile(r"^echo (?P<id>\S+): ")
#: The file provider's message id, ``file-<pid>-<n>`` (``tests.kafka.bot.FileProvider``).
_FILE_MESSAGE_ID = re.compile(r"^file-(?P<pid>\d+)-\d+$")


def file_callers(calls: Sequence[dict[str, Any]]) -> dict[str, set[int]]:
    """Send key -> the worker processes that called the file provider with it."""
    found: dict[str, set[int]] = collections.defaultdict(set)
    for call in calls:
        reply, mid = _REPLY.match(call["text"]), _FILE_MESSAGE_ID.match(call["message_id"])
        assert reply is not None and mid is not None, call
        found[f"{reply['id']}:1"].add(int(mid["pid"]))
    return found


def recorder_callers(calls: Sequence[Any]) -> dict[str, set[int]]:
    """Send key -> the worker processes whose calls the recorder took
    (``tests.kafka.recorder.Call``)."""
    found: dict[str, set[int]] = collections.defaultdict(set)
    for call in calls:
        assert call.inbound_id is not None, call
        found[f"{call.inbound_id}:1"].add(call.pid)
    return found


def check_unknown_sends(
    outbox: dict[str, dict[str, Any]],
    callers: dict[str, set[int]],
    killed: Sequence[int],
    *,
    chats: int,
) -> str:
    """Every send the journal settled ``unknown`` is one a kill left in flight, and no more
    are (a worker that marked pending sends ``unknown`` after a restart would lose them
    silently; "not lost" alone lets that pass). A send ends ``unknown`` (the bot's
    ``on_ambiguous="skip"``) when its claim was durable and its outcome was not when its
    worker died:

    - called: the provider took it from a process that was then killed (its ``sent`` mark
      goes to the changelog with the batch's checkpoint). One that the provider took only
      from processes never killed fails the test;
    - never called: claimed, and the process killed before its call reached the provider.
      A chat has one turn at a time, so each kill leaves at most one such send a chat: at
      most ``len(killed) * chats`` in all.

    ``callers``: send key -> the pids the provider took it from (``file_callers``,
    ``recorder_callers``). Returns what it counted, for the test's report."""
    unknown = sorted(k for k, v in outbox.items() if v["state"] == "unknown")
    dead = set(killed)
    survivors = [
        (k, sorted(callers[k])) for k in unknown if callers.get(k) and not callers[k] & dead
    ]
    assert survivors == [], (
        f"{len(survivors)} sends left unknown that only processes never killed called "
        f"(killed: {sorted(dead)}), e.g. {survivors[:5]}"
    )
    uncalled = [k for k in unknown if not callers.get(k)]
    bound = len(dead) * chats
    assert len(uncalled) <= bound, (
        f"{len(uncalled)} sends left unknown that no provider call shows, more than the "
        f"{len(dead)} kills x {chats} chats could leave claimed and not yet called (pending "
        f"sends marked unknown after a restart?), e.g. {uncalled[:5]}"
    )
    return (
        f"{len(unknown)} unknown ({len(unknown) - len(uncalled)} called by a killed run, "
        f"{len(uncalled)} never called, at most {bound})"
    )
