"""Real PostgreSQL and Redis servers for the backend tests, started once per test session
(a parallel session: once by its controller, shared by its workers, see ``start_all``).

``postgres_url()`` / ``redis_url()`` return the URL of a running server. A URL in
``BOTMESH_TEST_POSTGRES_URL`` / ``BOTMESH_TEST_REDIS_URL`` is used as it is (a server you
run); otherwise the pytest process starts one from Debian's packages on 127.0.0.1
(PostgreSQL on port 15432, Redis on 16379, a three-node Redis Cluster on 16381-16383:
outside Linux's ephemeral range), with its data
in a temporary folder, and puts its URL in the environment so that the child processes of
the crash and replica tests connect to the same server. ``stop_all()`` (called at the end
of the session) stops what was started here, by pid, and removes the data.

A missing server is an error, never a skip: the message says what to install.

The test servers trade durability for speed (PostgreSQL ``fsync=off``; Redis AOF with
``appendfsync everysec``): the tests kill our processes, never the servers. With
``BOTMESH_TEST_SERVERS_DURABLE=1`` (the benchmark sets it) they run as in production:
PostgreSQL with ``fsync=on``, Redis with ``appendfsync always``.
"""

from __future__ import annotations

import glob
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "ENV_POSTGRES",
    "ENV_REDIS",
    "ENV_REDIS_CLUSTER",
    "PG_PORT",
    "REDIS_PORT",
    "allow_start",
    "postgres_url",
    "redis_cluster_url",
    "redis_url",
    "start_all",
    "stop_all",
]

ENV_POSTGRES = "BOTMESH_TEST_POSTGRES_URL"
ENV_REDIS = "BOTMESH_TEST_REDIS_URL"
ENV_REDIS_CLUSTER = "BOTMESH_TEST_REDIS_CLUSTER_URL"
PG_PORT = int(os.environ.get("BOTMESH_TEST_PG_PORT", "15432"))
REDIS_PORT = int(os.environ.get("BOTMESH_TEST_REDIS_PORT", "16379"))
REDIS_CLUSTER_PORT = int(os.environ.get("BOTMESH_TEST_REDIS_CLUSTER_PORT", "16381"))
#: Test-only passwords: the servers listen on 127.0.0.1 and live for one session. They are
#: there so that the tests can check a password never reaches a log or an error.
PG_PASSWORD = "pg-test-secret-5b1e"
REDIS_PASSWORD = "redis-test-secret-9c4d"

_MAY_START: list[bool] = []  # [True] once this process may start servers


@dataclass
class _Server:
    name: str
    proc: subprocess.Popen[bytes]
    data: Path
    log: Path


_STARTED: dict[str, _Server] = {}


def allow_start() -> None:
    """Let this process start servers (the pytest process; never a test's child)."""
    _MAY_START[:] = [True]


def _durable() -> bool:
    return os.environ.get("BOTMESH_TEST_SERVERS_DURABLE") == "1"


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _wait_port(server: _Server, port: int, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.proc.poll() is not None:
            raise RuntimeError(
                f"the test {server.name} exited at start (status {server.proc.returncode}): "
                + server.log.read_text(errors="replace")[-2000:]
            )
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise RuntimeError(f"the test {server.name} did not listen on 127.0.0.1:{port} in {timeout}s")


def _need(name: str, port: int, env: str) -> None:
    if not _MAY_START:
        raise RuntimeError(
            f"no {name} for this process: set {env} (the test session sets it for its children)"
        )
    if not _port_free(port):
        raise RuntimeError(
            f"port {port} on 127.0.0.1 is taken, so the test {name} cannot start there: stop "
            f"what listens on it (a server left by an earlier run?), or give a running server "
            f"in {env}"
        )


def _find(binary: str, pattern: str, package: str) -> str:
    found = sorted(glob.glob(pattern), reverse=True) or [
        p for p in [shutil.which(binary)] if p is not None
    ]
    if not found:
        raise RuntimeError(
            f"{binary} is not installed: the {package} tests need a real server. Install it "
            f"with `apt-get install -y {package}` (bash .ci/run does), or give a server's URL"
        )
    return found[0]


# -- PostgreSQL ----------------------------------------------------------------------------


def postgres_url() -> str:
    url = os.environ.get(ENV_POSTGRES)
    if url:
        return url
    _need("PostgreSQL", PG_PORT, ENV_POSTGRES)
    bindir = os.path.dirname(_find("postgres", "/usr/lib/postgresql/*/bin/postgres", "postgresql"))
    data = Path(tempfile.mkdtemp(prefix="botmesh-pg-"))
    log = data / "server.log"
    user: str | None = None
    if os.geteuid() == 0:  # PostgreSQL refuses to run as root: run it as the postgres user
        user = "postgres"
        shutil.chown(data, user)
    pwfile = data / "pw"
    pwfile.write_text(PG_PASSWORD + "\n")
    if user:
        shutil.chown(pwfile, user)
    pgdata = data / "pgdata"
    subprocess.run(
        [
            f"{bindir}/initdb",
            "-D",
            str(pgdata),
            "-U",
            "botmesh",
            f"--pwfile={pwfile}",
            "--auth=scram-sha-256",
            "-E",
            "UTF8",
            "--locale=C",
            "--no-sync",
        ],
        check=True,
        capture_output=True,
        user=user,
    )
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [
                f"{bindir}/postgres",
                "-D",
                str(pgdata),
                "-p",
                str(PG_PORT),
                "-c",
                "listen_addresses=127.0.0.1",
                "-c",
                f"unix_socket_directories={data}",
                "-c",
                f"fsync={'on' if _durable() else 'off'}",
                "-c",
                f"full_page_writes={'on' if _durable() else 'off'}",
                "-c",
                "max_connections=300",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            user=user,
            start_new_session=True,
        )
    server = _Server("PostgreSQL", proc, data, log)
    _STARTED["postgres"] = server
    url = f"postgresql://botmesh:{PG_PASSWORD}@127.0.0.1:{PG_PORT}/postgres"
    _wait_ready(server, url)
    os.environ[ENV_POSTGRES] = url
    return url


def _wait_ready(server: _Server, url: str, timeout: float = 60.0) -> None:
    """The port opens before PostgreSQL accepts sessions: wait for a real query."""
    import asyncio

    import asyncpg

    _wait_port(server, PG_PORT, timeout)

    async def ping() -> bool:
        try:
            conn = await asyncpg.connect(url, timeout=5)
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError):
            return False
        await conn.close()
        return True

    def ready() -> bool:  # in a thread of its own: the caller may be inside an event loop
        with ThreadPoolExecutor(1) as pool:
            return pool.submit(lambda: asyncio.run(ping())).result()

    deadline = time.monotonic() + timeout
    while not ready():
        if time.monotonic() > deadline or server.proc.poll() is not None:
            raise RuntimeError("the test PostgreSQL does not accept sessions: " + _tail(server))
        time.sleep(0.05)


# -- Redis ---------------------------------------------------------------------------------


def _redis_server(name: str, key: str, port: int, *options: str) -> _Server:
    """Start one redis-server on 127.0.0.1:``port`` (AOF on, our password), registered
    under ``key`` for ``stop_all``; return once it listens."""
    binary = _find("redis-server", "/usr/bin/redis-server", "redis-server")
    data = Path(tempfile.mkdtemp(prefix=f"botmesh-redis-{port}-"))
    log = data / "server.log"
    argv = [binary, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(data)]
    argv += ["--appendonly", "yes", "--appendfsync", "always" if _durable() else "everysec"]
    argv += ["--save", "", "--requirepass", REDIS_PASSWORD, "--daemonize", "no", *options]
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    server = _Server(name, proc, data, log)
    _STARTED[key] = server
    _wait_port(server, port)
    return server


def redis_url() -> str:
    url = os.environ.get(ENV_REDIS)
    if url:
        return url
    _need("Redis", REDIS_PORT, ENV_REDIS)
    _redis_server("Redis", "redis", REDIS_PORT, "--maxclients", "2000")
    url = f"redis://:{REDIS_PASSWORD}@127.0.0.1:{REDIS_PORT}/0"
    os.environ[ENV_REDIS] = url
    return url


def redis_cluster_url() -> str:
    """A three-node Redis Cluster (no replicas) on 127.0.0.1:16381-16383."""
    url = os.environ.get(ENV_REDIS_CLUSTER)
    if url:
        return url
    ports = [REDIS_CLUSTER_PORT + i for i in range(3)]
    for port in ports:
        _need("Redis Cluster", port, ENV_REDIS_CLUSTER)
    cli = _find("redis-cli", "/usr/bin/redis-cli", "redis-tools")
    for i, port in enumerate(ports):
        options = ["--cluster-enabled", "yes", "--masterauth", REDIS_PASSWORD]
        _redis_server(f"Redis Cluster node {port}", f"redis-cluster-{i}", port, *options)
    nodes = [f"127.0.0.1:{p}" for p in ports]
    cli_auth = [cli, "--no-auth-warning", "-a", REDIS_PASSWORD]
    created = subprocess.run(
        [*cli_auth, "--cluster", "create", *nodes, "--cluster-replicas", "0", "--cluster-yes"],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    if created.returncode != 0:
        raise RuntimeError(f"redis-cli --cluster create failed: {created.stdout[-2000:]}")
    deadline = time.monotonic() + 60
    for port in ports:  # every node agrees the cluster is up
        while True:
            info = subprocess.run(
                [*cli_auth, "-p", str(port), "cluster", "info"],
                check=False,
                capture_output=True,
                text=True,
                timeout=30,
            ).stdout
            if "cluster_state:ok" in info:
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"the test Redis Cluster is not ok: {info}")
            time.sleep(0.05)
    url = f"redis://:{REDIS_PASSWORD}@127.0.0.1:{ports[0]}?cluster=true"
    os.environ[ENV_REDIS_CLUSTER] = url
    return url


# -- all ----------------------------------------------------------------------------------


def start_all() -> None:
    """Start every test server now (PostgreSQL, Redis, the Redis Cluster), each unless its
    URL is already set. The controller of a parallel run (pytest-xdist) calls it before it
    starts its workers: they inherit the URLs and share the servers, which it stops at the
    end; a worker never starts a server of its own. One after the other: ``Popen`` from
    several threads at once failed here once (``OSError: [Errno 14] Bad address``)."""
    postgres_url()
    redis_url()
    redis_cluster_url()


def _tail(server: _Server) -> str:
    return server.log.read_text(errors="replace")[-2000:] if server.log.exists() else ""


def stop_all() -> None:
    """Stop the servers this process started (by pid), then remove their data."""
    for name, server in list(_STARTED.items()):
        proc = server.proc
        if proc.poll() is None:
            # PostgreSQL: SIGINT is its "fast" shutdown; Redis: SIGTERM.
            proc.send_signal(signal.SIGINT if name == "postgres" else signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(30)
        shutil.rmtree(server.data, ignore_errors=True)
        env = {"postgres": ENV_POSTGRES, "redis": ENV_REDIS}.get(name, ENV_REDIS_CLUSTER)
        os.environ.pop(env, None)
        del _STARTED[name]


def _check() -> None:
    """``python -m tests.servers check``: start both servers, query them, stop them."""
    import asyncio

    import asyncpg
    import redis.asyncio as aioredis

    allow_start()
    try:
        pg, rd = postgres_url(), redis_url()

        async def ping() -> tuple[str, str]:
            conn = await asyncpg.connect(pg)
            try:
                version = str(await conn.fetchval("SHOW server_version"))
            finally:
                await conn.close()
            client = aioredis.Redis.from_url(rd)
            try:
                info = await client.info("server")
            finally:
                await client.aclose()
            return version, str(info["redis_version"])

        versions = asyncio.run(ping())
        print(f"PostgreSQL {versions[0]} and Redis {versions[1]} start and answer")
    finally:
        stop_all()


if __name__ == "__main__":
    import sys

    if sys.argv[1:] != ["check"]:
        raise SystemExit("usage: python -m tests.servers check")
    _check()
