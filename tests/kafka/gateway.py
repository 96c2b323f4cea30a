"""``botmesh gateway`` as a real process for the Kafka tests: started on a free port of
127.0.0.1 for one channel, waited for until ``/readyz`` says ready, stopped by the caller."""

from __future__ import annotations

import socket
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.kafka.worker import WAIT_S
from tests.kill import Child, python

__all__ = ["Gateway", "free_port", "start_gateway"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Gateway:
    child: Child
    url: str

    def post(self, path: str, headers: dict[str, str], body: bytes) -> int:
        req = urllib.request.Request(self.url + path, data=body, headers=headers, method="POST")
        try:
            with urllib.request.urlopen(req, timeout=30) as resp:
                return int(resp.status)
        except urllib.error.HTTPError as exc:
            return int(exc.code)

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(self.url + "/readyz", timeout=5) as resp:
                return int(resp.status) == 200
        except (urllib.error.URLError, OSError):
            return False


def start_gateway(
    channel: str, env: dict[str, str], *, bootstrap: str, prefix: str, log: Path
) -> Gateway:
    """``botmesh gateway --channel <channel>`` with ``env``, ready."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    argv = python(
        "-m",
        "botmesh",
        "gateway",
        "--channel",
        channel,
        "--port",
        str(port),
        "--public-url",
        url,
        "--bootstrap",
        bootstrap,
        "--prefix",
        prefix,
        "--loglevel",
        "warning",
    )
    child = Child(argv, env=env, log=log).start()
    gw = Gateway(child, url)
    deadline = time.monotonic() + WAIT_S
    while not gw.ready():
        if not child.alive():
            child.stop()
            pytest.fail(f"the gateway exited:\n{child.tail(40)}")
        if time.monotonic() > deadline:
            child.stop()
            pytest.fail(f"the gateway never became ready:\n{child.tail(40)}")
        time.sleep(0.1)
    return gw
