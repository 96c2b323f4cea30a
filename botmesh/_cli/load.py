"""Loading what a command runs: the bot definition ``--app`` names (``module:attribute``),
the provider of ``--provider`` (or ``BOTMESH_PROVIDER``) and the fallback channels of
``BOTMESH_FALLBACK_PROVIDERS``. A spec that names nothing usable raises ``AppLoadError``
with the fix; the command line exits 2 on it.

The provider: ``console`` (the default), ``mock``, a channel name such as ``telegram`` (its
adapter built from its environment variables, ``botmesh.providers.channels``), or
``module:attribute`` naming a provider or a zero-argument factory.
"""

# the providers' modules load only for the spec that names them:
# ruff: noqa: PLC0415

from __future__ import annotations

import importlib
import os
import sys
from types import ModuleType
from typing import TYPE_CHECKING

from botmesh.state.errors import AppLoadError
from botmesh.state.ports import Provider

if TYPE_CHECKING:
    from botmesh.streams.runner import BotDefinition

__all__ = ["fallbacks_of_env", "load_app", "load_provider", "provider_of"]

BUILTIN_PROVIDERS = ("console", "mock")


def _import(spec: str, option: str, what: str) -> tuple[ModuleType, str, object]:
    """Import ``module:attribute`` for ``option`` (the current directory is importable,
    like uvicorn); returns the module, the attribute path and the object."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise AppLoadError(f"{option} {spec!r}: expected 'module:attribute', e.g. '{what}'")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name is not None and module_name.startswith(exc.name):
            raise AppLoadError(
                f"{option} {spec!r}: cannot import module {module_name!r} ({exc}); check the "
                "spelling, run from the directory that holds it, or add that directory to "
                "PYTHONPATH"
            ) from None
        raise AppLoadError(
            f"{option} {spec!r}: module {module_name!r} failed to import: {exc}; install the "
            "missing package"
        ) from None
    try:
        obj: object = module
        for part in attr.split("."):
            obj = getattr(obj, part)
    except AttributeError:
        names = sorted(n for n in vars(module) if not n.startswith("_"))
        raise AppLoadError(
            f"{option} {spec!r}: module {module_name!r} has no attribute {attr!r} "
            f"(it has: {', '.join(names[:12]) or 'nothing public'}); name the right "
            "variable after the colon"
        ) from None
    return module, attr, obj


def load_app(spec: str) -> BotDefinition:
    """The bot definition ``--app module:attribute`` names (a ``botmesh.Bot``)."""
    from botmesh.streams.runner import BotDefinition

    module, attr, obj = _import(spec, "--app", "botmesh.examples.echo_bot:bot")
    if not isinstance(obj, BotDefinition):
        raise AppLoadError(
            f"--app {spec!r}: {module.__name__}.{attr} is a {type(obj).__name__}, not a bot; "
            'it must be a botmesh.Bot (define `bot = Bot("my-bot")` in the module; the '
            "worker supplies the provider and the journal)"
        )
    return obj


def load_provider(spec: str, option: str = "--provider") -> Provider:
    """The provider ``spec`` names: ``console`` (``BOTMESH_CONSOLE_QUIET=1``: count, do not
    print), ``mock``, a channel of ``botmesh.providers.channels`` (``telegram``, ``whatsapp``…,
    built from the environment by ``provider_from_env``), or ``module:attribute`` naming a
    provider or a zero-argument factory."""
    from botmesh.providers.channels import CHANNELS, provider_from_env
    from botmesh.state.errors import ConfigError

    name = spec.strip()
    if name.lower() in CHANNELS:
        try:
            return provider_from_env(name, os.environ)
        except ConfigError as exc:  # names the variable (or the missing adapter) and the fix
            raise AppLoadError(f"{option} {spec!r}: {exc}") from None
    if name == "console":
        from botmesh.providers.console import ConsoleProvider

        quiet = os.environ.get("BOTMESH_CONSOLE_QUIET", "").strip() == "1"
        return ConsoleProvider(quiet=quiet)
    if name == "mock":
        from botmesh.providers.mock import MockProvider

        return MockProvider()
    if ":" not in name:
        raise AppLoadError(
            f"{option} {spec!r}: expected one of {', '.join(BUILTIN_PROVIDERS)}, a channel "
            f"({', '.join(sorted(CHANNELS))}), or 'module:attribute' naming a provider "
            "instance or a zero-argument factory"
        )
    module, attr, obj = _import(name, option, "mychannel:provider")
    where = f"{module.__name__}.{attr}"
    if isinstance(obj, type) or (not isinstance(obj, Provider) and callable(obj)):
        try:
            obj = obj()
        except Exception as exc:
            raise AppLoadError(
                f"{option} {spec!r}: calling {where}() failed: {type(exc).__name__}: {exc}; "
                "name a provider instance or a factory that takes no arguments"
            ) from None
    if not isinstance(obj, Provider):
        raise AppLoadError(
            f"{option} {spec!r}: {where} gave a {type(obj).__name__}, not a provider; it "
            "must have `name`, `text_limit` and `async def send(message)` (see "
            "botmesh.Provider), or be a zero-argument factory returning one"
        )
    return obj


def provider_of(provider: str | None) -> Provider:
    """The provider of ``--provider``, else of ``BOTMESH_PROVIDER``, else ``console``."""
    if provider is not None:
        return load_provider(provider)
    spec = os.environ.get("BOTMESH_PROVIDER", "").strip()
    return load_provider(spec, "BOTMESH_PROVIDER") if spec else load_provider("console")


def fallbacks_of_env() -> dict[str, Provider]:
    """The channels a send's ``Fallback`` may name (``BOTMESH_FALLBACK_PROVIDERS``): a comma
    list of provider specs as ``--provider`` takes them, each ``name=spec`` or a bare
    channel (named by itself): ``twilio,backup=mychannel:provider``."""
    option = "BOTMESH_FALLBACK_PROVIDERS"
    found: dict[str, Provider] = {}
    for item in os.environ.get(option, "").split(","):
        if not item.strip():
            continue
        name, eq, spec = item.partition("=")
        name = name.strip()
        spec = spec.strip() if eq else name
        if not name or not spec:
            raise AppLoadError(f"{option} {item.strip()!r}: expected name=spec or a channel name")
        if name in found:
            raise AppLoadError(f"{option}: the fallback channel {name!r} is named twice")
        found[name] = load_provider(spec, option)
    return found
