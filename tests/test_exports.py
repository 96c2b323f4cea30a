"""The public surface: ``botmesh.__all__`` is pinned, and every module lists ``__all__``."""

from __future__ import annotations

import importlib
import pkgutil

import botmesh
import state

PUBLIC = {
    "AmbiguousEvent", "BackoffConfig", "Bot", "BotmeshError", "ConfigError", "ConsoleProvider",
    "Context", "DeadEvent", "DurabilityConfig", "DurabilityError", "DurableKv", "FencedError",
    "FileDurability", "Handler", "Inbound", "InboxConfig", "InboxRecord", "JournalCorruptError",
    "JournalLockedError", "JournalUnavailableError", "JournalWriteError", "KvDurability", "Media",
    "MediaUnavailableError", "MemoryDurability", "MemoryKv", "MockProvider", "Outbound",
    "OutboxConfig", "OutboxRecord", "OutsideSessionWindowError", "PayloadTooLargeError",
    "Provider", "ProviderError", "ProviderNotLeaderError", "RateLimitedError", "Receipt",
    "RecipientUnreachableError", "RecordStateError", "ScopedDurability", "SendDeferredError",
    "SendError", "SendResult", "UnsupportedContentError", "VersionConflictError", "__version__",
}  # fmt: skip


def test_botmesh_surface_is_pinned() -> None:
    assert set(botmesh.__all__) == PUBLIC
    for name in botmesh.__all__:
        assert hasattr(botmesh, name), name


def test_testing_kit_surface() -> None:
    import botmesh.testing as t

    assert set(t.__all__) == {
        "WRITE_LABELS", "CrashableKv", "CrashableProvider", "ManualClock", "MockProvider",
        "SentCall", "SimulatedCrash", "crashable",
    }  # fmt: skip


def test_every_state_module_declares_all() -> None:
    missing = []
    for info in pkgutil.walk_packages(state.__path__, "state."):
        module = importlib.import_module(info.name)
        if not info.ispkg and not hasattr(module, "__all__"):
            missing.append(info.name)
    assert missing == []


def test_errors_are_in_the_docstring_tree() -> None:
    from state import errors

    doc = errors.__doc__ or ""
    for name in errors.__all__:
        assert name in doc, name
