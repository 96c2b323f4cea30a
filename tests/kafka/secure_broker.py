"""A broker with a ``SASL_SSL`` listener, for the secured-Kafka tests: a CA and a broker
certificate made here with ``openssl`` (the broker's name: ``127.0.0.1`` and ``localhost``), a
second CA that signed nothing of it, SCRAM users created with Kafka's own ``kafka-configs``
tool and a PLAIN user in the listener's JAAS settings. It is started with
``deploy/kafka/kafka.sh`` (``KAFKA_EXTRA_CONFIG`` adds the listener) on free ports of its own,
beside the plaintext test broker, and keeps a PLAINTEXT listener for itself (the tool, and
the brokers' own traffic).
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from confluent_kafka import Consumer

from botmesh.streams.connection import KafkaSettings, Security, confluent_options
from botmesh.streams.groups import GroupInfo, describe_group
from tests.kafka.broker import REPO, free_ports

__all__ = ["SecureBroker", "secure_broker"]

KAFKA_SH = REPO / "deploy" / "kafka" / "kafka.sh"
USER, PASSWORD = "botmesh", "s3cret-pw-of-the-test"
PLAIN_USER, PLAIN_PASSWORD = "plainuser", "plain-pw-of-the-test"
SCRAM = ("SCRAM-SHA-256", "SCRAM-SHA-512")


@dataclass(frozen=True)
class Ports:
    """The broker's listeners: PLAINTEXT (its own, for the tool), CONTROLLER, SASL_SSL."""

    plaintext: int
    controller: int
    secure: int


@dataclass(frozen=True)
class SecureBroker:
    folder: Path
    ports: Ports

    @property
    def bootstrap(self) -> str:
        """The SASL_SSL listener."""
        return f"127.0.0.1:{self.ports.secure}"

    @property
    def plaintext(self) -> str:
        """The broker's own PLAINTEXT listener (for the tool; the tests' clients use the
        other)."""
        return f"127.0.0.1:{self.ports.plaintext}"

    @property
    def ca(self) -> Path:
        return self.folder / "ca.pem"

    @property
    def other_ca(self) -> Path:
        """A CA that signed nothing of the broker's."""
        return self.folder / "other-ca.pem"

    def password_file(self, password: str = PASSWORD, name: str = "password") -> Path:
        path = self.folder / name
        path.write_text(password + "\n")
        return path

    def env(
        self,
        mechanism: str = "SCRAM-SHA-512",
        *,
        password: str | None = None,
        ca: Path | None = None,
    ) -> dict[str, str]:
        """The environment of a client of the SASL_SSL listener (the password in a file)."""
        user, default = (PLAIN_USER, PLAIN_PASSWORD) if mechanism == "PLAIN" else (USER, PASSWORD)
        secret = password if password is not None else default
        return {
            "KAFKA_BOOTSTRAP_SERVERS": self.bootstrap,
            "KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
            "KAFKA_SASL_MECHANISM": mechanism,
            "KAFKA_SASL_USERNAME": user,
            "KAFKA_SASL_PASSWORD_FILE": str(self.password_file(secret, f"pw-{abs(hash(secret))}")),
            "KAFKA_SSL_CAFILE": str(ca if ca is not None else self.ca),
        }

    def settings(self, mechanism: str = "SCRAM-SHA-512", **kw: object) -> KafkaSettings:
        env: Mapping[str, str] = self.env(mechanism, **kw)  # type: ignore[arg-type]
        return KafkaSettings(self.bootstrap, Security.from_env(env))


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def make_certificates(folder: Path) -> None:
    """ca.pem (and its key), broker-keystore.pem (the broker's key and certificate, signed by
    the CA, naming 127.0.0.1 and localhost), other-ca.pem."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in ("ca", "other-ca"):
        _openssl(
            "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
            "-keyout", f"{name}-key.pem", "-out", f"{name}.pem", "-subj", f"/CN=botmesh {name}",
            cwd=folder,
        )  # fmt: skip
    (folder / "san.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    _openssl(
        "req", "-newkey", "rsa:2048", "-nodes", "-keyout", "broker-key.pem",
        "-out", "broker.csr", "-subj", "/CN=127.0.0.1",
        cwd=folder,
    )  # fmt: skip
    _openssl(
        "x509", "-req", "-in", "broker.csr", "-CA", "ca.pem", "-CAkey", "ca-key.pem",
        "-CAcreateserial", "-days", "2", "-out", "broker.pem", "-extfile", "san.ext",
        cwd=folder,
    )  # fmt: skip
    # Kafka's PEM keystore: the key (PKCS#8) then the certificate chain, in one file
    _openssl("pkcs8", "-topk8", "-nocrypt", "-in", "broker-key.pem", "-out", "broker-pk8.pem",
             cwd=folder)  # fmt: skip
    keystore = (folder / "broker-pk8.pem").read_text() + (folder / "broker.pem").read_text()
    (folder / "broker-keystore.pem").write_text(keystore)


def broker_config(folder: Path, ports: Ports) -> Path:
    plain = (
        "org.apache.kafka.common.security.plain.PlainLoginModule required "
        f'user_{PLAIN_USER}="{PLAIN_PASSWORD}";'
    )
    scram = "org.apache.kafka.common.security.scram.ScramLoginModule required;"
    lines = [
        f"listeners=PLAINTEXT://127.0.0.1:{ports.plaintext},"
        f"CONTROLLER://127.0.0.1:{ports.controller},SASL_SSL://127.0.0.1:{ports.secure}",
        f"advertised.listeners=PLAINTEXT://127.0.0.1:{ports.plaintext},"
        f"SASL_SSL://127.0.0.1:{ports.secure}",
        "listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT,SASL_SSL:SASL_SSL",
        "sasl.enabled.mechanisms=PLAIN,SCRAM-SHA-256,SCRAM-SHA-512",
        f"listener.name.sasl_ssl.plain.sasl.jaas.config={plain}",
        f"listener.name.sasl_ssl.scram-sha-256.sasl.jaas.config={scram}",
        f"listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config={scram}",
        "ssl.keystore.type=PEM",
        f"ssl.keystore.location={folder / 'broker-keystore.pem'}",
        "auto.create.topics.enable=false",
    ]
    path = folder / "sasl-ssl.properties"
    path.write_text("\n".join(lines) + "\n")
    return path


def _kafka_sh(folder: Path, ports: Ports, *args: str) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "KAFKA_PORT": str(ports.plaintext),
        "KAFKA_CONTROLLER_PORT": str(ports.controller),
        "KAFKA_DATA_DIR": str(folder / "broker"),
        "KAFKA_EXTRA_CONFIG": str(folder / "sasl-ssl.properties"),
    }
    return subprocess.run(
        ["bash", str(KAFKA_SH), *args], env=env, capture_output=True, text=True, check=False
    )


@contextmanager
def secure_broker(folder: Path) -> Iterator[SecureBroker]:
    """Start the broker (certificates, listener, users); stopped on exit."""
    ports = Ports(*free_ports(3))
    make_certificates(folder)
    broker_config(folder, ports)
    started = _kafka_sh(folder, ports, "start")
    if started.returncode != 0:
        raise RuntimeError(f"the SASL_SSL broker did not start:\n{started.stderr[-3000:]}")
    try:
        for mechanism in SCRAM:  # one credential change a request
            users = _kafka_sh(
                folder, ports, "tool", "configs", "--bootstrap-server",
                f"127.0.0.1:{ports.plaintext}", "--alter",
                "--add-config", f"{mechanism}=[password={PASSWORD}]",
                "--entity-type", "users", "--entity-name", USER,
            )  # fmt: skip
            if users.returncode != 0:
                raise RuntimeError(f"kafka-configs could not add the SCRAM user:\n{users.stderr}")
        yield SecureBroker(folder, ports)
    finally:
        _kafka_sh(folder, ports, "stop")


def static_member(settings: KafkaSettings, group: str, topic: str) -> GroupInfo:
    """A static member joins ``group`` and stops (still listed: its session runs on)."""
    consumer = Consumer(
        {
            **confluent_options(settings),
            "group.id": group,
            "group.instance.id": "static-1",
            "session.timeout.ms": 60000,
            "log_level": 0,
        }
    )
    try:
        consumer.subscribe([topic])
        deadline = time.monotonic() + 120.0
        while not consumer.assignment():
            assert time.monotonic() < deadline, "the static member was never assigned"
            consumer.poll(0.2)
    finally:
        consumer.close()  # a static member sends no LeaveGroup
    return describe_group(settings, group)
