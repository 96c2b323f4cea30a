"""How every Kafka client of botmesh connects: the brokers and the security settings (TLS,
SASL), read once from the environment under the names of Kafka's own client settings, and
handed to each client library in its own dialect here and nowhere else.

=============================================  =====================================================
variable                                       meaning
=============================================  =====================================================
``KAFKA_BOOTSTRAP_SERVERS``                    ``host:port[,host:port...]`` (default
                                               ``127.0.0.1:9092``)
``KAFKA_SECURITY_PROTOCOL``                    ``PLAINTEXT`` (default), ``SSL``, ``SASL_PLAINTEXT``,
                                               ``SASL_SSL``
``KAFKA_SASL_MECHANISM``                       ``PLAIN``, ``SCRAM-SHA-256``, ``SCRAM-SHA-512`` or
                                               ``OAUTHBEARER`` (needed with a ``SASL_*`` protocol)
``KAFKA_SASL_USERNAME``                        the SASL user (PLAIN, SCRAM)
``KAFKA_SASL_PASSWORD``                        its password; or ``KAFKA_SASL_PASSWORD_FILE``: a file
                                               holding it (how Kubernetes and Docker hand secrets
                                               over)
``KAFKA_SASL_OAUTHBEARER_TOKEN_ENDPOINT_URL``  OAUTHBEARER (OIDC, client credentials grant): the
                                               identity provider's token endpoint (``https://``;
                                               ``http://`` on the loopback only)
``KAFKA_SASL_OAUTHBEARER_CLIENT_ID``           the client's id at the identity provider
``KAFKA_SASL_OAUTHBEARER_CLIENT_SECRET``       its secret; or
                                               ``KAFKA_SASL_OAUTHBEARER_CLIENT_SECRET_FILE``
``KAFKA_SASL_OAUTHBEARER_SCOPE``               the scope the token is asked for (optional)
``KAFKA_SASL_OAUTHBEARER_EXTENSIONS``          SASL extensions sent with the token,
                                               ``key=value[,key=value...]`` (optional)
``KAFKA_SSL_CAFILE``                           PEM file of the CAs that sign the brokers'
                                               certificates (default: the system's)
``KAFKA_SSL_CERTFILE``                         the client's certificate (PEM), for brokers that ask
                                               one
``KAFKA_SSL_KEYFILE``                          its private key (PEM)
``KAFKA_SSL_KEY_PASSWORD``                     the key's password; or
                                               ``KAFKA_SSL_KEY_PASSWORD_FILE``
``KAFKA_SSL_CHECK_HOSTNAME``                   ``true`` (default): the broker's certificate must
                                               name the host it was reached at; ``false`` checks the
                                               CA only
=============================================  =====================================================

A function that talks to Kafka takes ``Brokers``: a bootstrap string (the security settings
then come from the environment) or a ``KafkaSettings``. ``confluent_options`` turns it
into librdkafka's settings (``producer_options`` and ``consumer_options`` add theirs);
``admin`` builds the admin client and ``list_topics`` makes the first contact, which turns
a refused login, an unknown CA or a protocol mismatch into ``KafkaAuthError`` naming the
setting to fix. Passwords are ``Secret``: their ``repr`` and ``str`` never show them, and no
message here includes them.

With OAUTHBEARER, librdkafka fetches its tokens itself (``sasl.oauthbearer.method=oidc``):
a POST of the client credentials grant to the token endpoint, the client id and secret in
HTTP Basic auth, the ``access_token`` of the answer sent to the brokers and fetched again
before it expires. ``oauthbearer_token`` does the same for the Kafka protocol client of
``botmesh.streams.groups``.
"""

# ruff: noqa: PLC0415 - the Kafka clients load when a connection is made, not on import (the
# CLI imports this module for every command)
from __future__ import annotations

import base64
import binascii
import functools
import ipaddress
import json
import logging
import os
import re
import ssl
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
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
    "broker_hint",
    "confluent_options",
    "connect_error",
    "consumer_options",
    "list_topics",
    "local_kafka_script",
    "oauthbearer_token",
    "producer_options",
    "servers",
    "settings_of",
]

DEFAULT_BOOTSTRAP = "127.0.0.1:9092"
PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER")
OAUTHBEARER = "OAUTHBEARER"
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


_TOKEN_URL = "KAFKA_SASL_OAUTHBEARER_TOKEN_ENDPOINT_URL"
_CLIENT_ID = "KAFKA_SASL_OAUTHBEARER_CLIENT_ID"
_CLIENT_SECRET = "KAFKA_SASL_OAUTHBEARER_CLIENT_SECRET"
_SCOPE = "KAFKA_SASL_OAUTHBEARER_SCOPE"
_EXTENSIONS = "KAFKA_SASL_OAUTHBEARER_EXTENSIONS"
#: RFC 7628's extension key and value (what Kafka's brokers accept); ``auth`` is the token's
_EXTENSION_KEY = re.compile(r"[A-Za-z]+")
_EXTENSION_VALUE = re.compile(r"[\x21-\x7E \t]+")
#: RFC 6749's scope: tokens of printable ASCII but ``"`` and ``\``, one space apart; and
#: none of ``&``, ``+``, ``%``, which librdkafka would send unescaped in the form body
_SCOPE_TOKEN = re.compile(r"[\x21\x23\x24\x27-\x2A\x2C-\x5B\x5D-\x7E]+")


def _loopback(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _check_token_url(url: str) -> None:
    """An ``https://`` URL (``http://`` on the loopback: a local identity provider, tests)
    without credentials in it; ``ValueError`` naming the setting and the fix."""
    parts = urllib.parse.urlsplit(url)
    host = parts.hostname or ""
    try:
        parts.port  # noqa: B018 - raises on a port that is not a number
    except ValueError:
        host = ""
    if parts.scheme not in ("https", "http") or not host:
        raise ValueError(
            f"{_TOKEN_URL}={url!r}: not a URL; set it to the identity provider's token "
            "endpoint, https://host/path"
        )
    if parts.username is not None or parts.password is not None:
        raise ValueError(
            f"{_TOKEN_URL}: a user or password in the URL; give the client's id and secret in "
            f"{_CLIENT_ID} and {_CLIENT_SECRET} (or {_CLIENT_SECRET}_FILE) instead"
        )
    if parts.scheme == "http" and not _loopback(host):
        raise ValueError(
            f"{_TOKEN_URL}={url!r}: plain http to {host!r} would carry the client secret in "
            "clear; use https:// (http:// is taken on the loopback only)"
        )


def _check_scope(scope: str) -> None:
    if not all(_SCOPE_TOKEN.fullmatch(token) for token in scope.split(" ")):
        raise ValueError(
            f"{_SCOPE}={scope!r}: scopes are printable ASCII words one space apart, without "
            '", \\, &, + or %'
        )


def _check_extensions(extensions: str) -> None:
    for item in extensions.split(","):
        key, eq, value = item.partition("=")
        if not eq or not _EXTENSION_KEY.fullmatch(key) or key == "auth":
            raise ValueError(
                f"{_EXTENSIONS}: {item!r} is not key=value with a key of letters (not 'auth'); "
                "write key=value[,key=value...]"
            )
        if not _EXTENSION_VALUE.fullmatch(value):
            raise ValueError(
                f"{_EXTENSIONS}: the value of {key!r} must be printable ASCII (no comma)"
            )


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
    #: OAUTHBEARER (OIDC, the client credentials grant): the identity provider's token
    #: endpoint, the client's id and secret there, the scope asked for, SASL extensions
    sasl_oauthbearer_token_endpoint_url: str | None = None
    sasl_oauthbearer_client_id: str | None = None
    sasl_oauthbearer_client_secret: Secret | None = None
    #: the variable the client secret came from (``..._CLIENT_SECRET`` or ``..._FILE``)
    sasl_oauthbearer_client_secret_source: str = _CLIENT_SECRET
    sasl_oauthbearer_scope: str | None = None
    #: ``key=value[,key=value...]`` (librdkafka's ``sasl.oauthbearer.extensions``)
    sasl_oauthbearer_extensions: str | None = None

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
            if self.oauthbearer:
                self._check_oauthbearer()
            else:
                if not self.sasl_username or self.sasl_password is None:
                    raise ValueError(
                        f"{self.protocol} with {self.sasl_mechanism} needs KAFKA_SASL_USERNAME "
                        "and KAFKA_SASL_PASSWORD (or KAFKA_SASL_PASSWORD_FILE)"
                    )
                self._unused_with(self.sasl_mechanism or "", "OAUTHBEARER", **self._oidc())
        else:
            self._unused(
                "SASL_SSL (or SASL_PLAINTEXT)",
                KAFKA_SASL_MECHANISM=self.sasl_mechanism,
                KAFKA_SASL_USERNAME=self.sasl_username,
                KAFKA_SASL_PASSWORD=self.sasl_password,
                **self._oidc(),
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

    def _unused_with(self, mechanism: str, needs: str, **settings: object) -> None:
        """Refuse settings the mechanism does not use."""
        given = [name for name, value in settings.items() if value]
        if given:
            raise ValueError(
                f"{', '.join(given)} set, but KAFKA_SASL_MECHANISM is {mechanism}: set it to "
                f"{needs}, or unset them"
            )

    def _oidc(self) -> dict[str, object]:
        return {
            _TOKEN_URL: self.sasl_oauthbearer_token_endpoint_url,
            _CLIENT_ID: self.sasl_oauthbearer_client_id,
            _CLIENT_SECRET: self.sasl_oauthbearer_client_secret,
            _SCOPE: self.sasl_oauthbearer_scope,
            _EXTENSIONS: self.sasl_oauthbearer_extensions,
        }

    def _check_oauthbearer(self) -> None:
        missing = [
            name
            for name, value in (
                (_TOKEN_URL, self.sasl_oauthbearer_token_endpoint_url),
                (_CLIENT_ID, self.sasl_oauthbearer_client_id),
                (
                    f"{_CLIENT_SECRET} (or {_CLIENT_SECRET}_FILE)",
                    self.sasl_oauthbearer_client_secret
                    and self.sasl_oauthbearer_client_secret.reveal(),
                ),
            )
            if not value
        ]
        if missing:
            raise ValueError(
                f"{self.protocol} with OAUTHBEARER needs {', '.join(missing)}: the identity "
                "provider's token endpoint and the client it knows"
            )
        self._unused_with(
            "OAUTHBEARER",
            "PLAIN or SCRAM-SHA-256/512",
            KAFKA_SASL_USERNAME=self.sasl_username,
            KAFKA_SASL_PASSWORD=self.sasl_password,
        )
        assert self.sasl_oauthbearer_token_endpoint_url is not None
        _check_token_url(self.sasl_oauthbearer_token_endpoint_url)
        if self.sasl_oauthbearer_scope:
            _check_scope(self.sasl_oauthbearer_scope)
        if self.sasl_oauthbearer_extensions:
            _check_extensions(self.sasl_oauthbearer_extensions)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Security:
        env = os.environ if environ is None else environ
        protocol = env.get("KAFKA_SECURITY_PROTOCOL", "").strip().upper() or "PLAINTEXT"
        password, source = _secret(env, "KAFKA_SASL_PASSWORD")
        key_password, _ = _secret(env, "KAFKA_SSL_KEY_PASSWORD")
        client_secret, client_secret_source = _secret(env, "KAFKA_SASL_OAUTHBEARER_CLIENT_SECRET")
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
            sasl_oauthbearer_token_endpoint_url=(
                env.get("KAFKA_SASL_OAUTHBEARER_TOKEN_ENDPOINT_URL", "").strip() or None
            ),
            sasl_oauthbearer_client_id=env.get("KAFKA_SASL_OAUTHBEARER_CLIENT_ID", "").strip()
            or None,
            sasl_oauthbearer_client_secret=client_secret,
            sasl_oauthbearer_client_secret_source=client_secret_source,
            sasl_oauthbearer_scope=" ".join(env.get("KAFKA_SASL_OAUTHBEARER_SCOPE", "").split())
            or None,
            sasl_oauthbearer_extensions=env.get("KAFKA_SASL_OAUTHBEARER_EXTENSIONS", "").strip()
            or None,
        )

    @property
    def sasl(self) -> bool:
        return self.protocol.startswith("SASL_")

    @property
    def tls(self) -> bool:
        return self.protocol in ("SSL", "SASL_SSL")

    @property
    def oauthbearer(self) -> bool:
        return self.sasl and self.sasl_mechanism == OAUTHBEARER

    @functools.cached_property
    def ssl_context(self) -> ssl.SSLContext | None:
        """The TLS context of the Python protocol client (``botmesh.streams.groups``);
        ``None`` without TLS."""
        if not self.tls:
            return None
        context = ssl.create_default_context(cafile=self.ssl_cafile)
        context.check_hostname = self.ssl_check_hostname
        if self.ssl_certfile and self.ssl_keyfile:
            password = self.ssl_key_password.reveal() if self.ssl_key_password else None
            context.load_cert_chain(self.ssl_certfile, self.ssl_keyfile, password)
        return context

    def describe(self) -> str:
        """What a log line may say of it: the protocol, the mechanism and the user (with
        OAUTHBEARER: the client and the token endpoint)."""
        if self.oauthbearer:
            return (
                f"{self.protocol} OAUTHBEARER as client {self.sasl_oauthbearer_client_id} "
                f"(tokens from {_token_url_shown(self)})"
            )
        if self.sasl:
            return f"{self.protocol} {self.sasl_mechanism} as {self.sasl_username}"
        return self.protocol


def _token_url_shown(sec: Security) -> str:
    """The token endpoint as a message may name it: no query, no fragment."""
    parts = urllib.parse.urlsplit(sec.sasl_oauthbearer_token_endpoint_url or "")
    return urllib.parse.urlunsplit((parts.scheme, parts.netloc, parts.path, "", ""))


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
    if sec.oauthbearer:
        assert sec.sasl_oauthbearer_client_secret is not None
        out["sasl.mechanism"] = OAUTHBEARER
        # librdkafka fetches the tokens itself (client credentials grant), and again before
        # they expire, on a thread of its own
        out["sasl.oauthbearer.method"] = "oidc"
        out["sasl.oauthbearer.token.endpoint.url"] = sec.sasl_oauthbearer_token_endpoint_url
        out["sasl.oauthbearer.client.id"] = sec.sasl_oauthbearer_client_id
        out["sasl.oauthbearer.client.secret"] = sec.sasl_oauthbearer_client_secret.reveal()
        if sec.sasl_oauthbearer_scope:
            out["sasl.oauthbearer.scope"] = sec.sasl_oauthbearer_scope
        if sec.sasl_oauthbearer_extensions:
            out["sasl.oauthbearer.extensions"] = sec.sasl_oauthbearer_extensions
    elif sec.sasl:
        assert sec.sasl_password is not None
        out["sasl.mechanism"] = sec.sasl_mechanism
        out["sasl.username"] = sec.sasl_username
        out["sasl.password"] = sec.sasl_password.reveal()
    return out


def producer_options(brokers: Brokers, *, durable: bool = True) -> dict[str, Any]:
    """librdkafka's producer settings: ``confluent_options`` with the partitioner of Java's
    producer (``murmur2_random``: murmur2 of the key, a record without a key
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


# -- OAUTHBEARER tokens for the protocol client -------------------------------------------------

#: tokens fetched for the protocol client: by settings, the token and until when to use it
_TOKENS: dict[Security, tuple[str, float]] = {}
_TOKENS_LOCK = threading.Lock()
_OAUTH_ERROR = re.compile(r"[A-Za-z0-9_.\-]{1,64}")


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """A redirect is an error: followed, it would carry the client secret elsewhere."""

    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


def oauthbearer_token(sec: Security, timeout: float = 10.0) -> str:
    """An access token for ``sec`` (OAUTHBEARER), got as librdkafka gets its own: the client
    credentials grant at the token endpoint, the client id and secret in HTTP Basic auth.
    Kept until a minute before it expires. ``KafkaAuthError`` when the endpoint refuses
    the client, ``ConnectionError`` when it does not answer or gives no token; no message
    holds the secret or the token."""
    now = time.time()
    with _TOKENS_LOCK:
        held = _TOKENS.get(sec)
    if held is not None and held[1] > now:
        return held[0]
    token, expires = _fetch_token(sec, timeout)
    with _TOKENS_LOCK:
        if len(_TOKENS) > 16:
            _TOKENS.clear()
        _TOKENS[sec] = (token, expires - 60)
    return token


def _fetch_token(sec: Security, timeout: float) -> tuple[str, float]:
    """The token and when it expires (epoch seconds)."""
    shown = _token_url_shown(sec)
    client = sec.sasl_oauthbearer_client_id or ""
    secret = sec.sasl_oauthbearer_client_secret
    basic = base64.b64encode(f"{client}:{secret.reveal() if secret else ''}".encode()).decode()
    form = {"grant_type": "client_credentials"}
    if sec.sasl_oauthbearer_scope:
        form["scope"] = sec.sasl_oauthbearer_scope
    request = urllib.request.Request(
        sec.sasl_oauthbearer_token_endpoint_url or "",
        data=urllib.parse.urlencode(form).encode(),
        method="POST",
        headers={
            "Authorization": f"Basic {basic}",
            "Accept": "application/json",
            "Content-Type": "application/x-www-form-urlencoded",
        },
    )
    opener = urllib.request.build_opener(_NoRedirect)
    try:
        with opener.open(request, timeout=timeout) as answer:
            body = answer.read(1 << 20)
    except urllib.error.HTTPError as exc:
        why = f"HTTP {exc.code}{_oauth_error(exc)}"
        if exc.code in (400, 401, 403):
            raise KafkaAuthError(
                f"the token endpoint {shown!r} refused the client {_CLIENT_ID}={client!r} "
                f"({why}): check the client id, the secret in "
                f"{sec.sasl_oauthbearer_client_secret_source} and {_SCOPE}"
            ) from None
        raise ConnectionError(
            f"the token endpoint {shown!r} ({_TOKEN_URL}) gave no token: {why}"
        ) from None
    except (urllib.error.URLError, OSError) as exc:
        reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
        raise ConnectionError(
            f"cannot reach the token endpoint {shown!r} ({_TOKEN_URL}): {reason}"
        ) from None
    try:
        answer_json = json.loads(body)
        token = answer_json["access_token"]
        if not isinstance(token, str) or not token:
            raise TypeError
    except (ValueError, KeyError, TypeError):
        raise ConnectionError(
            f"the token endpoint {shown!r} ({_TOKEN_URL}) answered without an access_token"
        ) from None
    expires = _jwt_exp(token)
    if expires is None:
        lifetime = answer_json.get("expires_in")
        expires = time.time() + (float(lifetime) if isinstance(lifetime, int | float) else 120)
    return token, expires


def _oauth_error(exc: urllib.error.HTTPError) -> str:
    """``: <error>`` of an OAuth error answer (RFC 6749 5.2), when it is one; never more of
    the body (which could echo what was sent)."""
    try:
        error = json.loads(exc.read(65536)).get("error")
    except (ValueError, AttributeError, OSError):
        return ""
    return f": {error}" if isinstance(error, str) and _OAUTH_ERROR.fullmatch(error) else ""


def _jwt_exp(token: str) -> float | None:
    """The ``exp`` claim of a JWT, if the token is one."""
    parts = token.split(".")
    if len(parts) != 3:
        return None
    try:
        claims = json.loads(base64.urlsafe_b64decode(parts[1] + "=" * (-len(parts[1]) % 4)))
    except (ValueError, binascii.Error):
        return None
    exp = claims.get("exp") if isinstance(claims, dict) else None
    return float(exp) if isinstance(exp, int | float) else None


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
            if sec.oauthbearer:
                refused = _oauthbearer_refusal(settings, text, code == KafkaError._AUTHENTICATION)
                if refused is not None:
                    return refused
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


_NO_TOKEN = re.compile(
    r"(?:Failed to acquire SASL OAUTHBEARER token|Failed to retrieve OIDC token from \"[^\"]*\")"
    r": (?P<detail>.*)"
)


def _oauthbearer_refusal(
    settings: KafkaSettings, text: str, authentication: bool
) -> KafkaAuthError | None:
    """librdkafka's word that it got no token from the token endpoint, or that the brokers
    refused the token it got, as the message naming the settings to fix."""
    sec = settings.security
    client = f"{_CLIENT_ID}={sec.sasl_oauthbearer_client_id!r}"
    no_token = _NO_TOKEN.search(text)
    if no_token is not None:
        return KafkaAuthError(
            f"no OAUTHBEARER token from the token endpoint {_token_url_shown(sec)!r} "
            f"({_TOKEN_URL}): {_scrubbed(no_token['detail'], sec)}; check the URL, {client} "
            f"and the secret in {sec.sasl_oauthbearer_client_secret_source}"
        )
    if authentication or "SASL authentication" in text:
        detail = text.split("SASL authentication error:", 1)[-1].split(" (after ", 1)[0]
        return KafkaAuthError(
            f"the brokers at {settings.bootstrap!r} refused the OAUTHBEARER token of {client} "
            f"({_scrubbed(detail.strip(), sec)}): the token's subject, scope ({_SCOPE}) or "
            "lifetime is not what they require, or the listener takes another mechanism "
            "(KAFKA_SASL_MECHANISM)"
        )
    return None


def _scrubbed(text: str, sec: Security) -> str:
    """librdkafka's text, cut short, without the client secret (an endpoint could echo it)."""
    secret = sec.sasl_oauthbearer_client_secret
    if secret is not None and secret.reveal():
        text = text.replace(secret.reveal(), "***")
    return text if len(text) <= 300 else text[:300] + "..."


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


#: An admin client's idle connections are closed after this long (see ``admin``).
ADMIN_IDLE_MS = 5000


def admin(brokers: Brokers, timeout: float = 10.0) -> Any:
    """A confluent-kafka admin client; its ``botmesh_errors`` collect connection errors."""
    from confluent_kafka.admin import AdminClient

    errors = _Errors()
    conf: dict[str, Any] = {
        **confluent_options(brokers),
        "socket.timeout.ms": int(timeout * 1000),
        # A group request whose FindCoordinator was answered COORDINATOR_NOT_AVAILABLE three
        # times (a broker's first group request; a coordinator moving) stays behind in
        # librdkafka (2.16; its PR #3847 is open) until a connection changes state: without
        # one it waits out its whole timeout, and the client, destroyed once its broker is
        # gone, hangs (or trips a refcount assertion). A connection idle this long is
        # closed, and the request asked again on the next.
        "connections.max.idle.ms": ADMIN_IDLE_MS,
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
