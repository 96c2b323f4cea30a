"""The bot of the Kafka end-to-end tests and its provider, run by a real worker process:

    botmesh worker --app tests.kafka.bot:bot --provider tests.kafka.bot:provider

The handler appends ``<inbound id>`` to ``$BOTMESH_TEST_HANDLED`` on every run and replies
``echo <inbound id>: <text>`` (one send per inbound, key ``<inbound id>:1``); a message whose
text is ``fail`` makes it raise after recording the run (the runtime reports it and the
inbound counts as handled, with no send). The provider appends one JSON line per accepted
send to ``$BOTMESH_TEST_SENDS`` before it returns, so a test, a separate process, sees
every provider call, including one whose result the worker never recorded (it was killed);
it refuses for good (``RecipientUnreachableError``) a send whose text is ``refuse``, so the
send ends ``dead``.

``http_provider`` (``--provider tests.kafka.bot:http_provider``) records each send outside
the worker instead (and maps the recorder's refusals as a channel adapter maps its API's:
429 with ``Retry-After`` -> ``RateLimitedError``, another 4xx ->
``RecipientUnreachableError``, final; 5xx -> ``SendError``, retried): it POSTs ``{"chat_id",
"text", "key", "pid"}`` to the recorder of the test process
(``tests.kafka.recorder.Recorder``, URL in ``$BOTMESH_TEST_RECORDER``) and returns the
message id the recorder gives only once it answered (a time limit of
``$BOTMESH_TEST_RECORDER_TIMEOUT`` seconds, default 5, on connecting: a POST that could not
connect is a retryable ``SendError``; once written, the answer is awaited, however late, up
to a hang guard: ``tests.kafka.recorder.post_send``). It refuses ``refuse`` as the file
provider does, without a POST.

The inbox policy comes from the environment so a test can make a journal outage short or
long: ``BOTMESH_TEST_INBOX_ATTEMPTS`` (default 5), ``BOTMESH_TEST_INBOX_BACKOFF_MS`` (the base in
milliseconds, default 200; the cap is 4 x the base, no jitter); ``BOTMESH_TEST_LEASE`` (a
duration such as ``10s``) sets the inbox and outbox leases, so that a killed worker's
records are taken over sooner; ``BOTMESH_TEST_OUTBOX_INLINE`` (a duration) and
``BOTMESH_TEST_OUTBOX_RETRIES`` set ``outbox.inline_max`` and ``outbox.retries``, and
``BOTMESH_TEST_SWEEP_AT_ONCE`` ``outbox.sweep_at_once``;
``BOTMESH_TEST_KILL_AT_DEAD_LETTER`` (a file) makes the worker SIGKILL itself once, between
the journal's ``dead`` and its dead letter; ``BOTMESH_TEST_CRASH_MARKER`` (a file) makes the
handler SIGKILL the worker once, in the middle of a message whose text is ``crash``;
``BOTMESH_TEST_POISON`` (any value) makes it SIGKILL the worker every time it handles a
message whose text is ``poison``.

The module is an ordinary bot definition: ``botmesh.run(bot, FileProvider(path))`` runs it in
one process unchanged.
"""

from __future__ import annotations

import itertools
import json
import os
from typing import Any

from botmesh import Bot, Context, Outbound, SendResult
from botmesh.errors import RateLimitedError, RecipientUnreachableError, SendError
from tests.kafka.marks import append
from tests.kafka.recorder import RECORDER_ENV, HttpStatusError, post_send

__all__ = ["FileProvider", "HttpProvider", "bot", "http_provider", "provider", "reply_text"]


def _policy() -> dict[str, object]:
    attempts = int(os.environ.get("BOTMESH_TEST_INBOX_ATTEMPTS", "5"))
    base_ms = float(os.environ.get("BOTMESH_TEST_INBOX_BACKOFF_MS", "200"))
    backoff = {"base": f"{base_ms:g}ms", "cap": f"{base_ms * 4:g}ms", "jitter": 0}
    policy: dict[str, dict[str, object]] = {"inbox": {"max_attempts": attempts, "backoff": backoff}}
    policy["outbox"] = {}
    lease = os.environ.get("BOTMESH_TEST_LEASE", "").strip()
    if lease:  # the inbox and outbox leases (default 60s): how soon a dead holder's work moves
        policy["inbox"]["lease"] = lease
        policy["outbox"]["lease"] = lease
    inline = os.environ.get("BOTMESH_TEST_OUTBOX_INLINE", "").strip()
    if inline:  # how long a reply retries inline before the sweeper takes it (default 15 s)
        policy["outbox"]["inline_max"] = inline
    retries = os.environ.get("BOTMESH_TEST_OUTBOX_RETRIES", "").strip()
    if retries:
        policy["outbox"]["retries"] = int(retries)
    at_once = os.environ.get("BOTMESH_TEST_SWEEP_AT_ONCE", "").strip()
    if at_once:  # how many chats' due sends the sweeper delivers at a time (default 1)
        policy["outbox"]["sweep_at_once"] = int(at_once)
    return dict(policy)


bot = Bot("kafka-test", durability=_policy())


def _die_at_the_first_dead_letter(marker: str) -> None:
    """``BOTMESH_TEST_KILL_AT_DEAD_LETTER=<file>``: the worker SIGKILLs itself when its first
    dead letter is about to be produced (after the journal recorded the record dead, before
    the copy exists), once: the file marks that it happened."""
    import signal

    from botmesh.streams.sink import KafkaReceipts

    real = KafkaReceipts.dead_letter
    armed = [not os.path.exists(marker)]  # read once, at import

    async def dead_letter(self: KafkaReceipts, *args: Any, **kwargs: Any) -> Any:
        if armed[0]:
            append(marker, "killed")
            os.kill(os.getpid(), signal.SIGKILL)
        return await real(self, *args, **kwargs)

    KafkaReceipts.dead_letter = dead_letter  # type: ignore[method-assign]


if os.environ.get("BOTMESH_TEST_KILL_AT_DEAD_LETTER"):
    _die_at_the_first_dead_letter(os.environ["BOTMESH_TEST_KILL_AT_DEAD_LETTER"])


def reply_text(inbound_id: str, text: str | None) -> str:
    """What the handler sends for one inbound (unique per inbound, so a send is traceable)."""
    return f"echo {inbound_id}: {text}"


@bot.on_message
async def echo(ctx: Context) -> None:
    handled = os.environ.get("BOTMESH_TEST_HANDLED", "")
    if handled:
        append(handled, ctx.inbound_id)
    if ctx.text == "fail":
        raise RuntimeError("the handler failed on purpose")
    crash = os.environ.get("BOTMESH_TEST_CRASH_MARKER", "")
    if ctx.text == "crash" and crash and not os.path.exists(crash):  # noqa: ASYNC240
        append(crash, ctx.inbound_id)  # once: the marker says it happened
        os.kill(os.getpid(), 9)
    if ctx.text == "poison" and os.environ.get("BOTMESH_TEST_POISON"):
        os.kill(os.getpid(), 9)  # every time
    await ctx.reply(reply_text(ctx.inbound_id, ctx.text))


class FileProvider:
    """Accepts every send and appends ``{"chat_id", "text", "message_id"}`` to ``path``."""

    def __init__(self, path: str) -> None:
        self.name = "file"
        self.text_limit: int | None = None
        self.path = path
        self._ids = itertools.count(1)

    async def send(self, message: Outbound) -> SendResult:
        if (message.text or "").endswith(": refuse"):
            raise RecipientUnreachableError("the test provider refuses this send")
        mid = f"file-{os.getpid()}-{next(self._ids)}"
        line = {"chat_id": message.chat_id, "text": message.text, "message_id": mid}
        append(self.path, json.dumps(line))
        return SendResult(mid)


def provider() -> FileProvider:
    """The worker's ``--provider tests.kafka.bot:provider`` (a zero-argument factory)."""
    path = os.environ.get("BOTMESH_TEST_SENDS", "")
    if not path:
        raise RuntimeError("set BOTMESH_TEST_SENDS to the file that records the sends")
    return FileProvider(path)


class HttpProvider:
    """Accepts a send once the test's recorder (``url``) recorded it; refuses ``refuse``."""

    def __init__(self, url: str, timeout: float = 5.0) -> None:
        self.name = "recorder"
        self.text_limit: int | None = None
        self.url = url
        self.timeout = timeout

    async def send(self, message: Outbound) -> SendResult:
        if (message.text or "").endswith(": refuse"):
            raise RecipientUnreachableError("the test provider refuses this send")
        key = message.options.get("idempotency_key")
        payload = {
            "chat_id": message.chat_id,
            "text": message.text,
            "key": key if isinstance(key, str) else None,
            "pid": os.getpid(),
        }
        try:
            answer = await post_send(self.url, payload, self.timeout)
        except HttpStatusError as exc:  # mapped as a channel adapter maps its API's answers
            if exc.status == 429:
                raise RateLimitedError(str(exc), retry_after=exc.retry_after or 0.0) from exc
            if 400 <= exc.status < 500:
                raise RecipientUnreachableError(str(exc)) from exc
            raise SendError(str(exc)) from exc
        except (OSError, TimeoutError, ValueError) as exc:
            raise SendError(f"the recorder did not take the send: {exc!r}") from exc
        return SendResult(str(answer["message_id"]))


def http_provider() -> HttpProvider:
    """``--provider tests.kafka.bot:http_provider``: sends go to ``$BOTMESH_TEST_RECORDER``."""
    url = os.environ.get(RECORDER_ENV, "")
    if not url:
        raise RuntimeError(f"set {RECORDER_ENV} to the URL of the test's recorder")
    # the time limit is on connecting only: a POST the recorder may have taken is never
    # given up on after it (the retry would be recorded twice, a duplicate the worker
    # never made: the changelog showed such sends with attempts=2)
    timeout = float(os.environ.get("BOTMESH_TEST_RECORDER_TIMEOUT", "5"))
    return HttpProvider(url, timeout)
