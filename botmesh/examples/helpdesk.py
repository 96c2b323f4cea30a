"""A durable helpdesk bot, the README's example: the module defines the bot, a runtime runs
it. ``botmesh run --app botmesh.examples.helpdesk:bot`` runs it in this process (one message per
line of stdin); ``botmesh worker --app botmesh.examples.helpdesk:bot`` runs the same bot on Kafka.
"""

from botmesh import Bot, Context, DeadEvent

bot = Bot(
    "helpdesk",
    durability={"outbox": {"retries": 5, "backoff": {"base": "1s", "cap": "1m"}}},
)


@bot.on_message
async def answer(ctx: Context) -> None:
    await ctx.reply("Thanks, a human will look at it.")  # key "<message id>:1"
    await ctx.enqueue(ctx.chat_id, "Still there?", idempotency_key=f"nudge:{ctx.chat_id}")


@bot.on(DeadEvent)
def alert(event: DeadEvent) -> None:
    print("dead letter:", event.kind, event.id, event.reason, event.error)
