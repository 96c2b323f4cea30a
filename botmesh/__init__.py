"""botmesh: durable chat bots on Apache Kafka.

The front door. Public names are re-exported here from where they live; the test
``tests/test_exports.py`` pins this surface.
"""

from botmesh.bot import Bot, Context, Handler
from providers import ConsoleProvider, MockProvider
from state.backends.file import FileDurability
from state.config import BackoffConfig, DurabilityConfig, InboxConfig, OutboxConfig
from state.durability import KvDurability, MemoryDurability, ScopedDurability
from state.errors import (
    BotmeshError,
    ConfigError,
    DurabilityError,
    FencedError,
    JournalCorruptError,
    JournalLockedError,
    JournalUnavailableError,
    JournalWriteError,
    MediaUnavailableError,
    OutsideSessionWindowError,
    PayloadTooLargeError,
    ProviderError,
    ProviderNotLeaderError,
    RateLimitedError,
    RecipientUnreachableError,
    RecordStateError,
    SendDeferredError,
    SendError,
    UnsupportedContentError,
    VersionConflictError,
)
from state.events import AmbiguousEvent, DeadEvent
from state.kv import DurableKv, MemoryKv
from state.messages import Inbound, Media, Outbound, Receipt, SendResult
from state.ports import Provider
from state.records import InboxRecord, OutboxRecord

__version__ = "0.1.0.dev0"

__all__ = [
    "AmbiguousEvent",
    "BackoffConfig",
    "Bot",
    "BotmeshError",
    "ConfigError",
    "ConsoleProvider",
    "Context",
    "DeadEvent",
    "DurabilityConfig",
    "DurabilityError",
    "DurableKv",
    "FencedError",
    "FileDurability",
    "Handler",
    "Inbound",
    "InboxConfig",
    "InboxRecord",
    "JournalCorruptError",
    "JournalLockedError",
    "JournalUnavailableError",
    "JournalWriteError",
    "KvDurability",
    "Media",
    "MediaUnavailableError",
    "MemoryDurability",
    "MemoryKv",
    "MockProvider",
    "Outbound",
    "OutboxConfig",
    "OutboxRecord",
    "OutsideSessionWindowError",
    "PayloadTooLargeError",
    "Provider",
    "ProviderError",
    "ProviderNotLeaderError",
    "RateLimitedError",
    "Receipt",
    "RecipientUnreachableError",
    "RecordStateError",
    "ScopedDurability",
    "SendDeferredError",
    "SendError",
    "SendResult",
    "UnsupportedContentError",
    "VersionConflictError",
    "__version__",
]
