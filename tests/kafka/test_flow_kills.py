"""Real SIGKILLs of workers in the middle of persistent five-question flows.

A real ``botmesh worker`` runs ``tests/kafka/flow_bot.py``: ``/start`` begins a persistent
flow of five validated questions (``q1?`` .. ``q5?``, then ``done <answers>``). This
process plays the users of ``CHATS`` chats: each chat first says ``hi`` (the handler
answers ``unexpected hi``: a message the handlers had before the flow), then ``/start``,
then answers each question when it reaches the channel (the recorder,
``tests.kafka.recorder.Recorder``, in this process), all through the inbound topic; one
chat in ``BAD_EVERY`` first answers one of its questions wrongly and gives the right
answer once ``invalid q<k>`` arrived. A worker is SIGKILLed ``KILLS`` times, each time once
the channel has seen a random number of sends plus a random fraction of a send's latency
(the provider waits ``DELAY`` s before each call and after its answer, so kills land
inside sends), the one that made the last send; it is restarted at once, as a supervisor
would (a static group member: it gets its partitions back). After ``JOIN_AFTER`` kills a
second worker joins the group, so chats move to it by rebalance in the middle of their
flows. The workers are stopped with SIGTERM at the end.

A restarted worker reads its partitions again from the last committed offsets: messages
done already come again (``Outcome.REPLAYED``). This test found that such a message was
taken by its chat's flow as the answer to the pending question (``hi`` or ``/start``
answering ``q2?``): it now goes where it went the first time (``botmesh.state.inbox.rerunning``).

The provider resolves ambiguous sends (``botmesh.state.ports.AmbiguityResolver``: it asks the
recorder whether the key arrived) and the bot runs with ``on_ambiguous="skip"``: a question
left in flight by a kill is sent again only when it never arrived. So the claim is exact:
per chat, each text (``unexpected hi``, each question, the invalid-answer note, the final
message with all five answers) reached the channel exactly once; no send settled ``dead``
or ``unknown``, nothing was dead-lettered, no ambiguous send was left to the policy. It
prints the figures: chats, kills, chats the joining worker answered, questions,
duplicates, lost, ambiguous sends found (resolved sent / resolved unsent, from the runs'
logs) and seconds. ``BOTMESH_TEST_KILL_SEED`` replays a run's kill moments.
"""

from __future__ import annotations

import asyncio
import collections
import os
import random
import time
from pathlib import Path

import pytest

from botmesh.state.messages import Inbound
from botmesh.streams.clients import AsyncProducer
from botmesh.topics import Catalog, chat_key, decode_receipt, encode_inbound
from tests.kafka.flow_bot import QUESTIONS, answer, done_text
from tests.kafka.recorder import SESSION_TIMEOUT, Call, Recorder, Tally
from tests.kafka.worker import WAIT_S, Worker, read_all, wait_line
from tests.soak import rounds

pytestmark = [pytest.mark.kafka, pytest.mark.crash, pytest.mark.soak]

CHATS = 24
KILLS = rounds(quick=3, soak=10)
#: Seconds the provider waits before each call and again after its answer.
DELAY = 0.03
#: After this many kills a second worker joins the group (chats move to it by rebalance).
JOIN_AFTER = 2
#: Set it to the seed a run printed to replay its kill moments.
SEED_ENV = "BOTMESH_TEST_KILL_SEED"
#: One chat in ``BAD_EVERY`` answers one question wrongly first.
BAD_EVERY = 3


class Ambiguity(collections.Counter[str]):
    """What a run's log says about the sends it found in flight (``botmesh.state.delivery``)."""

    def read(self, lines: list[str]) -> None:
        for line in lines:
            if "ambiguous send " in line and " says it went out" in line:
                self["resolved sent"] += 1
            elif "ambiguous send " in line and " says it never arrived" in line:
                self["resolved unsent"] += 1
            elif " is ambiguous and " in line and " cannot tell" in line:
                self["cannot tell"] += 1
            elif " is ambiguous after a crash" in line:
                self["guessed"] += 1


def expected(chat: str, bad: int | None) -> collections.Counter[str]:
    """Every text the channel must get in ``chat``, once each."""
    texts = ["unexpected hi"] + [f"q{k}?" for k in range(1, QUESTIONS + 1)] + [done_text(chat)]
    if bad is not None:
        texts.append(f"invalid q{bad}")
    return collections.Counter(texts)


class Users:
    """The chats' users: what each has said, and what to say next given the channel."""

    def __init__(self, chats: list[str]) -> None:
        self.chats = chats
        self.bad = {c: (i % QUESTIONS) + 1 for i, c in enumerate(chats) if i % BAD_EVERY == 0}
        self.said: set[str] = set()  # inbound ids produced

    def next_messages(self, calls: list[Call]) -> list[Inbound]:
        seen: dict[str, set[str]] = collections.defaultdict(set)
        for c in calls:
            seen[c.chat_id].add(c.text)
        out: list[Inbound] = []

        def say(chat: str, mid: str, text: str) -> None:
            if mid not in self.said:
                self.said.add(mid)
                out.append(Inbound(id=mid, chat_id=chat, text=text, sender="user", ts=time.time()))

        for chat in self.chats:
            say(chat, f"{chat}-hi", "hi")  # before the flow: the handler answers it
            if "unexpected hi" not in seen[chat]:
                continue
            say(chat, f"{chat}-start", "/start")
            for k in range(1, QUESTIONS + 1):
                if f"q{k}?" not in seen[chat]:
                    break
                if self.bad.get(chat) == k:
                    say(chat, f"{chat}-bad{k}", f"wrong{k}")
                    if f"invalid q{k}" not in seen[chat]:
                        break
                say(chat, f"{chat}-a{k}", answer(k, chat))
        return out

    def finished(self, calls: list[Call]) -> bool:
        done = {c.chat_id for c in calls if c.text == done_text(c.chat_id)}
        return done >= set(self.chats)


@pytest.mark.timeout(240)  # a hang guard: a healthy run takes well under a minute
async def test_sigkills_mid_flow_ask_each_question_once_and_lose_no_answer(
    kafka_bootstrap: str,
    topic_prefix: str,
    tmp_path: Path,
    recorder: Recorder,
    tally: Tally,
) -> None:
    cat = Catalog(topic_prefix)
    chats = [f"fk{i:02d}" for i in range(CHATS)]
    users = Users(chats)
    total = sum(sum(expected(c, users.bad.get(c)).values()) for c in chats)
    seed = int(os.environ.get(SEED_ENV) or random.randrange(1 << 30))
    rng = random.Random(seed)
    kill_at = sorted(rng.sample(range(5, total - 5), KILLS))
    ambiguity = Ambiguity()
    kills: list[int] = []  # the channel's send count at each kill

    def worker(instance: str) -> Worker:
        folder = tmp_path / f"w{instance}"
        folder.mkdir()
        return Worker(
            kafka_bootstrap,
            topic_prefix,
            folder,
            instance=instance,
            recorder=recorder.url,
            provider="tests.kafka.flow_bot:provider",
            app="tests.kafka.flow_bot:bot",
            loglevel="info",
            env={"BOTMESH_TEST_SEND_DELAY": str(DELAY), **SESSION_TIMEOUT},
        )

    workers = [worker("0")]
    joined: set[int] = set()  # the pids of the second worker's runs
    producer = AsyncProducer(kafka_bootstrap, settings={"linger.ms": 2})
    t0 = time.monotonic()
    try:
        workers[0].start()
        deadline = time.monotonic() + WAIT_S
        while not users.finished(calls := recorder.calls()):
            for w in workers:
                w.check_alive()
            tally.check()
            assert time.monotonic() < deadline, (
                f"not every chat finished its flow after {WAIT_S}s "
                f"({len(calls)} of {total} sends at the channel)"
            )
            sent = [
                await producer.send(cat.inbound, encode_inbound(m), key=chat_key(m.chat_id))
                for m in users.next_messages(calls)
            ]
            await asyncio.gather(*sent)  # every one acked (a refused record fails the test)
            if kill_at and len(calls) >= kill_at[0]:
                kill_at.pop(0)
                # the worker that made the last send (the other one, if any, goes on)
                victim = next((w for w in workers if w.pid == calls[-1].pid), workers[0])
                await asyncio.sleep(rng.uniform(0.0, 2 * DELAY))
                kills.append(len(recorder.calls()))
                victim.kill()  # reaped: its log is complete
                ambiguity.read(victim.lines())
                victim.start()  # as a supervisor would (a static member: its partitions back)
                if len(kills) == JOIN_AFTER:  # a second worker joins: chats move to it
                    workers.append(worker("1"))
                    workers[-1].start()
                joined |= {w.pid for w in workers[1:]}
                continue
            await asyncio.sleep(0.02)
        for w in workers:
            # a run started after the last kill may still be starting when every flow has
            # finished: its stop then is a clean one once it consumes
            wait_line(w, "worker started: ")
            assert w.stop() == 0, w.child.tail() if w.child else ""
            ambiguity.read(w.lines())
        moved = {c.chat_id for c in calls if c.pid in joined}
    finally:
        await producer.close()
        for w in workers:
            w.close()
    elapsed = time.monotonic() - t0

    calls = recorder.calls()
    per_chat: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    for c in calls:
        per_chat[c.chat_id][c.text] += 1
    duplicates = sum(n - 1 for counts in per_chat.values() for n in counts.values() if n > 1)
    lost = sum(1 for c in chats for t in expected(c, users.bad.get(c)) if per_chat[c][t] == 0)
    questions = sum(n for counts in per_chat.values() for t, n in counts.items() if t[0] == "q")
    # read back once the workers stopped (the follower may start before the topics have
    # partitions, and then sees nothing)
    receipts = [decode_receipt(m.value) for m in await read_all(kafka_bootstrap, cat.sent)]
    states = collections.Counter(str(r.state) for r in receipts)
    dead_letters = await read_all(kafka_bootstrap, cat.inbound_dlq)
    print(
        f"\n  flow kills: {CHATS} chats, {len(kills)} kills (at sends {kills}, seed {seed}), "
        f"{len(moved)} chats answered by the worker that joined after kill {JOIN_AFTER}, "
        f"{questions} questions at the channel for {CHATS * QUESTIONS}, {len(calls)} sends "
        f"for {total}, {duplicates} duplicates, {lost} lost, ambiguous "
        f"{sum(ambiguity.values())} {dict(ambiguity)}, receipts {dict(states)}, "
        f"{elapsed:.0f}s"
    )
    assert len(kills) == KILLS, f"only {len(kills)} of {KILLS} kills happened"
    wrong = {
        c: (
            per_chat[c] - expected(c, users.bad.get(c)),
            expected(c, users.bad.get(c)) - per_chat[c],
        )
        for c in chats
        if per_chat[c] != expected(c, users.bad.get(c))
    }
    example = {
        c: [(x.text, x.key, x.pid) for x in calls if x.chat_id == c] for c in list(wrong)[:2]
    }
    assert not wrong, (
        f"{len(wrong)} chats whose texts at the channel are not each expected one once "
        f"(extra, missing): { {c: (dict(e), dict(m)) for c, (e, m) in wrong.items()} }; "
        f"e.g. (text, key, worker pid) {example}"
    )
    assert set(per_chat) == set(chats), f"sends to other chats: {set(per_chat) - set(chats)}"
    assert states["sent"] >= total, f"fewer receipts than sends: {dict(states)}"
    assert not (set(states) - {"sent"}), f"sends not settled sent: {dict(states)}"
    assert not dead_letters, f"{len(dead_letters)} inbounds dead-lettered"
    assert ambiguity["cannot tell"] == ambiguity["guessed"] == 0, dict(ambiguity)
