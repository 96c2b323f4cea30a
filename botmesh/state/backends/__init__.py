"""Journal backends behind the ``DurableKv`` SPI, picked by URL.

``open_backend("memory://")``, ``open_backend("file:///var/lib/bot/journal?append_log=1")``.
``check_url(url)`` refuses a bad URL (unknown scheme, bad option) without opening anything,
so a runtime can refuse it where it is given. A backend joins with one line in
``_REGISTRY``: its scheme, the ``module:function`` that opens a URL and the one that checks
it (imported only when that scheme is used), and the install hint printed when the module
is missing.
"""

from __future__ import annotations

import importlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import cast

from botmesh.state.errors import ConfigError
from botmesh.state.kv import DurableKv

__all__ = [
    "BackendSpec",
    "check_url",
    "is_shared",
    "open_backend",
    "register_backend",
    "schemes",
]

Opener = Callable[[str], Awaitable[DurableKv]]
Checker = Callable[[str], object]


@dataclass(frozen=True, slots=True)
class BackendSpec:
    #: ``"package.module:function"``; the function takes the URL and returns an open kv.
    target: str
    #: ``"package.module:function"`` that raises ``ConfigError`` for a bad URL.
    check: str
    #: What to run when the module is missing (``pip install 'botmesh[redis]'``).
    install: str | None = None
    #: Several processes may share the journal (the runtime then adds a per-boot suffix
    #: to its default instance id, so that two of them never share one).
    shared: bool = False


_REGISTRY: dict[str, BackendSpec] = {
    "memory": BackendSpec(
        "botmesh.state.backends.urls:open_memory", "botmesh.state.backends.urls:check_memory"
    ),
    "file": BackendSpec(
        "botmesh.state.backends.file:open_url", "botmesh.state.backends.file:from_url"
    ),
    "shared-file": BackendSpec(
        "botmesh.state.backends.shared_file:open_url",
        "botmesh.state.backends.shared_file:from_url",
        shared=True,
    ),
    "sqlite": BackendSpec(
        "botmesh.state.backends.sqlite:open_url",
        "botmesh.state.backends.sqlite:from_url",
        shared=True,
    ),
    "postgresql": BackendSpec(
        "botmesh.state.backends.postgres:open_url",
        "botmesh.state.backends.postgres:check_url",
        "pip install 'botmesh[postgres]'",
        shared=True,
    ),
    "postgres": BackendSpec(
        "botmesh.state.backends.postgres:open_url",
        "botmesh.state.backends.postgres:check_url",
        "pip install 'botmesh[postgres]'",
        shared=True,
    ),
    "redis": BackendSpec(
        "botmesh.state.backends.redis:open_url",
        "botmesh.state.backends.redis:check_url",
        "pip install 'botmesh[redis]'",
        shared=True,
    ),
    "rediss": BackendSpec(
        "botmesh.state.backends.redis:open_url",
        "botmesh.state.backends.redis:check_url",
        "pip install 'botmesh[redis]'",
        shared=True,
    ),
    # -- a new backend joins here, one line each -----------------------------------------
}


def register_backend(
    scheme: str, target: str, check: str, *, install: str | None = None, shared: bool = False
) -> None:
    """Add or replace a URL scheme (``target`` and ``check`` are ``"module:function"``)."""
    _REGISTRY[scheme] = BackendSpec(target, check, install, shared)


def is_shared(url: str) -> bool:
    """Whether the journal a URL names may be shared by several processes."""
    spec = _REGISTRY.get(url.partition("://")[0]) if isinstance(url, str) else None
    return spec is not None and spec.shared


def schemes() -> list[str]:
    return sorted(_REGISTRY)


def _load(url: str, which: str) -> object:
    if not isinstance(url, str):
        raise ConfigError("journal", f"expected a URL string, got {type(url).__name__}")
    scheme, sep, _ = url.partition("://")
    if not sep:
        raise ConfigError("journal", f"{url!r} is not a URL; use one of {_examples()}")
    spec = _REGISTRY.get(scheme)
    if spec is None:
        raise ConfigError(
            "journal", f"unknown journal scheme {scheme + '://'!r}; known: {_examples()}"
        )
    module_name, _, attr = getattr(spec, which).partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        hint = spec.install or f"install the package that provides {module_name}"
        raise ConfigError(
            "journal", f"the {scheme}:// journal needs {exc.name!r}, which is missing: {hint}"
        ) from exc
    return getattr(module, attr)


def check_url(url: str) -> str:
    """Refuse a bad journal URL (``ConfigError`` naming ``journal``) without opening it."""
    cast(Checker, _load(url, "check"))(url)
    return url


def _examples() -> str:
    return ", ".join(f"{s}://" for s in schemes())


async def open_backend(url: str) -> DurableKv:
    """Open the ``DurableKv`` a URL names."""
    opener = cast(Opener, _load(url, "target"))
    return await opener(check_url(url))
