"""``botmesh.streams.connection``: the security settings from the environment, librdkafka's
settings and the protocol client's TLS context made of them, and secrets that never show
(no broker here; ``test_secured.py`` runs them against a ``SASL_SSL`` listener)."""

from __future__ import annotations

import ssl
import subprocess
from pathlib import Path

import pytest

from botmesh.streams.config import WorkerConfig
from botmesh.streams.connection import (
    KafkaSettings,
    Secret,
    Security,
    confluent_options,
    settings_of,
)

PASSWORD = "pw-that-must-not-show"


@pytest.fixture
def ca(tmp_path: Path) -> Path:
    """A CA file the stdlib can load (a self-signed certificate that signs nothing)."""
    path = tmp_path / "ca.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-keyout", str(tmp_path / "ca-key.pem"), "-out", str(path), "-subj", "/CN=test ca"],
        check=True, capture_output=True,
    )  # fmt: skip
    return path


def sasl_ssl_env(tmp_path: Path, ca: Path, **more: str) -> dict[str, str]:
    secret = tmp_path / "password"
    secret.write_text(PASSWORD + "\n")
    return {
        "KAFKA_BOOTSTRAP_SERVERS": "b1:9093,b2:9093",
        "KAFKA_SECURITY_PROTOCOL": "sasl_ssl",
        "KAFKA_SASL_MECHANISM": "scram-sha-512",
        "KAFKA_SASL_USERNAME": "bot",
        "KAFKA_SASL_PASSWORD_FILE": str(secret),
        "KAFKA_SSL_CAFILE": str(ca),
        **more,
    }


def test_plaintext_is_the_default_and_asks_for_nothing() -> None:
    s = KafkaSettings.from_env({})
    assert (s.bootstrap, s.security.protocol) == ("127.0.0.1:9092", "PLAINTEXT")
    assert s.security.ssl_context is None
    assert confluent_options(s) == {
        "bootstrap.servers": "127.0.0.1:9092",
        "security.protocol": "PLAINTEXT",
    }
    assert settings_of("h:1").bootstrap == "h:1"


def test_sasl_ssl_in_each_dialect(tmp_path: Path, ca: Path) -> None:
    s = KafkaSettings.from_env(sasl_ssl_env(tmp_path, ca))
    sec = s.security
    assert (sec.protocol, sec.sasl_mechanism, sec.sasl_username) == (
        "SASL_SSL",
        "SCRAM-SHA-512",
        "bot",
    )
    assert sec.sasl_password == Secret(PASSWORD)  # the file's last newline dropped
    assert sec.sasl_password_source == "KAFKA_SASL_PASSWORD_FILE"
    context = sec.ssl_context  # the group protocol client's (``botmesh.streams.groups``)
    assert isinstance(context, ssl.SSLContext) and context.check_hostname
    assert context.verify_mode == ssl.CERT_REQUIRED
    rd = confluent_options(s)
    assert rd == {
        "bootstrap.servers": "b1:9093,b2:9093",
        "security.protocol": "SASL_SSL",
        "ssl.endpoint.identification.algorithm": "https",
        "ssl.ca.location": str(ca),
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": "bot",
        "sasl.password": PASSWORD,
    }


def test_the_hostname_check_can_be_turned_off(tmp_path: Path, ca: Path) -> None:
    env = sasl_ssl_env(tmp_path, ca, KAFKA_SSL_CHECK_HOSTNAME="false")
    s = KafkaSettings.from_env(env)
    assert confluent_options(s)["ssl.endpoint.identification.algorithm"] == "none"
    context = s.security.ssl_context
    assert context is not None and not context.check_hostname
    assert context.verify_mode == ssl.CERT_REQUIRED


def test_tls_alone_and_sasl_without_tls(tmp_path: Path, ca: Path) -> None:
    tls = KafkaSettings.from_env({"KAFKA_SECURITY_PROTOCOL": "SSL", "KAFKA_SSL_CAFILE": str(ca)})
    assert confluent_options(tls)["security.protocol"] == "SSL"
    assert "sasl.mechanism" not in confluent_options(tls)
    assert tls.security.ssl_context is not None
    env = {
        "KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
        "KAFKA_SASL_MECHANISM": "PLAIN",
        "KAFKA_SASL_USERNAME": "u",
        "KAFKA_SASL_PASSWORD": PASSWORD,
    }
    plain = KafkaSettings.from_env(env)
    assert plain.security.ssl_context is None
    assert "ssl.ca.location" not in confluent_options(plain)
    assert confluent_options(plain)["security.protocol"] == "SASL_PLAINTEXT"
    assert confluent_options(plain)["sasl.password"] == PASSWORD


def test_a_password_never_shows(tmp_path: Path, ca: Path) -> None:
    s = KafkaSettings.from_env(sasl_ssl_env(tmp_path, ca))
    config = WorkerConfig.from_env(sasl_ssl_env(tmp_path, ca))
    for text in (repr(s), str(s), repr(config), str(config.kafka), s.security.describe()):
        assert PASSWORD not in text, text
    assert repr(Secret(PASSWORD)) == str(Secret(PASSWORD)) == "Secret('***')"
    assert config.kafka == s


@pytest.mark.parametrize(
    ("env", "says"),
    [
        ({"KAFKA_SECURITY_PROTOCOL": "TLS"}, "KAFKA_SECURITY_PROTOCOL='TLS': use one of"),
        ({"KAFKA_SECURITY_PROTOCOL": "SASL_SSL"}, "KAFKA_SASL_MECHANISM not set"),
        (
            {"KAFKA_SECURITY_PROTOCOL": "SASL_SSL", "KAFKA_SASL_MECHANISM": "GSSAPI"},
            "KAFKA_SASL_MECHANISM 'GSSAPI'",
        ),
        (
            {"KAFKA_SECURITY_PROTOCOL": "SASL_SSL", "KAFKA_SASL_MECHANISM": "PLAIN"},
            "needs KAFKA_SASL_USERNAME and KAFKA_SASL_PASSWORD",
        ),
        ({"KAFKA_SASL_USERNAME": "u"}, "KAFKA_SECURITY_PROTOCOL is PLAINTEXT"),
        ({"KAFKA_SASL_PASSWORD_FILE": "/no/such/file"}, "KAFKA_SASL_PASSWORD_FILE='/no/such"),
        (
            {"KAFKA_SASL_PASSWORD": "a", "KAFKA_SASL_PASSWORD_FILE": "/x"},
            "KAFKA_SASL_PASSWORD and KAFKA_SASL_PASSWORD_FILE are both set",
        ),
        ({"KAFKA_SSL_CAFILE": "/no/such/ca.pem"}, "KAFKA_SSL_CAFILE='/no/such/ca.pem'"),
        ({"KAFKA_SSL_CHECK_HOSTNAME": "maybe"}, "KAFKA_SSL_CHECK_HOSTNAME='maybe'"),
    ],
)
def test_a_bad_setting_is_refused_naming_it(env: dict[str, str], says: str) -> None:
    with pytest.raises(ValueError) as caught:
        Security.from_env(env)
    assert says in str(caught.value)


def test_tls_files_with_plaintext_are_refused(ca: Path) -> None:
    with pytest.raises(ValueError, match="KAFKA_SSL_CAFILE set, but KAFKA_SECURITY_PROTOCOL"):
        Security.from_env({"KAFKA_SSL_CAFILE": str(ca)})
