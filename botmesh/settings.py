"""Every setting of botmesh in one place: its environment variable, its key in a
configuration file, its default and what it means (``SETTINGS``).

Settings come, strongest first, from the environment, then from a configuration file
(``botmesh --config botmesh.toml ...`` or ``BOTMESH_CONFIG``), then from the defaults. The
file is TOML; each table is the first word of the variables it sets and each key the rest,
in lower case::

    [kafka]
    bootstrap_servers = "kafka-1:9093"
    security_protocol = "SASL_SSL"
    sasl_mechanism = "SCRAM-SHA-512"
    sasl_username = "botmesh"
    sasl_password_file = "/run/secrets/kafka-password"

    [botmesh]
    topic_prefix = "shop"
    instance_id = "shop-0"

A key no setting has is refused, naming the file and the key. A secret (a password, a
token) can be handed over as a file instead: ``<NAME>_FILE`` names a file that holds it (how
Kubernetes and Docker pass secrets); setting both is refused.

``python -m botmesh.settings`` prints the table of docs/configuration.md, and
``tests/test_settings.py`` holds the two, and the code, to each other.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "SETTINGS",
    "Setting",
    "apply_config_file",
    "markdown_table",
    "read_config_file",
    "resolve_secret_files",
]


@dataclass(frozen=True, slots=True)
class Setting:
    env: str
    default: str
    meaning: str
    #: a secret: ``<env>_FILE`` may name a file that holds it
    secret: bool = False

    @property
    def key(self) -> str:
        """``table.key`` of the setting in a configuration file."""
        table, _, rest = self.env.partition("_")
        return f"{table.lower()}.{rest.lower()}"


def _s(env: str, default: str, meaning: str, *, secret: bool = False) -> Setting:
    return Setting(env, default, meaning, secret)


SETTINGS: tuple[Setting, ...] = (
    # -- the brokers and how to reach them (botmesh.streams.connection)
    _s("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:9092", "the brokers, `host:port[,host:port...]`"),
    _s(
        "KAFKA_SECURITY_PROTOCOL",
        "PLAINTEXT",
        "`PLAINTEXT`, `SSL`, `SASL_PLAINTEXT` or `SASL_SSL`",
    ),
    _s(
        "KAFKA_SASL_MECHANISM",
        "",
        "`PLAIN`, `SCRAM-SHA-256`, `SCRAM-SHA-512` or `OAUTHBEARER` (with `SASL_*`)",
    ),
    _s("KAFKA_SASL_USERNAME", "", "the SASL user (`PLAIN`, `SCRAM-*`)"),
    _s("KAFKA_SASL_PASSWORD", "", "its password", secret=True),
    _s(
        "KAFKA_SASL_OAUTHBEARER_TOKEN_ENDPOINT_URL",
        "",
        "`OAUTHBEARER` (OIDC): the identity provider's token endpoint, where the client "
        "credentials grant gets the tokens (`https://`; `http://` on the loopback only)",
    ),
    _s("KAFKA_SASL_OAUTHBEARER_CLIENT_ID", "", "`OAUTHBEARER`: the client's id there"),
    _s("KAFKA_SASL_OAUTHBEARER_CLIENT_SECRET", "", "its secret", secret=True),
    _s("KAFKA_SASL_OAUTHBEARER_SCOPE", "", "`OAUTHBEARER`: the scope the token is asked for"),
    _s(
        "KAFKA_SASL_OAUTHBEARER_EXTENSIONS",
        "",
        "`OAUTHBEARER`: SASL extensions sent with the token, `key=value[,key=value...]`",
    ),
    _s(
        "KAFKA_SSL_CAFILE",
        "the system's",
        "PEM file of the CAs that sign the brokers' certificates",
    ),
    _s("KAFKA_SSL_CERTFILE", "", "the client's certificate (PEM), for brokers that ask for one"),
    _s("KAFKA_SSL_KEYFILE", "", "its private key (PEM)"),
    _s("KAFKA_SSL_KEY_PASSWORD", "", "the private key's password", secret=True),
    _s(
        "KAFKA_SSL_CHECK_HOSTNAME",
        "true",
        "the brokers' certificates must name the host they are reached at; `false` checks "
        "the CA only",
    ),
    # -- every command
    _s("BOTMESH_CONFIG", "", "a configuration file (TOML) read before the commands run"),
    _s(
        "BOTMESH_TOPIC_PREFIX",
        "botmesh",
        "prefix of every topic name; the consumer group is `<prefix>.worker`",
    ),
    _s(
        "BOTMESH_DATA_DIR",
        "./botmesh-data",
        "the journal's RocksDB databases (the worker's); `botmesh run`'s journal",
    ),
    _s(
        "BOTMESH_PROVIDER",
        "console",
        "the provider: `console`, `mock`, a channel (`telegram`, `whatsapp`...) or "
        "`module:attribute`",
    ),
    _s(
        "BOTMESH_FALLBACK_PROVIDERS",
        "",
        "the channels a send's `Fallback` may go out through: provider specs as for "
        "`BOTMESH_PROVIDER`, comma-separated, each `name=spec` or a channel name",
    ),
    _s("BOTMESH_CONSOLE_QUIET", "", "`1`: the console provider counts sends without printing"),
    _s("BOTMESH_LOG_LEVEL", "info", "the worker's log level"),
    _s(
        "BOTMESH_LOG_FORMAT",
        "text",
        "the worker's and the gateway's log lines: `text` or `json` (one object a line, with "
        "the record's context; docs/operating.md)",
    ),
    # -- the worker (botmesh.streams.config.WorkerConfig)
    _s(
        "BOTMESH_JOURNAL",
        "kafka",
        "the worker's journal: `kafka` (on Kafka, shared by the group) or `file:///path` "
        "(one worker alone); never none, never `memory://`",
    ),
    _s(
        "BOTMESH_INSTANCE_ID",
        "the runtime's",
        "lease owner and static group member id, stable per replica, unique across them",
    ),
    _s(
        "BOTMESH_PROCESSING_GUARANTEE",
        "at_least_once",
        "`exactly_once`: the journal in Kafka transactions",
    ),
    _s("BOTMESH_PARTITIONS", "8", "partitions of the topics the worker creates"),
    _s("BOTMESH_REPLICATION", "1", "replication factor of the topics it creates"),
    _s("BOTMESH_BATCH_SIZE", "500", "records per processing batch"),
    _s(
        "BOTMESH_IN_FLIGHT",
        "1000",
        "records taken and not yet settled, over every batch; beyond, the worker takes no "
        "more (its fetch pauses) until some settle",
    ),
    _s(
        "BOTMESH_SESSION_TIMEOUT",
        "30",
        "seconds the group waits for a silent member before giving its partitions to others",
    ),
    _s(
        "BOTMESH_TOPIC_WAIT",
        "60",
        "seconds the worker waits at its start for the broker to list its topics; then it "
        "exits with status 2 naming them",
    ),
    _s(
        "BOTMESH_METRICS_INTERVAL",
        "10",
        "seconds between the worker's counters on `<prefix>.metrics` (and once at a clean stop)",
    ),
    _s(
        "BOTMESH_STOP_TIMEOUT",
        "30",
        "seconds a stop may take; then the worker prints its threads' stacks and exits with "
        "status 70, acking nothing unfinished",
    ),
    _s(
        "BOTMESH_RATE_LIMIT",
        "the channel's",
        "the channel's rate limit for the whole group of workers (`80/s`, `20/min`; `off`), "
        "each worker taking the part of it its share of the inbound partitions is; over the "
        "bot's `outbox.rate_limits.channel` (docs/rate-limits.md)",
    ),
    _s(
        "BOTMESH_CHAT_RATE_LIMIT",
        "the channel's",
        "the rate limit of one private chat (`1/s`; `off`), over the bot's "
        "`outbox.rate_limits.chat`",
    ),
    _s(
        "BOTMESH_GROUP_RATE_LIMIT",
        "the channel's",
        "the rate limit of one group chat (`20/min`; `off`), over the bot's "
        "`outbox.rate_limits.group`",
    ),
    _s(
        "BOTMESH_HTTP_HOST",
        "127.0.0.1",
        "the address of the worker's `/healthz`, `/readyz` and `/metrics` (`0.0.0.0` in a "
        "container)",
    ),
    _s("BOTMESH_HTTP_PORT", "", "their port (unset: not served)"),
    # -- the webhook gateway
    _s(
        "BOTMESH_GATEWAY_CHANNELS",
        "",
        "the channels whose webhooks the gateway serves, `telegram,whatsapp,...`",
    ),
    _s(
        "BOTMESH_GATEWAY_HOST",
        "127.0.0.1",
        "the gateway's address: its webhooks, `/healthz`, `/readyz`, `/metrics` (`0.0.0.0` in "
        "a container)",
    ),
    _s("BOTMESH_GATEWAY_PORT", "8080", "the gateway's port"),
    _s(
        "BOTMESH_GATEWAY_PUBLIC_URL",
        "",
        "the URL the channels call, without the channel path (Twilio signs it)",
    ),
    # -- the ops console (botmesh console)
    _s(
        "BOTMESH_CONSOLE_HOST",
        "127.0.0.1",
        "the ops console's address (`botmesh console`); another than this host's: give a token",
    ),
    _s("BOTMESH_CONSOLE_PORT", "8470", "the ops console's port"),
    _s(
        "BOTMESH_CONSOLE_TOKEN",
        "",
        "the operators' tokens, one a line, `NAME:TOKEN` or `TOKEN` (16 characters or more): "
        "needed to retry, replay or discard in the console; unset (and no `--token-file`): "
        "the console is read-only",
        secret=True,
    ),
    # -- traces, with the otel extra (botmesh.observability.tracing; the SDK reads its other
    # OTEL_* itself)
    _s(
        "OTEL_TRACES_EXPORTER",
        "",
        "span exporters, `otlp` (over HTTP), `console`...; set (not `none`): traces on",
    ),
    _s("OTEL_EXPORTER_OTLP_ENDPOINT", "", "the OTLP collector, `http://host:4318`; set: traces on"),
    _s(
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
        "",
        "the collector's traces URL (`.../v1/traces`); set: traces on",
    ),
    _s(
        "OTEL_SERVICE_NAME",
        "the process's: `botmesh-worker`, `botmesh-gateway`",
        "the traces' `service.name`",
    ),
    _s("OTEL_SDK_DISABLED", "", "`true`: traces off, whatever else is set"),
    # -- the channels' credentials (docs/channels.md)
    _s("TELEGRAM_BOT_TOKEN", "", "Telegram: the bot's token", secret=True),
    _s("TELEGRAM_WEBHOOK_SECRET", "", "Telegram: the webhook's `secret_token`", secret=True),
    _s("WHATSAPP_ACCESS_TOKEN", "", "WhatsApp Cloud: the access token", secret=True),
    _s("WHATSAPP_PHONE_NUMBER_ID", "", "WhatsApp Cloud: the sending number's id"),
    _s("META_APP_SECRET", "", "Meta webhooks (WhatsApp, Messenger, Instagram)", secret=True),
    _s("META_VERIFY_TOKEN", "", "Meta webhooks' verify token", secret=True),
    _s("MESSENGER_PAGE_TOKEN", "", "Messenger: the Page's token", secret=True),
    _s("INSTAGRAM_ACCESS_TOKEN", "", "Instagram: the linked Page's token", secret=True),
    _s("DISCORD_BOT_TOKEN", "", "Discord: the bot's token", secret=True),
    _s("DISCORD_PUBLIC_KEY", "", "Discord: the application's public key (webhooks)"),
    _s("TWILIO_ACCOUNT_SID", "", "Twilio: the account"),
    _s("TWILIO_AUTH_TOKEN", "", "Twilio: the auth token (sends and webhooks)", secret=True),
    _s("TWILIO_FROM", "", "Twilio: the sender, `+1...` or `whatsapp:+1...`"),
    _s("GUPSHUP_API_KEY", "", "Gupshup: the account's API key", secret=True),
    _s("GUPSHUP_SOURCE", "", "Gupshup: the app's registered number, `917834811114`"),
    _s("GUPSHUP_APP_NAME", "", "Gupshup: the app's name (`src.name`)"),
    _s(
        "GUPSHUP_WEBHOOK_SECRET",
        "",
        "Gupshup: the `?token=` of the app's callback URL (16+ characters)",
        secret=True,
    ),
    _s("GOHIGHLEVEL_TOKEN", "", "GoHighLevel: the location's token", secret=True),
    _s(
        "GOHIGHLEVEL_MESSAGE_TYPE",
        "SMS",
        "GoHighLevel: the sends' `type` (`SMS`, `WhatsApp`, `FB`, `IG`, `GMB`, `Live_Chat`...)",
    ),
    _s(
        "GOHIGHLEVEL_WEBHOOK_PUBLIC_KEY",
        "",
        "GoHighLevel: HighLevel's webhook public key (Ed25519, PEM)",
    ),
    _s("TIKTOK_ACCESS_TOKEN", "", "TikTok: the Business Account's access token", secret=True),
    _s("TIKTOK_BUSINESS_ID", "", "TikTok: the Business Account's `open_id`"),
    _s("TIKTOK_APP_SECRET", "", "TikTok: the developer app's secret (webhooks)", secret=True),
    _s(
        "EMAIL_SMTP_URL",
        "",
        "email: `smtp://user:pass@host:587?starttls=1`",
        secret=True,
    ),
    _s("EMAIL_FROM", "", "email: the sender address"),
    _s(
        "EMAIL_IMAP_URL",
        "",
        "email: the sent folder that resolves ambiguous sends, "
        "`imaps://user:pass@host:993/Sent` (options `also`, `append=1`, `grace`: "
        "docs/channels.md); unset: the `outbox.on_ambiguous` policy alone",
        secret=True,
    ),
    _s("EMAIL_WEBHOOK_SECRET", "", "email: the inbound webhook's secret", secret=True),
    _s("SLACK_SIGNING_SECRET", "", "Slack: the signing secret (webhooks)", secret=True),
    _s("BAILEYS_API_URL", "", "Baileys: the HTTP bridge's URL (`https://...`)"),
    _s(
        "BAILEYS_ALLOW_PLAIN_HTTP",
        "",
        "Baileys: `1` accepts an `http://` URL to a bridge on a private network (the "
        "credential travels in clear on it)",
    ),
    _s("BAILEYS_API_KEY", "", "Baileys: the bridge's API key (`x-api-key`)", secret=True),
    _s("BAILEYS_PHONE_NUMBER", "", "Baileys: the bridge connection's number, `+5511...`"),
    _s("BAILEYS_MEDIA_VIEW_ONCE", "0", "Baileys: `1` journals view-once media too"),
    _s(
        "BAILEYS_WEBHOOK_VERIFY_TOKEN",
        "",
        "Baileys: the connection's `webhookVerifyToken` (webhooks)",
        secret=True,
    ),
    _s("EVOLUTION_API_URL", "", "Evolution API: the server's URL (`https://...`)"),
    _s(
        "EVOLUTION_ALLOW_PLAIN_HTTP",
        "",
        "Evolution API: `1` accepts an `http://` URL to a bridge on a private network (the "
        "credential travels in clear on it)",
    ),
    _s(
        "EVOLUTION_API_KEY",
        "",
        "Evolution API: the instance's token or the global key (`apikey`)",
        secret=True,
    ),
    _s("EVOLUTION_INSTANCE", "", "Evolution API: the instance to send through"),
    _s(
        "EVOLUTION_WEBHOOK_SECRET",
        "",
        "Evolution API: the webhook's `jwt_key` (webhooks; else the body's `apikey`)",
        secret=True,
    ),
    _s("WPPCONNECT_API_URL", "", "WPPConnect: the server's URL (`https://...`)"),
    _s(
        "WPPCONNECT_ALLOW_PLAIN_HTTP",
        "",
        "WPPConnect: `1` accepts an `http://` URL to a bridge on a private network (the "
        "credential travels in clear on it)",
    ),
    _s("WPPCONNECT_TOKEN", "", "WPPConnect: the session's bearer token", secret=True),
    _s("WPPCONNECT_SESSION", "", "WPPConnect: the session to send through"),
    _s(
        "WPPCONNECT_WEBHOOK_SECRET",
        "",
        "WPPConnect: the `secret` parameter of the webhook URL (webhooks)",
        secret=True,
    ),
)

_BY_ENV = {s.env: s for s in SETTINGS}
#: Secrets whose ``_FILE`` form the Kafka settings read themselves (naming it in errors).
_READ_BY_CONNECTION = {
    "KAFKA_SASL_PASSWORD",
    "KAFKA_SSL_KEY_PASSWORD",
    "KAFKA_SASL_OAUTHBEARER_CLIENT_SECRET",
}


def _known(env: str) -> bool:
    if env in _BY_ENV:
        return True
    base = env.removesuffix("_FILE")
    return base != env and base in _BY_ENV and _BY_ENV[base].secret


def read_config_file(path: str | Path) -> dict[str, str]:
    """The settings of a TOML configuration file, by environment variable; ``ValueError``
    naming the file and what is wrong in it."""
    where = Path(path)
    try:
        data = tomllib.loads(where.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ValueError(f"config file {str(where)!r}: cannot read it ({exc.strerror})") from None
    except UnicodeDecodeError as exc:
        raise ValueError(
            f"config file {str(where)!r}: not UTF-8 (byte {exc.object[exc.start]:#04x} at "
            f"offset {exc.start}); TOML files are UTF-8: save it as UTF-8"
        ) from None
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"config file {str(where)!r}: not TOML: {exc}") from None
    out: dict[str, str] = {}
    for table, keys in data.items():
        if not isinstance(keys, dict):
            raise ValueError(
                f"config file {str(where)!r}: {table!r} must be a table ([{table}]) of "
                'settings, e.g. [kafka] bootstrap_servers = "..."'
            )
        for key, value in keys.items():
            env = f"{table}_{key}".upper()
            if not _known(env):
                raise ValueError(
                    f"config file {str(where)!r}: no setting [{table}] {key} ({env}); the "
                    "settings are listed in docs/configuration.md "
                    "(python -m botmesh.settings)"
                )
            if isinstance(value, bool):
                text = "true" if value else "false"
            elif isinstance(value, int | float | str):
                text = str(value)
            else:
                raise ValueError(
                    f"config file {str(where)!r}: [{table}] {key} must be a string, a number "
                    f"or true/false, not {type(value).__name__}"
                )
            out[env] = text
    return out


def apply_config_file(
    path: str | Path | None = None, environ: MutableMapping[str, str] | None = None
) -> dict[str, str]:
    """Read the configuration file (``path``, else ``BOTMESH_CONFIG``, else none) into
    ``environ`` (``os.environ``) under what the environment already sets; then resolve the
    ``_FILE`` secrets. What the file set."""
    env = os.environ if environ is None else environ
    source = path if path is not None else env.get("BOTMESH_CONFIG", "").strip() or None
    applied: dict[str, str] = {}
    if source is not None:
        for name, value in read_config_file(source).items():
            if name not in env:
                env[name] = value
                applied[name] = value
    resolve_secret_files(env)
    return applied


def resolve_secret_files(environ: MutableMapping[str, str] | None = None) -> None:
    """For each secret given as ``<NAME>_FILE``, set ``<NAME>`` to the file's content (its
    last newline dropped). Both set, or a file that cannot be read: ``ValueError`` naming
    the variable. The Kafka passwords are read where they are used, so left alone here."""
    env = os.environ if environ is None else environ
    for setting in SETTINGS:
        if not setting.secret or setting.env in _READ_BY_CONNECTION:
            continue
        path = env.get(f"{setting.env}_FILE", "").strip()
        if not path:
            continue
        if env.get(setting.env):
            raise ValueError(f"{setting.env} and {setting.env}_FILE are both set: keep one")
        try:
            env[setting.env] = Path(path).read_text(encoding="utf-8").rstrip("\r\n")
        except OSError as exc:
            raise ValueError(
                f"{setting.env}_FILE={path!r}: cannot read it ({exc.strerror or exc}); mount "
                "the secret there or fix the path"
            ) from None
        except UnicodeDecodeError as exc:
            raise ValueError(
                f"{setting.env}_FILE={path!r}: not UTF-8 (byte {exc.object[exc.start]:#04x} at "
                f"offset {exc.start}); write the secret there as UTF-8 text"
            ) from None


def markdown_table(settings: Mapping[str, Setting] | None = None) -> str:
    """The table of every setting (docs/configuration.md)."""
    rows = ["| variable | file key | default | meaning |", "|---|---|---|---|"]
    for s in (settings or _BY_ENV).values():
        name = f"`{s.env}`" + (f" / `{s.env}_FILE`" if s.secret else "")
        default = (
            f"`{s.default}`"
            if s.default and not s.default.startswith("the ")
            else (s.default or "unset")
        )
        rows.append(f"| {name} | `{s.key}` | {default} | {s.meaning} |")
    return "\n".join(rows)


if __name__ == "__main__":
    print(markdown_table())
