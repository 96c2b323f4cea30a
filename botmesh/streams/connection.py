"""How every Kafka client of botmesh connects: the brokers and the security settings (TLS,
SASL), read once from the environment under the names of Kafka's own client settings, and
handed to each client library in its own dialect here and nowhere else.

=============================  ==========================================================
variable                       meaning
=============================  ==========================================================
``KAFKA_BOOTSTRAP_SERVERS``    ``host:port[,host:port...]`` (default ``127.0.0.1:9092``)
``KAFKA_SECURITY_PROTOCOL``    ``PLAINTEXT`` (default), ``SSL``, ``SASL_PLAINTEXT``,
                               ``SASL_SSL``
``KAFKA_SASL_MECHANISM``       ``PLAIN``, ``SCRAM-SHA-256`` or ``SCRAM-SHA-512`` (needed
                               with a ``SASL_*`` protocol)
``KAFKA_SASL_USERNAME``        the SASL user
``KAFKA_SASL_PASSWORD``        its password; or ``KAFKA_SASL_PASSWORD_FILE``: a file
                               holding it (how Kubernetes and Docker hand secrets over)
``KAFKA_SSL_CAFILE``           PEM file of the CAs that sign the brokers' certificates
                               (default: the system's)
``KAFKA_SSL_CERTFILE``         the client's certificate (PEM), for brokers that ask one
``KAFKA_SSL_KEYFILE``          its private key (PEM)
``KAFKA_SSL_KEY_PASSWORD``     the key's password; or ``KAFKA_SSL_KEY_PASSWORD_FILE``
``KAFKA_SSL_CHECK_HOSTNAME``   ``true`` (default): the broker's certificate must name the
                               host it was reached at; ``false`` checks the CA only
=============================  ==========================================================

A function that talks to Kafka takes ``Brokers``: a bootstrap string (the security settings
then come from the environment) or a ``KafkaSettings``. ``aiokafka_options``,
``confluent_options`` (and, for the Faust app, ``faust_app.app.faust_options``) turn it
into each library's keywords;
``admin`` builds the admin client and ``list_topics`` makes the first contact, which turns
a refused login, an unknown CA or a protocol mismatch into ``KafkaAuthError`` naming the
setting to fix. Passwords are ``Secret``: their ``repr`` and ``str`` never show them, and no
message here includes them.
"""

# ruff: noqa: PLC0415 - the Kafka clients load when a connection is made, not on import (the
# CLI imports this module for every command)
from __future__ import annotations

import functools
import logging
import os
import ssl
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

__all__ = [
    "DEFAULT_BOOTSTRAP",
    "MECHANISMS",
    "PROTOCOLS",
    "Brokers",
    "KafkaAuthError",
    "KafkaSettings",
    "Secret",
    "Security",
    "admin",
    "aiokafka_options",
    "broker_hint",
    "confluent_options",
    "connect_error",
    "consumer_options",
    "list_topics",
    "local_kafka_script",
    "producer_options",
    "servers",
    "settings_of",
]

DEFAULT_BOOTSTRAP = "127.0.0.1:9092"
PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


class Secret:
    """A password: ``reveal()`` gives it to a client; ``repr``/``str`` show ``***``."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def reveal(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return "Secret('***')"

    __str__ = __repr__

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other._value == self._value

    def __hash__(self) -> int:
        return hash(self._value)


def _secret(env: Mapping[str, str], name: str) -> tuple[Secret | None, str]:
    """``NAME`` or ``NAME_FILE`` (not both): the secret and where it came from."""
    value = env.get(name, "")
    path = env.get(f"{name}_FILE", "").strip()
    if value and path:
        raise ValueError(f"{name} and {name}_FILE are both set: keep one")
    if path:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError as exc:
            raise ValueError(
                f"{name}_FILE={path!r}: cannot read it ({exc.strerror or exc}); mount the "
                "secret there or fix the path"
            ) from None
        except UnicodeDecodeError as exc:
            raise ValueError(
                f"{name}_FILE={path!r}: not UTF-8 (byte {exc.object[exc.start]:#04x} at "
                f"offset {exc.start}); write the secret there as UTF-8 text"
            ) from None
        return Secret(text.rstrip("\r\n")), f"{name}_FILE"
    return (Secret(value), name) if value else (None, name)


def _file(env: Mapping[str, str], name: str) -> str | None:
    path = env.get(name, "").strip()
    if path and not os.access(path, os.R_OK):
        raise ValueError(f"{name}={path!r}: no readable file there; fix the path or unset it")
    return path or None


@dataclass(frozen=True)
class Security:
    """The security settings of a connection (no brokers): ``Security.from_env()``."""

    protocol: str = "PLAINTEXT"
    sasl_mechanism: str | None = None
    sasl_username: str | None = None
    sasl_password: Secret | None = None
    #: the variable the password came from (``KAFKA_SASL_PASSWORD`` or ``..._FILE``)
    sasl_password_source: str = "KAFKA_SASL_PASSWORD"
    ssl_cafile: str | None = None
    ssl_certfile: str | None = None
    ssl_keyfile: str | None = None
    ssl_key_password: Secret | None = None
    ssl_check_hostname: bool = True

    def __post_init__(self) -> None:
        if self.protocol not in PROTOCOLS:
            raise ValueError(
                f"KAFKA_SECURITY_PROTOCOL={self.protocol!r}: use one of {', '.join(PROTOCOLS)}"
            )
        if self.sasl:
            if self.sasl_mechanism not in MECHANISMS:
                got = "not set" if self.sasl_mechanism is None else repr(self.sasl_mechanism)
                raise ValueError(
                    f"KAFKA_SASL_MECHANISM {got}: with {self.protocol} use one of "
                    f"{', '.join(MECHANISMS)}"
                )
            if not self.sasl_username or self.sasl_password is None:
                raise ValueError(
                    f"{self.protocol} with {self.sasl_mechanism} needs KAFKA_SASL_USERNAME and "
                    "KAFKA_SASL_PASSWORD (or KAFKA_SASL_PASSWORD_FILE)"
                )
        else:
            self._unused(
                "SASL_SSL (or SASL_PLAINTEXT)",
                KAFKA_SASL_MECHANISM=self.sasl_mechanism,
                KAFKA_SASL_USERNAME=self.sasl_username,
                KAFKA_SASL_PASSWORD=self.sasl_password,
            )
        if not self.tls:
            self._unused(
                "SSL or SASL_SSL",
                KAFKA_SSL_CAFILE=self.ssl_cafile,
                KAFKA_SSL_CERTFILE=self.ssl_certfile,
                KAFKA_SSL_KEYFILE=self.ssl_keyfile,
            )
        if bool(self.ssl_certfile) != bool(self.ssl_keyfile):
            raise ValueError("KAFKA_SSL_CERTFILE and KAFKA_SSL_KEYFILE go together: set both")

    def _unused(self, needs: str, **settings: object) -> None:
        """Refuse settings the protocol does not use (a mistake, not a choice)."""
        given = [name for name, value in settings.items() if value]
        if given:
            raise ValueError(
                f"{', '.join(given)} set, but KAFKA_SECURITY_PROTOCOL is {self.protocol}: "
                f"set it to {needs}, or unset them"
            )

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Security:
        env = os.environ if environ is None else environ
        protocol = env.get("KAFKA_SECURITY_PROTOCOL", "").strip().upper() or "PLAINTEXT"
        password, source = _secret(env, "KAFKA_SASL_PASSWORD")
        key_password, _ = _secret(env, "KAFKA_SSL_KEY_PASSWORD")
        check = env.get("KAFKA_SSL_CHECK_HOSTNAME", "").strip().lower() or "true"
        if check not in _TRUE | _FALSE:
            raise ValueError(f"KAFKA_SSL_CHECK_HOSTNAME={check!r}: use true or false")
        return cls(
            protocol=protocol,
            sasl_mechanism=env.get("KAFKA_SASL_MECHANISM", "").strip().upper() or None,
            sasl_username=env.get("KAFKA_SASL_USERNAME", "").strip() or None,
            sasl_password=password,
            sasl_password_source=source,
            ssl_cafile=_file(env, "KAFKA_SSL_CAFILE"),
            ssl_certfile=_file(env, "KAFKA_SSL_CERTFILE"),
            ssl_keyfile=_file(env, "KAFKA_SSL_KEYFILE"),
            ssl_key_password=key_password,
            ssl_check_hostname=check in _TRUE,
        )

    @property
    def sasl(self) -> bool:
        return self.protocol.startswith("SASL_")

    @property
    def tls(self) -> bool:
        return self.protocol in ("SSL", "SASL_SSL")

    @functools.cached_property
    def ssl_context(self) -> ssl.SSLContext | None:
        """The TLS context of the Python clients (aiokafka, Faust); ``None`` without TLS."""
        if not self.tls:
            return None
        context = ssl.create_default_context(cafile=self.ssl_cafile)
        context.check_hostname = self.ssl_check_hostname
        if self.ssl_certfile and self.ssl_keyfile:
            password = self.ssl_key_password.reveal() if self.ssl_key_password else None
            context.load_cert_chain(self.ssl_certfile, self.ssl_keyfile, password)
        return context

    def describe(self) -> str:
        """What a log line may say of it: the protocol, the mechanism and the user."""
        if self.sasl:
            return f"{self.protocol} {self.sasl_mechanism} as {self.sasl_username}"
        return self.protocol


@dataclass(frozen=True)
class KafkaSettings:
    """Brokers and security: one connection's settings (``KafkaSettings.from_env()``)."""

    bootstrap: str = DEFAULT_BOOTSTRAP
    security: Security = field(default_factory=Security)

    @classmethod
    def from_env(
        cls, environ: Mapping[str, str] | None = None, *, bootstrap: str | None = None
    ) -> KafkaSettings:
        env = os.environ if environ is None else environ
        servers = bootstrap or env.get("KAFKA_BOOTSTRAP_SERVERS", "").strip() or DEFAULT_BOOTSTRAP
        return cls(servers, Security.from_env(env))

    def with_bootstrap(self, bootstrap: str) -> KafkaSettings:
        return replace(self, bootstrap=bootstrap)

    def __str__(self) -> str:
        return self.bootstrap


#: A bootstrap string (security from the environment) or the whole settings.
Brokers = str | KafkaSettings


def settings_of(brokers: Brokers) -> KafkaSettings:
    if isinstance(brokers, KafkaSettings):
        return brokers
    return _from_env_cached(brokers, _security_env())


def _security_env() -> tuple[tuple[str, str], ...]:
    return tuple(sorted((k, v) for k, v in os.environ.items() if k.startswith("KAFKA_S")))


@functools.lru_cache(maxsize=32)
def _from_env_cached(bootstrap: str, env: tuple[tuple[str, str], ...]) -> KafkaSettings:
    return KafkaSettings(bootstrap, Security.from_env(dict(env)))


def servers(brokers: Brokers) -> str:
    """The bootstrap string (what a message may name)."""
    return brokers.bootstrap if isinstance(brokers, KafkaSettings) else brokers


# -- each library's dialect ----------------------------------------------------------------------


def aiokafka_options(brokers: Brokers) -> dict[str, Any]:
    """Keywords of aiokafka's producer, consumer and client."""
    s = settings_of(brokers)
    sec = s.security
    out: dict[str, Any] = {"bootstrap_servers": s.bootstrap, "security_protocol": sec.protocol}
    if sec.tls:
        out["ssl_context"] = sec.ssl_context
    if sec.sasl:
        assert sec.sasl_password is not None
        out["sasl_mechanism"] = sec.sasl_mechanism
        out["sasl_plain_username"] = sec.sasl_username
        out["sasl_plain_password"] = sec.sasl_password.reveal()
    return out


def confluent_options(brokers: Brokers) -> dict[str, Any]:
    """librdkafka's settings (confluent-kafka's admin client, consumer, producer)."""
    s = settings_of(brokers)
    sec = s.security
    out: dict[str, Any] = {"bootstrap.servers": s.bootstrap, "security.protocol": sec.protocol}
    if sec.tls:
        out["ssl.endpoint.identification.algorithm"] = "https" if sec.ssl_check_hostname else "none"
        if sec.ssl_cafile:
            out["ssl.ca.location"] = sec.ssl_cafile
        if sec.ssl_certfile and sec.ssl_keyfile:
            out["ssl.certificate.location"] = sec.ssl_certfile
            out["ssl.key.location"] = sec.ssl_keyfile
            if sec.ssl_key_password is not None:
                out["ssl.key.password"] = sec.ssl_key_password.reveal()
    if sec.sasl:
        assert sec.sasl_password is not None
        out["sasl.mechanism"] = sec.sasl_mechanism
        out["sasl.username"] = sec.sasl_username
        out["sasl.password"] = sec.sasl_password.reveal()
    return out


def producer_options(brokers: Brokers, *, durable: bool = True) -> dict[str, Any]:
    """librdkafka's producer settings: ``confluent_options`` with the partitioner of Java's
    and aiokafka's producers (``murmur2_random``: murmur2 of the key, a record without a key
    to a random partition; librdkafka's default, ``consistent_random``, puts a key
    elsewhere), so a chat's records land on one partition whichever client produced them.
    ``durable``: acked by every in-sync replica (``acks=all``), idempotent (a retry is
    never written twice, nor out of order)."""
    out = {**confluent_options(brokers), "partitioner": "murmur2_random"}
    if durable:
        out.update({"acks": "all", "enable.idempotence": True})
    return out


def consumer_options(brokers: Brokers, group_id: str) -> dict[str, Any]:
    """librdkafka's consumer settings for a reader that assigns its partitions itself and
    commits nothing (librdkafka needs a ``group.id`` all the same; ``assign`` never joins
    the group): ``confluent_options``, auto-commit off, reset to the earliest offset."""
    return {
        **confluent_options(brokers),
        "group.id": group_id,
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "auto.offset.reset": "earliest",
    }


# -- the first contact -----------------------------------------------------------------------


class KafkaAuthError(ConnectionError):
    """The brokers answered but refused this client: a login refused, a certificate not
    trusted, a protocol the listener does not speak. The message names the setting."""


class _Errors(logging.Handler):
    """librdkafka's connection errors, as its ``error_cb`` reports them, and its warnings
    (a plaintext client cut off by a TLS listener is only a log line of librdkafka's)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.seen: list[Any] = []
        self._lock = threading.Lock()
        #: what librdkafka logs through (``logger``): kept here, never printed
        self.logger = logging.Logger("botmesh.streams.librdkafka")
        self.logger.addHandler(self)
        self.logger.propagate = False

    def __call__(self, err: Any) -> None:
        with self._lock:
            self.seen = [*self.seen[-49:], err]

    def emit(self, record: logging.LogRecord) -> None:
        with self._lock:
            self.seen = [*self.seen[-49:], record.getMessage()]

    def refusal(self, settings: KafkaSettings, *also: Any) -> KafkaAuthError | None:
        from confluent_kafka import KafkaError

        with self._lock:
            seen = [*self.seen, *also]
        sec = settings.security
        where = settings.bootstrap
        for err in seen:
            text = str(err.str() if hasattr(err, "str") else err)
            code = err.code() if hasattr(err, "code") else None
            if code == KafkaError._AUTHENTICATION or "SASL authentication" in text:
                return KafkaAuthError(
                    f"the brokers at {where!r} refused the login of KAFKA_SASL_USERNAME="
                    f"{sec.sasl_username!r} with {sec.sasl_mechanism} (wrong password in "
                    f"{sec.sasl_password_source}, an unknown user, or another mechanism in "
                    "KAFKA_SASL_MECHANISM)"
                )
            if "certificate verify failed" in text or code == getattr(KafkaError, "_SSL", None):
                if "mismatch" in text or "hostname" in text.lower():
                    return KafkaAuthError(
                        f"the certificate of the brokers at {where!r} does not name that host "
                        "(set KAFKA_BOOTSTRAP_SERVERS to a name the certificate holds, or "
                        "KAFKA_SSL_CHECK_HOSTNAME=false to check the CA only)"
                    )
                ca = repr(sec.ssl_cafile) if sec.ssl_cafile else "the system's CAs"
                return KafkaAuthError(
                    f"the certificate of the brokers at {where!r} is not signed by a CA in "
                    f"KAFKA_SSL_CAFILE ({ca}): point it at the CA that signed it"
                )
            if "SSL handshake failed" in text:
                return KafkaAuthError(
                    f"TLS with the brokers at {where!r} failed ({text}); check "
                    "KAFKA_SECURITY_PROTOCOL and KAFKA_SSL_CAFILE"
                )
        if not sec.tls:
            # cut off again and again right after connecting: a TLS (or SASL) listener
            cut = [e for e in seen if "Disconnected" in str(e) and "APIVERSION_QUERY" in str(e)]
            if len(cut) >= 3:
                return KafkaAuthError(
                    f"the brokers at {where!r} closed the connection at once: a TLS or SASL "
                    f"listener? KAFKA_SECURITY_PROTOCOL is {sec.protocol}; set it to what the "
                    "listener speaks (SSL, SASL_SSL, ...)"
                )
        return None


def connect_error(brokers: Brokers, exc: BaseException, timeout: float = 5.0) -> ConnectionError:
    """The error to raise when a client could not connect (``exc``): ``KafkaAuthError`` when a
    first contact finds the brokers refusing this client, else a ``ConnectionError`` naming
    the brokers. Blocking (up to ``timeout``)."""
    try:
        list_topics(brokers, timeout)
    except KafkaAuthError as refused:
        return refused
    except ConnectionError:
        pass
    return ConnectionError(f"cannot reach Kafka at {servers(brokers)!r}: {exc}; {broker_hint()}")


def local_kafka_script() -> Path | None:
    """``deploy/kafka/kafka.sh`` of the botmesh checkout this package runs from (an editable
    install, or the repository on ``PYTHONPATH``); ``None`` when botmesh was installed from
    a wheel or an sdist, which carry no ``deploy/``."""
    script = Path(__file__).resolve().parents[2] / "deploy" / "kafka" / "kafka.sh"
    return script if script.is_file() else None


def broker_hint() -> str:
    """What to check when no broker answers, for the way botmesh was installed: a checkout
    has its local Kafka script; an installed package does not, so that user is pointed at
    the settings, or at a checkout or Docker to try botmesh without a cluster."""
    script = local_kafka_script()
    if script is not None:
        return (
            f"is the broker running (`{script} start`, or `make kafka-start` in "
            f"{script.parents[2]}) and KAFKA_BOOTSTRAP_SERVERS (--bootstrap) right?"
        )
    return (
        "is KAFKA_BOOTSTRAP_SERVERS (--bootstrap) set to your brokers, and are they up? "
        "To try botmesh without a cluster: `docker run -p 9092:9092 apache/kafka`, or clone "
        "the botmesh repository and run `make run` (it starts a local Kafka from Maven Central)"
    )


def admin(brokers: Brokers, timeout: float = 10.0) -> Any:
    """A confluent-kafka admin client; its ``botmesh_errors`` collect connection errors."""
    from confluent_kafka.admin import AdminClient

    errors = _Errors()
    conf: dict[str, Any] = {
        **confluent_options(brokers),
        "socket.timeout.ms": int(timeout * 1000),
        "log_level": 6,  # its lines go to ``errors``, which prints none of them
        "logger": errors.logger,
        "error_cb": errors,
    }
    client: Any = AdminClient(conf)
    client.botmesh_errors = errors
    return client


def list_topics(brokers: Brokers, timeout: float = 10.0, client: Any = None) -> Any:
    """The cluster's metadata (``ClusterMetadata``); ``KafkaAuthError`` as soon as the
    brokers refuse this client, ``ConnectionError`` when they do not answer."""
    from confluent_kafka import KafkaException

    settings = settings_of(brokers)
    client = admin(settings, timeout) if client is None else client
    errors: _Errors | None = getattr(client, "botmesh_errors", None)
    deadline = time.monotonic() + timeout
    while True:
        step = max(0.1, min(1.0, deadline - time.monotonic()))
        try:
            return client.list_topics(timeout=step)
        except KafkaException as exc:
            client.poll(0)  # serves librdkafka's error callbacks (``errors``)
            first = exc.args[0] if exc.args else None
            refused = (errors or _Errors()).refusal(settings, *([first] if first else []))
            if refused is not None:
                raise refused from None
            if time.monotonic() >= deadline:
                raise ConnectionError(
                    f"cannot reach Kafka at {settings.bootstrap!r} "
                    f"({settings.security.describe()}): {exc}; {broker_hint()}"
                ) from None
