"""botmesh: durable chat bots on Apache Kafka.

The front door. Public names are re-exported here from where they live; the test
``tests/test_exports.py`` pins this surface.
"""

from botmesh.bot import Bot, Context, Handler
from providers import ConsoleProvider, MockProvider
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
    SendDeferredError,
    SendError,
    UnsupportedContentError,
    VersionConflictError,
)
from state.messages import Inbound, Media, Outbound, Receipt, SendResult
from state.ports import Provider

__version__ = "0.1.0.dev0"

__all__ = [
    "Bot",
    "BotmeshError",
    "ConfigError",
    "ConsoleProvider",
    "Context",
    "DurabilityError",
    "FencedError",
    "Handler",
    "Inbound",
    "JournalCorruptError",
    "JournalLockedError",
    "JournalUnavailableError",
    "JournalWriteError",
    "Media",
    "MediaUnavailableError",
    "MockProvider",
    "Outbound",
    "OutsideSessionWindowError",
    "PayloadTooLargeError",
    "Provider",
    "ProviderError",
    "ProviderNotLeaderError",
    "RateLimitedError",
    "Receipt",
    "RecipientUnreachableError",
    "SendDeferredError",
    "SendError",
    "SendResult",
    "UnsupportedContentError",
    "VersionConflictError",
    "__version__",
]
