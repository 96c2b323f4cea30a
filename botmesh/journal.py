"""The journal: where the inbox and the outbox live, and how to read them.

Backends are picked by URL (``memory://``, ``file:///path``, ``shared-file:///path``) or
passed as a ``DurableKv`` you opened (``MemoryKv()``, ``await open_file_kv(path)``); write
your own by implementing ``DurableKv`` (versioned compare-and-set plus two sorted indexes).
Records read back as ``InboxRecord`` / ``OutboxRecord`` (and flow checkpoints as
``FlowRecord``) through ``app.durability`` (an ``Operations``).

The outbox paces sends under rate limits (``RateLimits``, the ``outbox.rate_limits``
option); a provider declares its channel's with a ``rate_limits`` attribute, a
``ChannelLimits`` of ``Rate`` values (docs/rate-limits.md).
"""

from botmesh.state.backends import check_url, open_backend
from botmesh.state.backends.file import FileKv, FileOptions, open_file_kv
from botmesh.state.backends.shared_file import (
    SharedFileKv,
    SharedFileOptions,
    open_shared_file_kv,
)
from botmesh.state.checkpoints import FlowRecord
from botmesh.state.config import BackoffConfig, InboxConfig, OutboxConfig, RateLimits
from botmesh.state.kv import Delete, DurableKv, Entry, MemoryKv, Op, Put
from botmesh.state.operations import Operations
from botmesh.state.pacing import ChannelLimits, Rate
from botmesh.state.records import InboxRecord, InboxState, OutboxRecord, OutboxState
from botmesh.state.writes import Write

__all__ = [
    "BackoffConfig",
    "ChannelLimits",
    "Delete",
    "DurableKv",
    "Entry",
    "FileKv",
    "FileOptions",
    "FlowRecord",
    "InboxConfig",
    "InboxRecord",
    "InboxState",
    "MemoryKv",
    "Op",
    "Operations",
    "OutboxConfig",
    "OutboxRecord",
    "OutboxState",
    "Put",
    "Rate",
    "RateLimits",
    "SharedFileKv",
    "SharedFileOptions",
    "Write",
    "check_url",
    "open_backend",
    "open_file_kv",
    "open_shared_file_kv",
]
