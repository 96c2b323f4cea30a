"""What the test bots (run by worker processes) note in files: one unbuffered append a
line, on disk (in the page cache) before the caller goes on, so a SIGKILL right after it
cannot lose it."""

from __future__ import annotations

import os

__all__ = ["append"]


def append(path: str, line: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode() + b"\n")
    finally:
        os.close(fd)
