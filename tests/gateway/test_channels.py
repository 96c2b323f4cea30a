"""The channel registry (``botmesh.providers.channels``) and ``botmesh worker --provider <channel>``
(``botmesh._cli.load.load_provider``), without the adapters of other channels: a test channel is
put in the registry where a test needs one."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Self

import pytest

from botmesh._cli.load import load_provider
from botmesh.providers import channels
from botmesh.providers.channels import CHANNELS, Channel, provider_from_env, webhook_from_env
from botmesh.providers.mock import MockProvider
from botmesh.providers.slack import SlackWebhook
from botmesh.state.errors import AppLoadError, ConfigError
from botmesh.state.messages import Outbound, SendResult

NAMES = [
    "baileys",
    "discord",
    "email",
    "evolution",
    "gohighlevel",
    "gupshup",
    "instagram",
    "messenger",
    "slack",
    "telegram",
    "tiktok",
    "twilio",
    "whatsapp",
    "wppconnect",
]


class FakeChannelProvider:
    """A provider built from the environment, as the adapters are."""

    name = "fakechan"
    text_limit: int | None = 100

    def __init__(self, token: str) -> None:
        self.token = token

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Self:
        if not env.get("FAKECHAN_TOKEN"):
            raise ConfigError("FAKECHAN_TOKEN", "not set")
        return cls(env["FAKECHAN_TOKEN"])

    async def send(self, message: Outbound) -> SendResult:
        return SendResult("1")


@pytest.fixture
def fakechan(monkeypatch: pytest.MonkeyPatch) -> None:
    entry = Channel("fakechan", f"{__name__}:FakeChannelProvider", None)
    monkeypatch.setitem(channels.CHANNELS, "fakechan", entry)


def test_the_registry_names_every_channel_as_module_and_class() -> None:
    assert sorted(CHANNELS) == NAMES
    for name, entry in CHANNELS.items():
        assert entry.name == name and entry.webhook is not None
        assert entry.webhook.startswith(f"botmesh.providers.{name}:")
        if entry.provider is not None:
            module, _, cls = entry.provider.partition(":")
            assert module == f"botmesh.providers.{name}" and cls.endswith("Provider")
    assert CHANNELS["slack"].provider is None
    assert CHANNELS["whatsapp"].provider == "botmesh.providers.whatsapp:WhatsAppProvider"


def test_an_unknown_channel_lists_the_known_ones() -> None:
    with pytest.raises(ConfigError) as caught:
        webhook_from_env("icq", {})
    assert caught.value.field == "channel"
    assert all(name in str(caught.value) for name in NAMES)
    with pytest.raises(ConfigError, match="known channels: baileys, discord, email"):
        provider_from_env("icq", {})


def test_the_slack_webhook_comes_from_the_environment() -> None:
    hook = webhook_from_env("Slack", {"SLACK_SIGNING_SECRET": "s"})
    assert isinstance(hook, SlackWebhook)
    with pytest.raises(ConfigError, match="SLACK_SIGNING_SECRET"):
        webhook_from_env("slack", {})


def test_slack_has_no_sending_adapter() -> None:
    with pytest.raises(ConfigError, match="no sending adapter") as caught:
        provider_from_env("slack", {})
    assert "telegram" in str(caught.value)


def test_a_channel_provider_comes_from_its_from_env(fakechan: None) -> None:
    provider = provider_from_env("fakechan", {"FAKECHAN_TOKEN": "t0k"})
    assert isinstance(provider, FakeChannelProvider) and provider.token == "t0k"
    with pytest.raises(ConfigError, match="FAKECHAN_TOKEN"):
        provider_from_env("fakechan", {})


def test_a_missing_adapter_module_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    entry = Channel("ghost", "providers.ghost:GhostProvider", "providers.ghost:GhostWebhook")
    monkeypatch.setitem(channels.CHANNELS, "ghost", entry)
    with pytest.raises(ConfigError, match=r"cannot import providers\.ghost"):
        provider_from_env("ghost", {})
    with pytest.raises(ConfigError, match=r"cannot import providers\.ghost"):
        webhook_from_env("ghost", {})


def test_worker_provider_takes_a_channel_name(
    fakechan: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKECHAN_TOKEN", "abc")
    provider = load_provider("fakechan")
    assert isinstance(provider, FakeChannelProvider) and provider.token == "abc"
    monkeypatch.delenv("FAKECHAN_TOKEN")
    with pytest.raises(AppLoadError, match="--provider 'fakechan': FAKECHAN_TOKEN: not set"):
        load_provider("fakechan")
    with pytest.raises(AppLoadError, match="BOTMESH_PROVIDER 'fakechan': FAKECHAN_TOKEN"):
        load_provider("fakechan", "BOTMESH_PROVIDER")


def test_worker_provider_keeps_its_other_forms(monkeypatch: pytest.MonkeyPatch) -> None:
    assert isinstance(load_provider("mock"), MockProvider)
    assert isinstance(load_provider("botmesh.providers.mock:MockProvider"), MockProvider)
    with pytest.raises(AppLoadError, match=r"--provider 'slack': provider: .*no sending adapter"):
        load_provider("slack")
    for name in ("TELEGRAM_BOT_TOKEN", "TELEGRAM_API_URL"):
        monkeypatch.delenv(name, raising=False)
    # the module not there yet, or there without its token: either way an error naming it
    with pytest.raises(AppLoadError, match=r"--provider 'telegram': .*TELEGRAM|telegram"):
        load_provider("telegram")
    with pytest.raises(AppLoadError, match="a channel"):
        load_provider("icq")
