"""The one SIGKILL harness: a child process started, watched and killed for real.

``Child(argv)`` runs a command (``python -m some.module ARGS``, a worker…) with its output
read line by line in a thread, so a test can wait for a marker line, look at what the child
printed so far, kill it with SIGKILL at a chosen moment and check it died of it, or let it
finish. Used by the crash tests (a durable bot killed mid-handler or mid-send), the file
journal's kill test (a writer killed at random moments) and the Kafka kill tests (a worker
killed while it handles a stream).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import IO

__all__ = ["ROOT", "Child", "python"]

ROOT = Path(__file__).resolve().parents[1]


def python(*args: str) -> list[str]:
    """The argv of this interpreter running ``args`` (``python("-m", "tests.crash.child")``)."""
    return [sys.executable, *args]


class Child:
    """One child process. ``lines`` holds what it printed so far (complete lines only)."""

    def __init__(
        self,
        argv: Sequence[str],
        *,
        cwd: Path = ROOT,
        env: Mapping[str, str] | None = None,
        log: Path | None = None,
        stdin: bool = False,
    ) -> None:
        self.argv = list(argv)
        self.cwd = cwd
        self.env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
        self.log = log
        self.stdin = stdin
        self.lines: list[str] = []
        self.proc: subprocess.Popen[str] | None = None
        self._reader: threading.Thread | None = None
        self._changed = threading.Condition()
        self._log_file: IO[bytes] | None = None

    def start(self) -> Child:
        if self.log is not None:
            self._log_file = open(self.log, "ab")  # noqa: SIM115 - closed when the child is reaped
        self.proc = subprocess.Popen(
            self.argv,
            cwd=self.cwd,
            env=self.env,
            stdin=subprocess.PIPE if self.stdin else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT if self._log_file is None else self._log_file,
            text=True,
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        return self

    def _read(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        for line in self.proc.stdout:
            if not line.endswith("\n"):
                break  # a torn last line: the child died mid-write
            with self._changed:
                self.lines.append(line.rstrip("\n"))
                self._changed.notify_all()
        with self._changed:
            self._changed.notify_all()

    def _reaped(self) -> None:
        """The child is gone: join the reader and close the pipes and the log."""
        assert self.proc is not None
        if self._reader is not None:
            self._reader.join(timeout=60)
        for pipe in (self.proc.stdout, self.proc.stdin, self._log_file):
            if pipe is not None and not pipe.closed:
                pipe.close()

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def wait_for(self, marker: str, timeout: float = 60.0) -> str:
        """Block until the child prints a line starting with ``marker``; return it. Fails
        when the child exits first or ``timeout`` passes (a hang guard, not a timing)."""
        deadline = time.monotonic() + timeout
        seen = 0
        with self._changed:
            while True:
                for line in self.lines[seen:]:
                    if line.startswith(marker):
                        return line
                seen = len(self.lines)
                if not self.alive() and self._reader is not None and not self._reader.is_alive():
                    raise AssertionError(f"{self.argv} exited before {marker!r}: {self.tail()}")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(
                        f"no {marker!r} from {self.argv} in {timeout}s: {self.tail()}"
                    )
                self._changed.wait(min(left, 0.5))

    def kill(self) -> None:
        """SIGKILL it, reap it, and check it died of the signal (not of its own accord)."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=60)
        self._reaped()
        assert self.proc.returncode == -signal.SIGKILL, (self.proc.returncode, self.tail())

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60.0) -> int:
        """Send ``sig`` and wait for the exit status (SIGKILL after ``timeout``)."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
                raise AssertionError(f"{self.argv} ignored signal {sig} for {timeout}s") from None
        self._reaped()
        return self.proc.returncode

    def finish(self, timeout: float = 120.0) -> list[str]:
        """Wait for a clean exit (status 0); return every line it printed."""
        assert self.proc is not None
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"{self.argv} still running after {timeout}s") from None
        self._reaped()
        assert self.proc.returncode == 0, (self.proc.returncode, self.tail())
        return list(self.lines)

    def close_stdin(self) -> None:
        assert self.proc is not None and self.proc.stdin is not None
        self.proc.stdin.close()

    def tail(self, n: int = 30) -> str:
        text = "\n".join(self.lines[-n:])
        if self.log is not None and self.log.exists():
            text += "\n" + self.log.read_text(errors="replace")[-3000:]
        return text

    def __enter__(self) -> Child:
        return self.start() if self.proc is None else self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self.proc is None:
            return
        if self.alive():
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=60)
        self._reaped()
