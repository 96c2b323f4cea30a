"""``botmesh.settings``: one table of every setting, held to docs/configuration.md and to the
code; the configuration file and the ``_FILE`` secrets."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from botmesh.settings import (
    SETTINGS,
    apply_config_file,
    markdown_table,
    read_config_file,
    resolve_secret_files,
)

ROOT = Path(__file__).resolve().parent.parent
_ENV_NAME = re.compile(r"^(BOTMESH|KAFKA)_[A-Z0-9_]+$")


def test_the_configuration_page_table_is_the_generated_one() -> None:
    page = (ROOT / "docs" / "configuration.md").read_text()
    start, end = "<!-- settings:start -->\n", "\n<!-- settings:end -->"
    shown = page[page.index(start) + len(start) : page.index(end)]
    assert shown == markdown_table(), "regenerate it: python -m botmesh.settings"


def _env_names_the_code_reads() -> set[str]:
    """``BOTMESH_*`` and ``KAFKA_*`` names given as a call's argument anywhere in the
    package (``env.get("X")``, ``_float_env(env, "X", ...)``, ``_secret(env, "X")``)."""
    found = set()
    for file in (ROOT / "botmesh").rglob("*.py"):
        if "examples" in file.parts:  # the demo reads kafka.sh's KAFKA_PORT: not ours
            continue
        for node in ast.walk(ast.parse(file.read_text())):
            if not isinstance(node, ast.Call):
                continue
            if isinstance(node.func, ast.Attribute) and node.func.attr == "startswith":
                continue
            found |= {
                arg.value
                for arg in node.args
                if isinstance(arg, ast.Constant)
                and isinstance(arg.value, str)
                and _ENV_NAME.match(arg.value)
            }
    return found


def test_every_setting_the_code_reads_is_in_the_table_and_no_other() -> None:
    table = {s.env for s in SETTINGS}
    read = _env_names_the_code_reads()
    assert read - table == set(), "add these to botmesh/settings.py"
    ours = {n for n in table if _ENV_NAME.match(n)}
    assert ours - read - {"BOTMESH_CONFIG"} == set(), "the code reads these no more"
    assert "BOTMESH_TOPIC_WAIT" in read and "KAFKA_SASL_PASSWORD" in read  # the scan works


def test_each_setting_is_listed_once_with_a_file_key() -> None:
    names = [s.env for s in SETTINGS]
    assert len(names) == len(set(names))
    assert {s.key for s in SETTINGS if s.env == "KAFKA_SECURITY_PROTOCOL"} == {
        "kafka.security_protocol"
    }


def test_a_config_file_sets_what_the_environment_does_not(tmp_path: Path) -> None:
    config = tmp_path / "botmesh.toml"
    config.write_text(
        "[kafka]\n"
        'bootstrap_servers = "k1:9093"\n'
        'security_protocol = "SASL_SSL"\n'
        'sasl_password_file = "/run/secrets/pw"\n'
        "ssl_check_hostname = false\n"
        "[botmesh]\n"
        'topic_prefix = "shop"\n'
        "partitions = 12\n"
    )
    assert read_config_file(config) == {
        "KAFKA_BOOTSTRAP_SERVERS": "k1:9093",
        "KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
        "KAFKA_SASL_PASSWORD_FILE": "/run/secrets/pw",
        "KAFKA_SSL_CHECK_HOSTNAME": "false",
        "BOTMESH_TOPIC_PREFIX": "shop",
        "BOTMESH_PARTITIONS": "12",
    }
    env = {"BOTMESH_TOPIC_PREFIX": "from-env", "BOTMESH_CONFIG": str(config)}
    applied = apply_config_file(None, env)
    assert env["BOTMESH_TOPIC_PREFIX"] == "from-env"  # the environment wins
    assert env["KAFKA_BOOTSTRAP_SERVERS"] == "k1:9093" and env["BOTMESH_PARTITIONS"] == "12"
    assert "BOTMESH_TOPIC_PREFIX" not in applied


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ('[kafka]\nbootstrap = "x"\n', "no setting [kafka] bootstrap (KAFKA_BOOTSTRAP)"),
        ('[botmesh]\nprefix = "x"\n', "no setting [botmesh] prefix"),
        ('topic_prefix = "x"\n', "'topic_prefix' must be a table"),
        ("[botmesh]\ntopic_prefix = [1]\n", "must be a string, a number or true/false"),
        ("[botmesh\n", "not TOML"),
        ("[kafka]\nsasl_username_file = 'x'\n", "no setting [kafka] sasl_username_file"),
    ],
)
def test_a_bad_config_file_is_refused_naming_it(tmp_path: Path, text: str, says: str) -> None:
    config = tmp_path / "bad.toml"
    config.write_text(text)
    with pytest.raises(ValueError) as caught:
        read_config_file(config)
    assert str(config) in str(caught.value) and says in str(caught.value)


def test_secrets_come_from_files(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("tg-token-123\n")
    env = {"TELEGRAM_BOT_TOKEN_FILE": str(token), "KAFKA_SASL_PASSWORD_FILE": "/left/alone"}
    resolve_secret_files(env)
    assert env["TELEGRAM_BOT_TOKEN"] == "tg-token-123"
    assert "KAFKA_SASL_PASSWORD" not in env  # the Kafka settings read their own file
    with pytest.raises(ValueError, match="TELEGRAM_BOT_TOKEN and TELEGRAM_BOT_TOKEN_FILE"):
        resolve_secret_files({"TELEGRAM_BOT_TOKEN": "a", "TELEGRAM_BOT_TOKEN_FILE": str(token)})
    with pytest.raises(ValueError, match="DISCORD_BOT_TOKEN_FILE='/no/file': cannot read"):
        resolve_secret_files({"DISCORD_BOT_TOKEN_FILE": "/no/file"})


def _botmesh(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("KAFKA_", "BOTMESH_"))}
    return subprocess.run(
        [sys.executable, "-m", "botmesh", *args],
        cwd=ROOT,
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_the_commands_read_the_config_file(tmp_path: Path) -> None:
    config = tmp_path / "botmesh.toml"
    config.write_text('[botmesh]\njournal = "memory://"\n')
    out = _botmesh("--config", str(config), "worker", "--app", "tests.kafka.bot:bot", env={})
    assert out.returncode == 2, out.stderr
    assert "BOTMESH_JOURNAL 'memory://'" in out.stderr
    out = _botmesh("worker", "--app", "tests.kafka.bot:bot", env={"BOTMESH_CONFIG": str(config)})
    assert out.returncode == 2 and "BOTMESH_JOURNAL 'memory://'" in out.stderr
    config.write_text('[botmesh]\njournl = "kafka"\n')
    out = _botmesh("--config", str(config), "status", env={})
    assert out.returncode == 2 and "no setting [botmesh] journl" in out.stderr
