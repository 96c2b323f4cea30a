"""Durations: ``"250ms"``, ``"15s"``, ``"5m"``, ``"2h"``, ``"7d"``, or a ``timedelta``.

Parsed once, at the configuration boundary, into float seconds. A bare number is refused
(``0`` excepted): ``5`` is 5 ms to some readers and 5 s to others, so it must say which. A
bad value raises ``ConfigError`` naming the field and the accepted forms.
"""

from __future__ import annotations

import math
import re
from datetime import timedelta

from botmesh.state.errors import ConfigError

__all__ = ["Duration", "parse_duration"]

#: What a duration option accepts.
Duration = str | int | float | timedelta

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_PATTERN = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)\s*$")
_FORMS = 'a string such as "250ms", "15s", "5m", "2h" or "7d", or a timedelta'


def parse_duration(value: object, field: str) -> float:
    """Return ``value`` in seconds (>= 0); ``field`` names the option in errors."""
    if isinstance(value, bool):
        raise ConfigError(field, f"expected a duration, got {value!r}; use {_FORMS}")
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, int | float):
        if value != 0:
            raise ConfigError(
                field,
                f"{value!r} is a number without a unit: write it with one, such as "
                f'"{value:g}s" or "{value:g}ms" (units: ms, s, m, h, d)',
            )
        seconds = 0.0
    elif isinstance(value, str):
        match = _PATTERN.match(value)
        if match is None:
            raise ConfigError(field, f"cannot read {value!r} as a duration; use {_FORMS}")
        seconds = float(match.group(1)) * _UNITS[match.group(2)]
    else:
        raise ConfigError(field, f"expected a duration, got {type(value).__name__}; use {_FORMS}")
    if not math.isfinite(seconds) or seconds < 0:
        raise ConfigError(field, f"must be a finite duration >= 0, got {value!r}")
    return seconds
