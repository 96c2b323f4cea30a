"""The bot of the flow kill test (``tests/kafka/test_flow_kills.py``), run by a real worker:

    botmesh worker --app tests.kafka.flow_bot:bot --provider tests.kafka.flow_bot:provider

``/start`` begins a persistent five-question flow. Question ``k`` is ``q<k>?``; its answer
must be ``a<k>-<chat id>`` (``validate``): any other text gets ``invalid q<k>`` and the flow
waits at the same question. After the fifth answer the flow says ``done <a1>,...,<a5>``. A
message outside a flow other than ``/start`` gets ``unexpected <text>``, which the test
counts as a failure (an answer the flow did not take).

The provider (``RecordedChannel``) POSTs each send, with its idempotency key, to the
test's recorder (``tests.kafka.recorder.Recorder``, ``$BOTMESH_TEST_RECORDER``) and can
answer, for a send the worker found in flight after a SIGKILL, whether its key reached the
recorder (``botmesh.state.ports.AmbiguityResolver``): so ``on_ambiguous="skip"`` never has to
guess, and a question must reach the channel exactly once. ``$BOTMESH_TEST_SEND_DELAY``
(seconds, default 0) is waited before each POST and again after its answer, so that kills
land inside sends: before the call (it never arrived) or after it (its answer lost).
"""

from __future__ import annotations

import asyncio
import json
import os
import urllib.parse
from collections.abc import Callable

from botmesh import Bot, Context, Conversation, Outbound, SendResult
from botmesh.errors import SendError
from tests.kafka.recorder import RECORDER_ENV, post_send

__all__ = [
    "QUESTIONS",
    "RecordedChannel",
    "answer",
    "bot",
    "done_text",
    "five_questions",
    "provider",
    "start",
]

QUESTIONS = 5

bot = Bot(
    "flow-kills",
    durability={
        # a replayed turn (its checkpoint lost, or a compare-and-set lost) charges an attempt
        "inbox": {"max_attempts": 20, "lease": "5s", "backoff": {"base": "50ms", "jitter": 0}},
        "outbox": {"on_ambiguous": "skip", "lease": "5s", "backoff": {"base": "50ms", "jitter": 0}},
    },
)


def answer(k: int, chat_id: str) -> str:
    """The valid answer to question ``k`` in ``chat_id``."""
    return f"a{k}-{chat_id}"


def done_text(chat_id: str) -> str:
    """The flow's last message, carrying every answer."""
    return "done " + ",".join(answer(k, chat_id) for k in range(1, QUESTIONS + 1))


def _is(want: str) -> Callable[[str], bool]:
    return lambda text: text == want


async def five_questions(conv: Conversation) -> list[str]:
    """The flow: five validated questions, then the answers in one message."""
    answers: list[str] = []
    for k in range(1, QUESTIONS + 1):
        answers.append(
            await conv.ask(f"q{k}?", validate=_is(answer(k, conv.chat_id)), invalid=f"invalid q{k}")
        )
    await conv.say("done " + ",".join(answers))
    return answers


five = bot.flow("five", persistent=True)(five_questions)


@bot.on_message
async def start(ctx: Context) -> None:
    """``/start`` starts the flow (by name: ``tests.shared._flow_replica`` registers the
    same two functions on a bot of its own); anything else is unexpected."""
    if ctx.text == "/start":
        await ctx.start_flow("five")
    else:
        await ctx.reply(f"unexpected {ctx.text}")


class RecordedChannel:
    """Sends to the test's recorder, keyed; asks it whether an ambiguous key arrived."""

    name = "recorder"
    text_limit: int | None = None

    def __init__(self, url: str, delay: float) -> None:
        self.url = url
        self.delay = delay

    async def send(self, message: Outbound) -> SendResult:
        raise SendError("RecordedChannel sends only keyed (send_keyed)")

    async def send_keyed(self, message: Outbound, key: str) -> SendResult:
        payload = {"chat_id": message.chat_id, "text": message.text, "key": key, "pid": os.getpid()}
        await asyncio.sleep(self.delay)
        try:
            got = await post_send(self.url, payload, 5.0)
        except (OSError, TimeoutError, ValueError) as exc:
            raise SendError(f"the recorder did not take the send: {exc!r}") from exc
        await asyncio.sleep(self.delay)
        return SendResult(str(got["message_id"]))

    async def resolve_ambiguous(
        self, message: Outbound, key: str, since: float
    ) -> SendResult | None:
        query = urllib.parse.urlencode({"key": key})
        found = await asyncio.to_thread(_get_json, f"{self.url}?{query}")
        return None if found is None else SendResult(str(found["message_id"]))


def _get_json(url: str) -> dict[str, str] | None:
    """The recorder's answer to a GET: its JSON on 200, None on 404 (raises otherwise)."""
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            data = json.loads(response.read())
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            return None
        raise
    if not isinstance(data, dict):
        raise ValueError(f"the recorder answered {data!r}")
    return data


def provider() -> RecordedChannel:
    """``--provider tests.kafka.flow_bot:provider``: sends go to ``$BOTMESH_TEST_RECORDER``."""
    url = os.environ.get(RECORDER_ENV, "")
    if not url:
        raise RuntimeError(f"set {RECORDER_ENV} to the URL of the test's recorder")
    return RecordedChannel(url, float(os.environ.get("BOTMESH_TEST_SEND_DELAY", "0")))
