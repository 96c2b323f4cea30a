"""Shared pieces of the flow tests: a bot with a sign-up flow, and a chat driver."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from botmesh import (
    Bot,
    Context,
    Conversation,
    ErrorEvent,
    FlowEndedEvent,
    FlowTimeout,
    Inbound,
    Outcome,
)
from botmesh.journal import DurableKv
from botmesh.testing import ManualClock
from tests.kit import App, make_app, policy

QUESTIONS = ["q1 name?", "q2 email?", "q3 age?", "q4 city?", "q5 color?"]


@dataclass
class Seen:
    """What the bot's listeners and handlers saw."""

    ended: list[FlowEndedEvent] = field(default_factory=list)
    errors: list[ErrorEvent] = field(default_factory=list)
    handled: list[str] = field(default_factory=list)


def five_bot(
    *, persistent: bool = True, version: int = 1, seen: Seen | None = None, **opts: Any
) -> tuple[Bot, Seen]:
    """A bot whose ``/start`` begins a five-question flow; other messages are echoed."""
    seen = seen if seen is not None else Seen()
    bot = Bot("flows", durability=policy(**opts))
    bot.on(FlowEndedEvent, seen.ended.append)
    bot.on(ErrorEvent, seen.errors.append)

    @bot.flow("five", persistent=persistent, version=version)
    async def five(conv: Conversation) -> list[str]:
        answers = []
        for q in QUESTIONS:
            answers.append(await conv.ask(q))
        await conv.say("thanks " + ",".join(answers))
        return answers

    @bot.on_message
    async def start(ctx: Context) -> None:
        seen.handled.append(ctx.text or "")
        if ctx.text == "/start":
            await ctx.start_flow("five")
        else:
            await ctx.reply(f"echo {ctx.text}")

    return bot, seen


def signup_bot(seen: Seen | None = None, **opts: Any) -> tuple[Bot, Seen]:
    seen = seen if seen is not None else Seen()
    bot = Bot("signup", durability=policy(**opts))
    bot.on(FlowEndedEvent, seen.ended.append)
    bot.on(ErrorEvent, seen.errors.append)

    @bot.flow("signup", persistent=True)
    async def signup(conv: Conversation) -> dict[str, Any] | None:
        name = await conv.ask("name?")
        email = await conv.ask("email?", validate=lambda t: "@" in t, invalid="not an email")
        try:
            age = await conv.ask("age?", parse=int, timeout="10m", invalid="a number please")
        except FlowTimeout:
            await conv.say("timed out")
            return None
        conv.state["plan"] = "free"
        await conv.say(f"welcome {name}")
        return {"name": name, "email": email, "age": age}

    @bot.on_message
    async def handler(ctx: Context) -> None:
        seen.handled.append(ctx.text or "")
        if ctx.text == "/signup":
            await ctx.start_flow(signup)
        else:
            await ctx.reply(f"echo {ctx.text}")

    return bot, seen


class Chat:
    """Sends numbered messages to a runtime."""

    def __init__(self, app: App, chat_id: str = "c", prefix: str = "m") -> None:
        self.app = app
        self.chat_id = chat_id
        self.prefix = prefix
        self.n = 0

    async def say(self, text: str, chat_id: str | None = None) -> Outcome:
        self.n += 1
        mid = f"{self.prefix}{self.n}"
        message = Inbound(id=mid, chat_id=chat_id or self.chat_id, text=text)
        return await self.app.runtime.handle(message)


async def start_app(
    bot: Bot, *, kv: DurableKv | None = None, clock: ManualClock | None = None, provider: Any = None
) -> App:
    return await make_app(provider, kv=kv, clock=clock, bot=bot)
