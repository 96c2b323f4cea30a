"""``SignedWebhook``: the webhooks checked with a secret of their channel keep it to
themselves and say what to set when it is missing, each the same way (five hand-written
copies before)."""

from __future__ import annotations

import pytest

from botmesh.providers.email import EmailWebhook
from botmesh.providers.gupshup import GupshupWebhook
from botmesh.providers.slack import SlackWebhook
from botmesh.providers.tiktok import TikTokWebhook
from botmesh.providers.twilio import TwilioWebhook
from botmesh.providers.webhooks import ChannelWebhook, SignedWebhook, WebhookRequest
from botmesh.state.errors import ConfigError

SIGNED: list[type[SignedWebhook]] = [
    EmailWebhook,
    GupshupWebhook,
    SlackWebhook,
    TikTokWebhook,
    TwilioWebhook,
]
SECRET = "s3cr3t-" + "x" * 24


@pytest.mark.parametrize("hook", SIGNED, ids=lambda h: h.channel)
def test_the_secret_is_read_from_its_variable_and_never_shown(
    hook: type[SignedWebhook],
) -> None:
    made = hook.from_env({hook.SECRET_ENV: f"  {SECRET}\n"})
    assert isinstance(made, ChannelWebhook)
    assert SECRET not in repr(made) and f"{hook.SECRET_NAME}=***" in repr(made)
    request = WebhookRequest("POST", f"/{hook.channel}", "https://x.example", {}, {}, b"")
    assert made.handshake(request) is None  # a signed POST is no handshake


@pytest.mark.parametrize("hook", SIGNED, ids=lambda h: h.channel)
def test_a_missing_or_short_secret_names_the_variable_and_the_fix(
    hook: type[SignedWebhook],
) -> None:
    with pytest.raises(ConfigError, match=rf"{hook.SECRET_ENV}.*is not set; \w"):
        hook.from_env({hook.SECRET_ENV: "  "})
    with pytest.raises(
        ConfigError, match=rf"{hook.channel}\.{hook.SECRET_NAME}.*{hook.SECRET_ENV}"
    ):
        hook("")
    if hook.MIN_SECRET > 1:
        short = "x" * (hook.MIN_SECRET - 1)
        with pytest.raises(ConfigError, match=rf"shorter than {hook.MIN_SECRET} characters"):
            hook.from_env({hook.SECRET_ENV: short})
