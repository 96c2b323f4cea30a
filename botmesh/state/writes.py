"""The journal writes: every ``DurableKv.commit`` the engine makes carries one of these
labels, defined here once. Crash tests kill the bot before or after a labelled write
(``botmesh.testing.crashable``); logs name them.

The ambiguous window of a send is between ``outbox.journal`` / ``outbox.claim`` landing and
``outbox.mark_sent`` / ``outbox.mark_failed`` / ``outbox.mark_dead`` landing.
"""

from __future__ import annotations

from enum import StrEnum

__all__ = ["Write"]


class Write(StrEnum):
    """A labelled journal write (the ``label`` of ``DurableKv.commit``)."""

    #: A new inbound, journaled and claimed (before any handler).
    INBOX_JOURNAL = "inbox.journal"
    #: A replay (restart, expired lease, operator) takes the record.
    INBOX_CLAIM = "inbox.claim"
    #: The lease is extended while handlers run.
    INBOX_HEARTBEAT = "inbox.heartbeat"
    #: The handlers settled.
    INBOX_MARK_DONE = "inbox.mark_done"
    #: A failure before the handlers, retried after a backoff.
    INBOX_MARK_RETRY = "inbox.mark_retry"
    #: Max attempts charged: dead-lettered.
    INBOX_MARK_DEAD = "inbox.mark_dead"
    #: An operator's ``replay_inbound``.
    INBOX_REPLAY = "inbox.replay"
    #: An inline send, journaled in flight (about to call the provider).
    OUTBOX_JOURNAL = "outbox.journal"
    #: A send journaled for the sweeper (``enqueue``, or queued behind a deferred send).
    OUTBOX_ENQUEUE = "outbox.enqueue"
    #: A retry, a later part, or a sweeper delivery takes the record.
    OUTBOX_CLAIM = "outbox.claim"
    #: The lease is extended while the provider call runs.
    OUTBOX_HEARTBEAT = "outbox.heartbeat"
    #: The provider's message id recorded.
    OUTBOX_MARK_SENT = "outbox.mark_sent"
    #: A retryable failure recorded (retried after a backoff).
    OUTBOX_MARK_FAILED = "outbox.mark_failed"
    #: A final failure, retries spent, or a dead earlier part.
    OUTBOX_MARK_DEAD = "outbox.mark_dead"
    #: An ambiguous send under ``on_ambiguous="skip"``, or a part after an unknown one.
    OUTBOX_MARK_UNKNOWN = "outbox.mark_unknown"
    #: Later parts of a deferred send released to the sweeper.
    OUTBOX_RELEASE = "outbox.release"
    #: A send waits behind an earlier part or an earlier send of its chat (not an attempt).
    OUTBOX_WAIT = "outbox.wait"
    #: Receipts of settled sends acknowledged by the receipts sink.
    OUTBOX_PUBLISHED = "outbox.published"
    #: An operator's ``retry_send``.
    OUTBOX_RETRY = "outbox.retry"
    #: An operator's ``outbox.discard``.
    OUTBOX_DISCARD = "outbox.discard"
    #: A send cancelled before it went out (``app.cancel``, a cancelled campaign).
    OUTBOX_CANCEL = "outbox.cancel"
    #: Done and sent records past retention deleted.
    RETENTION_PURGE = "retention.purge"
    #: A flow checkpoint written outside an inbound (a timeout fired by the sweeper, an
    #: operator's restart or drop); a turn fed by an inbound rides on ``inbox.mark_done``.
    FLOW_CHECKPOINT = "flow.checkpoint"
    #: The provider session's leadership lease taken, renewed or released
    #: (``botmesh.state.leader``).
    LEADER_LEASE = "leader.lease"
    #: A send journaled on a standby handed back to the leader (not charged).
    OUTBOX_NOT_LEADER = "outbox.not_leader"
    #: A send refused by its channel switched to its fallback (``botmesh.state.fallback``).
    OUTBOX_FALLBACK = "outbox.fallback"
    #: A channel's status webhook changed a sent send's delivery state (delivered, read,
    #: failed); with a failure, its fallback journaled in the same write.
    OUTBOX_DELIVERY = "outbox.delivery"
    #: An operator's erasure of a chat: its records deleted (``botmesh.state.erasure``).
    CHAT_ERASE = "chat.erase"
    #: A chat's turn taken (``botmesh.state.turns``), before the inbound's handlers run.
    TURN_TAKE = "turn.take"
    #: A chat's turn extended while the handlers run.
    TURN_HEARTBEAT = "turn.heartbeat"
    #: A chat's turn given back by a run that ended without marking its inbound done (the
    #: usual release joins ``inbox.mark_done``).
    TURN_RELEASE = "turn.release"
    #: An inbound whose chat's turn stays held elsewhere left for the sweeper (not charged).
    INBOX_TURN_WAIT = "inbox.turn_wait"
