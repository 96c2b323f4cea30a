"""A broker with OAUTHBEARER listeners and the OIDC token endpoint its clients get their
tokens from, for ``tests/kafka/test_oauthbearer.py``.

The broker is started with ``deploy/kafka/kafka.sh`` (``KAFKA_EXTRA_CONFIG`` adds the
listeners), as the ``SASL_SSL`` broker of ``secure_broker`` is, on fixed ports of its own
(29810-29814): its PLAINTEXT listener (the brokers' own traffic, the tool), the controller,
``SASL_PLAINTEXT`` and ``SASL_SSL`` listeners that take OAUTHBEARER only, and the token
endpoint. The brokers check a token with Kafka's unsecured validator
(``OAuthBearerUnsecuredValidatorCallbackHandler``, their default for OAUTHBEARER): a JWT
with ``"alg": "none"``, no signature, ``sub`` and ``exp`` claims, and here the scope
``kafka`` required. The token endpoint (``TokenEndpoint``, on 127.0.0.1) answers the client
credentials grant (the client's id and secret in HTTP Basic auth, as librdkafka and
``botmesh.streams.connection.oauthbearer_token`` send them) with such a token, its ``scope``
claim the scope asked for, and records every request.

The fixed ports make one user at a time: a session holds an exclusive ``flock`` on
``deploy/kafka/.run/oauthbearer.lock`` while it uses the broker (another one waits), and
first stops a broker a crashed session left there (``kafka.sh stop`` of that data dir).
"""

from __future__ import annotations

import base64
import fcntl
import json
import os
import shutil
import subprocess
import threading
import time
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from botmesh.streams.connection import KafkaSettings, Security
from tests.kafka.broker import REPO, RUN_DIR
from tests.kafka.secure_broker import make_certificates

__all__ = [
    "CLIENT_ID",
    "CLIENT_SECRET",
    "SCOPE",
    "OAuthBroker",
    "TokenEndpoint",
    "oauth_broker",
    "unsecured_jwt",
]

KAFKA_SH = REPO / "deploy" / "kafka" / "kafka.sh"
PLAINTEXT_PORT, CONTROLLER_PORT, SASL_PLAINTEXT_PORT, SASL_SSL_PORT, TOKEN_PORT = range(
    29810, 29815
)
DATA_DIR = RUN_DIR / "oauthbearer"
LOCK = RUN_DIR / "oauthbearer.lock"
LOCK_WAIT_S = 240
CLIENT_ID, CLIENT_SECRET = "botmesh-worker", "oidc-client-secret-of-the-test"
SCOPE = "kafka"
TOKEN_LIFETIME_S = 3600


def _b64(data: dict[str, Any]) -> str:
    """The JSON of ``data`` in base64 of the characters standard and URL-safe base64 share
    (no ``+/-_``, no padding): Kafka's unsecured validator decodes with Java's basic
    decoder (no ``-``/``_``), its SASL parser takes a token of ``[-_.a-zA-Z0-9]`` only (no
    ``+``/``/``), librdkafka decodes base64url. Spaces after the JSON shift the encoding
    until it fits all three."""
    text = json.dumps(data, separators=(",", ":"))
    for pad in range(64):
        encoded = base64.b64encode((text + " " * pad).encode()).decode()
        if not set(encoded) & set("+/="):
            return encoded
    raise AssertionError(f"no padding makes {text!r} fit")


def unsecured_jwt(sub: str, scope: str | None, lifetime_s: int = TOKEN_LIFETIME_S) -> str:
    """An unsigned JWT (``alg`` ``none``, empty signature) the unsecured validator takes."""
    now = int(time.time())
    claims: dict[str, Any] = {"sub": sub, "iat": now, "exp": now + lifetime_s}
    if scope:
        claims["scope"] = scope.split()
    return f"{_b64({'alg': 'none'})}.{_b64(claims)}."


@dataclass
class TokenEndpoint:
    """An OIDC token endpoint on 127.0.0.1 (client credentials grant) in a thread."""

    port: int
    clients: dict[str, str]
    #: every request: client id (or None), grant type, scope, HTTP status answered, the
    #: asking client's User-Agent
    requests: list[dict[str, Any]] = field(default_factory=list)
    _server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/oauth2/token"

    def start(self) -> TokenEndpoint:
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                size = int(self.headers.get("Content-Length") or 0)
                form = urllib.parse.parse_qs(self.rfile.read(size).decode())
                client = endpoint._client(self.headers.get("Authorization", ""))
                grant = form.get("grant_type", [""])[0]
                scope = form.get("scope", [None])[0]
                status, body = 200, dict[str, Any]()
                if self.path != "/oauth2/token":
                    status, body = 404, {"error": "not_found"}
                elif client is None:
                    status, body = 401, {"error": "invalid_client"}
                elif grant != "client_credentials":
                    status, body = 400, {"error": "unsupported_grant_type"}
                else:
                    body = {
                        "access_token": unsecured_jwt(client, scope),
                        "token_type": "Bearer",
                        "expires_in": TOKEN_LIFETIME_S,
                    }
                endpoint.requests.append(
                    {
                        "client": client,
                        "grant_type": grant,
                        "scope": scope,
                        "status": status,
                        "agent": self.headers.get("User-Agent", ""),
                    }
                )
                raw = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def log_message(self, format: str, *args: Any) -> None:
                pass  # quiet

        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self._server.daemon_threads = True
        threading.Thread(
            target=self._server.serve_forever, name="token-endpoint", daemon=True
        ).start()
        return self

    def _client(self, authorization: str) -> str | None:
        """The client of a Basic ``Authorization`` header whose secret is right."""
        scheme, _, encoded = authorization.partition(" ")
        if scheme.lower() != "basic":
            return None
        try:
            client, _, secret = base64.b64decode(encoded).decode().partition(":")
        except ValueError:
            return None
        return client if self.clients.get(client) == secret else None

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


@dataclass(frozen=True)
class OAuthBroker:
    folder: Path
    endpoint: TokenEndpoint

    @property
    def plaintext(self) -> str:
        """The broker's own PLAINTEXT listener (not the tests' clients')."""
        return f"127.0.0.1:{PLAINTEXT_PORT}"

    def bootstrap(self, protocol: str = "SASL_PLAINTEXT") -> str:
        port = SASL_SSL_PORT if protocol == "SASL_SSL" else SASL_PLAINTEXT_PORT
        return f"127.0.0.1:{port}"

    @property
    def ca(self) -> Path:
        return self.folder / "ca.pem"

    @property
    def server_log(self) -> Path:
        return DATA_DIR / "server.log"

    def secret_file(self, secret: str = CLIENT_SECRET) -> Path:
        path = self.folder / f"client-secret-{abs(hash(secret))}"
        path.write_text(secret + "\n")
        return path

    def env(
        self,
        protocol: str = "SASL_PLAINTEXT",
        *,
        secret: str = CLIENT_SECRET,
        scope: str | None = SCOPE,
        **more: str,
    ) -> dict[str, str]:
        """The environment of a client of an OAUTHBEARER listener (the secret in a file)."""
        env = {
            "KAFKA_BOOTSTRAP_SERVERS": self.bootstrap(protocol),
            "KAFKA_SECURITY_PROTOCOL": protocol,
            "KAFKA_SASL_MECHANISM": "OAUTHBEARER",
            "KAFKA_SASL_OAUTHBEARER_TOKEN_ENDPOINT_URL": self.endpoint.url,
            "KAFKA_SASL_OAUTHBEARER_CLIENT_ID": CLIENT_ID,
            "KAFKA_SASL_OAUTHBEARER_CLIENT_SECRET_FILE": str(self.secret_file(secret)),
        }
        if scope:
            env["KAFKA_SASL_OAUTHBEARER_SCOPE"] = scope
        if protocol == "SASL_SSL":
            env["KAFKA_SSL_CAFILE"] = str(self.ca)
        return {**env, **more}

    def settings(self, protocol: str = "SASL_PLAINTEXT", **kw: Any) -> KafkaSettings:
        return KafkaSettings(self.bootstrap(protocol), Security.from_env(self.env(protocol, **kw)))


def broker_config(folder: Path) -> Path:
    """The listeners: OAUTHBEARER only, tokens checked by the unsecured validator (the
    brokers' default for OAUTHBEARER, named here all the same) with the scope ``kafka``
    required. ``unsecuredLoginStringClaim_sub`` is the token of the brokers' own login
    (the login module wants one; their own traffic goes over PLAINTEXT)."""
    jaas = (
        "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required "
        f'unsecuredLoginStringClaim_sub="broker" unsecuredValidatorRequiredScope="{SCOPE}";'
    )
    validator = (
        "org.apache.kafka.common.security.oauthbearer.internals.unsecured."
        "OAuthBearerUnsecuredValidatorCallbackHandler"
    )
    lines = [
        f"listeners=PLAINTEXT://127.0.0.1:{PLAINTEXT_PORT},"
        f"CONTROLLER://127.0.0.1:{CONTROLLER_PORT},"
        f"SASL_PLAINTEXT://127.0.0.1:{SASL_PLAINTEXT_PORT},SASL_SSL://127.0.0.1:{SASL_SSL_PORT}",
        f"advertised.listeners=PLAINTEXT://127.0.0.1:{PLAINTEXT_PORT},"
        f"SASL_PLAINTEXT://127.0.0.1:{SASL_PLAINTEXT_PORT},SASL_SSL://127.0.0.1:{SASL_SSL_PORT}",
        "listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT,"
        "SASL_PLAINTEXT:SASL_PLAINTEXT,SASL_SSL:SASL_SSL",
        "sasl.enabled.mechanisms=OAUTHBEARER",
        f"listener.name.sasl_plaintext.oauthbearer.sasl.jaas.config={jaas}",
        f"listener.name.sasl_plaintext.oauthbearer.sasl.server.callback.handler.class={validator}",
        f"listener.name.sasl_ssl.oauthbearer.sasl.jaas.config={jaas}",
        f"listener.name.sasl_ssl.oauthbearer.sasl.server.callback.handler.class={validator}",
        "ssl.keystore.type=PEM",
        f"ssl.keystore.location={folder / 'broker-keystore.pem'}",
        "auto.create.topics.enable=false",
    ]
    path = folder / "oauthbearer.properties"
    path.write_text("\n".join(lines) + "\n")
    return path


def _kafka_sh(folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "KAFKA_PORT": str(PLAINTEXT_PORT),
        "KAFKA_CONTROLLER_PORT": str(CONTROLLER_PORT),
        "KAFKA_DATA_DIR": str(DATA_DIR),
        "KAFKA_EXTRA_CONFIG": str(folder / "oauthbearer.properties"),
    }
    return subprocess.run(
        ["bash", str(KAFKA_SH), *args], env=env, capture_output=True, text=True, check=False
    )


@contextmanager
def _exclusive() -> Iterator[None]:
    """The broker's ports for this session alone (waits for another session's end)."""
    RUN_DIR.mkdir(parents=True, exist_ok=True)
    with LOCK.open("a") as lock:
        deadline = time.monotonic() + LOCK_WAIT_S
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"another test session held {LOCK} for {LOCK_WAIT_S} s (the "
                        "OAUTHBEARER broker's ports 29810-29814)"
                    ) from None
                time.sleep(0.2)  # polled: flock has no timeout of its own
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


@contextmanager
def oauth_broker(folder: Path) -> Iterator[OAuthBroker]:
    """Start the token endpoint and the broker (certificates, listeners); both stopped on
    exit."""
    with _exclusive():
        make_certificates(folder)
        broker_config(folder)
        _kafka_sh(folder, "stop")  # one a crashed session left (only a broker of DATA_DIR)
        shutil.rmtree(DATA_DIR, ignore_errors=True)
        endpoint = TokenEndpoint(TOKEN_PORT, {CLIENT_ID: CLIENT_SECRET}).start()
        try:
            started = _kafka_sh(folder, "start")
            if started.returncode != 0:
                raise RuntimeError(
                    f"the OAUTHBEARER broker did not start:\n{started.stderr[-3000:]}"
                )
            try:
                yield OAuthBroker(folder, endpoint)
            finally:
                _kafka_sh(folder, "stop")
        finally:
            endpoint.stop()
