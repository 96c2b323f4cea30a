"""A sign-up bot: a persistent conversation flow with validation, a timeout and cancel.

``/signup`` starts it; the bot asks a name, an email (asked again until it looks like
one), an age (a number, within 10 minutes, three tries), then confirms. ``/cancel`` stops
it at any question. The flow is checkpointed in the journal at every answer, so a crash,
a restart or the chat moving to another worker resumes it at the pending question, which
is not asked again. Other messages get a short help text.

A definition only: where it runs chooses the provider and the journal.

- on Kafka: ``botmesh worker --app botmesh.examples.signup_bot:bot`` (from the repository root),
  then ``botmesh produce`` messages such as ``/signup`` to one chat;
- in this process: ``async with botmesh.run(bot, provider, journal="file:///...") as app``
  and ``await app.handle(Inbound(id=..., chat_id=..., text="/signup"))``.

See docs/flows.md.
"""

from __future__ import annotations

import logging

from botmesh import Bot, Context, Conversation, FlowCancelled, FlowEndedEvent, FlowTimeout
from botmesh.errors import FlowInvalidAnswer

__all__ = ["bot", "signup"]

log = logging.getLogger("botmesh.examples.signup_bot")

bot = Bot("signup")


def _is_email(text: str) -> bool:
    name, at, domain = text.strip().partition("@")
    return bool(name and at and "." in domain)


def _age(text: str) -> int:
    age = int(text.strip())  # a ValueError re-asks
    if not 1 <= age <= 130:
        raise ValueError(f"{age} is not an age")
    return age


@bot.flow("signup", persistent=True, version=1, cancel=("/cancel",))
async def signup(conv: Conversation) -> dict[str, str] | None:
    """The questions, in order: plain code, re-run from its start at every answer (keep it
    deterministic; anything drawn at random goes in ``conv.state``)."""
    try:
        name = await conv.ask("Welcome! What is your name? (/cancel stops)")
        email = await conv.ask(
            f"Thanks {name}. Your email?",
            validate=_is_email,
            invalid="That is not an email address; try again.",
        )
        age = await conv.ask(
            "How old are you?",
            parse=_age,
            invalid="A number, please (for example 42).",
            timeout="10m",
            max_tries=3,
        )
    except FlowTimeout:
        await conv.say("No answer for 10 minutes: sign-up stopped. /signup starts again.")
        return None
    except FlowCancelled:
        await conv.say("Sign-up cancelled. /signup starts again.")
        return None
    except FlowInvalidAnswer:
        await conv.say("Three tries: sign-up stopped. /signup starts again.")
        return None
    conv.state["plan"] = "free"
    await conv.say(f"Signed up: {name} <{email}>, {age}, plan {conv.state['plan']}.")
    return {"name": name, "email": email, "age": str(age)}


@bot.when(lambda m: (m.text or "").strip() == "/signup")
async def start(ctx: Context) -> None:
    await ctx.start_flow(signup)


@bot.when(lambda m: (m.text or "").strip() != "/signup")
async def help_text(ctx: Context) -> None:
    await ctx.reply("Send /signup to sign up.")


@bot.on(FlowEndedEvent)
def ended(event: FlowEndedEvent) -> None:
    log.info("flow %s in chat %s ended %s", event.flow, event.chat_id, event.status)
    log.debug("flow %s in chat %s gave %r", event.flow, event.chat_id, event.result)  # answers
