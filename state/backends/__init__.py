"""Journal backends behind the ``DurableKv`` SPI, picked by URL.

``open_backend("memory://")``, ``open_backend("file:///var/lib/bot/journal?append_log=1")``.
A backend joins with one line in ``_REGISTRY``: its scheme, the ``module:function`` that
opens a URL (imported only when that scheme is used), and the install hint printed when
the module is missing.
"""

from __future__ import annotations

import importlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import cast

from state.errors import ConfigError
from state.kv import DurableKv

__all__ = ["BackendSpec", "open_backend", "register_backend", "schemes"]

Opener = Callable[[str], Awaitable[DurableKv]]


@dataclass(frozen=True, slots=True)
class BackendSpec:
    #: ``"package.module:function"``; the function takes the URL and returns an open kv.
    target: str
    #: What to run when the module is missing (``pip install 'botmesh[redis]'``).
    install: str | None = None


_REGISTRY: dict[str, BackendSpec] = {
    "memory": BackendSpec("state.backends.urls:open_memory"),
    "file": BackendSpec("state.backends.file:open_url"),
    # -- a new backend joins here, one line each -----------------------------------------
}


def register_backend(scheme: str, target: str, *, install: str | None = None) -> None:
    """Add or replace a URL scheme (``target`` is ``"module:function"``)."""
    _REGISTRY[scheme] = BackendSpec(target, install)


def schemes() -> list[str]:
    return sorted(_REGISTRY)


def _opener(url: str) -> Opener:
    scheme, sep, _ = url.partition("://")
    if not sep:
        raise ConfigError("backend", f"{url!r} is not a URL; use one of {_examples()}")
    spec = _REGISTRY.get(scheme)
    if spec is None:
        raise ConfigError(
            "backend", f"unknown journal scheme {scheme + '://'!r}; known: {_examples()}"
        )
    module_name, _, attr = spec.target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        hint = spec.install or f"install the package that provides {module_name}"
        raise ConfigError(
            "backend", f"the {scheme}:// journal needs {exc.name!r}, which is missing: {hint}"
        ) from exc
    return cast(Opener, getattr(module, attr))


def _examples() -> str:
    return ", ".join(f"{s}://" for s in schemes())


async def open_backend(url: str) -> DurableKv:
    """Open the ``DurableKv`` a URL names."""
    return await _opener(url)(url)
