"""URL openers for the registered backends (imported lazily by ``state.backends``)."""

from __future__ import annotations

from urllib.parse import parse_qs, unquote, urlsplit

from state.errors import ConfigError
from state.kv import DurableKv, MemoryKv

__all__ = ["open_file", "open_memory"]

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


async def open_memory(url: str) -> DurableKv:
    kv = MemoryKv()
    await kv.open()
    return kv


def _flag(query: dict[str, list[str]], name: str) -> bool | None:
    if name not in query:
        return None
    raw = query[name][-1].lower()
    if raw in _TRUE:
        return True
    if raw in _FALSE:
        return False
    raise ConfigError(f"backend.{name}", f"expected 1/0 or true/false, got {raw!r}")


async def open_file(url: str) -> DurableKv:
    """``file:///abs/path?append_log=1&fsync=0&compact_every=1000&compact_bytes=4194304``."""
    # lazy: the file backend is imported only when file:// is used
    from state.backends.file import open_file_kv  # noqa: PLC0415

    parts = urlsplit(url)
    path = unquote(parts.path)
    if parts.netloc not in ("", "localhost") or not path:
        raise ConfigError("backend", f"{url!r}: use file:///absolute/path (three slashes)")
    query = parse_qs(parts.query)
    known = {"append_log", "fsync", "compact_every", "compact_bytes"}
    for name in query:
        if name not in known:
            raise ConfigError(
                f"backend.{name}", f"unknown file journal option; known: {sorted(known)}"
            )
    return await open_file_kv(
        path,
        append_log=bool(_flag(query, "append_log")),
        fsync=_flag(query, "fsync"),
        compact_every=_whole(query, "compact_every", 1000),
        compact_bytes=_whole(query, "compact_bytes", 4 * 1024 * 1024),
    )


def _whole(query: dict[str, list[str]], name: str, default: int) -> int:
    if name not in query:
        return default
    try:
        return int(query[name][-1])
    except ValueError:
        raise ConfigError(f"backend.{name}", "expected a whole number") from None
