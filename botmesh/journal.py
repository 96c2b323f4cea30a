"""The journal: where the inbox and the outbox live, and how to read them.

Backends are picked by URL (``memory://``, ``file:///path``, ``shared-file:///path``) or
passed as a ``DurableKv`` you opened (``MemoryKv()``, ``await open_file_kv(path)``); write
your own by implementing ``DurableKv`` (versioned compare-and-set plus two sorted indexes).
Records read back as ``InboxRecord`` / ``OutboxRecord`` (and flow checkpoints as
``FlowRecord``) through ``app.durability`` (an ``Operations``).
"""

from botmesh.state.backends import check_url, open_backend
from botmesh.state.backends.file import FileKv, FileOptions, open_file_kv
from botmesh.state.backends.shared_file import (
    SharedFileKv,
    SharedFileOptions,
    open_shared_file_kv,
)
from botmesh.state.checkpoints import FlowRecord
from botmesh.state.config import BackoffConfig, InboxConfig, OutboxConfig
from botmesh.state.kv import Delete, DurableKv, Entry, MemoryKv, Op, Put
from botmesh.state.operations import Operations
from botmesh.state.records import InboxRecord, InboxState, OutboxRecord, OutboxState
from botmesh.state.writes import Write

__all__ = [
    "BackoffConfig",
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
    "SharedFileKv",
    "SharedFileOptions",
    "Write",
    "check_url",
    "open_backend",
    "open_file_kv",
    "open_shared_file_kv",
]
