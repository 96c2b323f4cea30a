"""Persistent flows on two replicas sharing one journal, one replica SIGKILLed mid-flow.

Two processes (``tests/shared/_flow_replica.py``: the in-process runtime on a shared SQLite
or PostgreSQL journal) run the five-question flow of ``tests/kafka/flow_bot.py``. This
process plays the users of ``CHATS`` chats: each chat's messages (``/start``, then each
answer once its question reached the channel; one chat in ``BAD_EVERY`` answers one question
wrongly first and answers again after ``invalid q<k>``) go to the replicas alternately, so
a flow goes on on whichever replica gets the answer. A user sends the next message once the
previous one is done in the journal (a turn of one chat at a time: the test holds with or
without turn locks across replicas). Once the channel has seen a random share of the sends
(within the first two fifths), replica ``r1`` is SIGKILLed a random moment after it starts
its next send (the channel waits ``DELAY`` before and after each send, so the kill lands
inside one) and restarted; what ``r1`` was given and did not finish is given to ``r2``
again (as a channel retries an unanswered delivery), and ``r2`` takes over ``r1``'s records
once their leases (1 s) expired.

Per chat, each text reached the channel exactly once (each question, the invalid-answer
note, the final ``done`` message with all five answers): the channel resolves ambiguous
sends (``on_ambiguous="skip"`` never guesses). Every inbound ends done, every send
``sent``, every flow ``done``. It prints the figures.
"""

from __future__ import annotations

import asyncio
import collections
import json
import os
import random
import time
from pathlib import Path
from typing import Any

import pytest

from tests.backends import BACKENDS, BackendHandle
from tests.kafka.flow_bot import QUESTIONS, answer, done_text
from tests.kill import Child, python
from tests.shared._flow_replica import DELAY

pytestmark = pytest.mark.crash

CHATS = 16
KILLS = 3
#: Set it to the seed a run printed to replay its kill moments.
SEED_ENV = "BOTMESH_TEST_KILL_SEED"
#: One chat in ``BAD_EVERY`` answers one question wrongly first.
BAD_EVERY = 3
LIMIT_S = 120.0  # a hang guard only


class Replica:
    def __init__(self, child: Child, name: str) -> None:
        self.child = child
        self.name = name
        self.given: list[str] = []  # inbound ids given to it

    def tell(self, line: str) -> None:
        proc = self.child.proc
        assert proc is not None and proc.stdin is not None
        proc.stdin.write(line + "\n")
        proc.stdin.flush()

    def marked(self, word: str) -> set[str]:
        return {line.split()[1] for line in list(self.child.lines) if line.startswith(word + " ")}


def script(chat: str, bad: int | None) -> list[tuple[str, str, str | None]]:
    """A chat's messages in order: (inbound id, text, the text at the channel it waits for)."""
    out: list[tuple[str, str, str | None]] = [(f"{chat}-start", "/start", None)]
    for k in range(1, QUESTIONS + 1):
        if bad == k:
            out.append((f"{chat}-bad{k}", f"wrong{k}", f"q{k}?"))
            out.append((f"{chat}-a{k}", answer(k, chat), f"invalid q{k}"))
        else:
            out.append((f"{chat}-a{k}", answer(k, chat), f"q{k}?"))
    return out


def expected(chat: str, bad: int | None) -> collections.Counter[str]:
    texts = [f"q{k}?" for k in range(1, QUESTIONS + 1)] + [done_text(chat)]
    if bad is not None:
        texts.append(f"invalid q{bad}")
    return collections.Counter(texts)


def channel_log(folder: Path) -> list[dict[str, Any]]:
    file = folder / "sent.log"
    if not file.exists():
        return []
    return [json.loads(line) for line in file.read_text().splitlines() if line.endswith("}")]


async def _create(name: str, path: Path) -> None:
    handle = BackendHandle(BACKENDS[name], path)
    await handle.open()
    await handle.close()


@pytest.mark.parametrize(
    "backend_name", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
)
def test_a_replica_killed_mid_flow_asks_nothing_twice_and_loses_no_answer(
    backend_name: str, tmp_path: Path
) -> None:
    path = tmp_path / "journal"
    asyncio.run(_create(backend_name, path))  # the server (if any) starts in this process
    chats = [f"fr{i:02d}" for i in range(CHATS)]
    bad = {c: (i % QUESTIONS) + 1 for i, c in enumerate(chats) if i % BAD_EVERY == 0}
    scripts = {c: script(c, bad.get(c)) for c in chats}
    total = sum(sum(expected(c, bad.get(c)).values()) for c in chats)
    seed = int(os.environ.get(SEED_ENV) or random.randrange(1 << 30))
    rng = random.Random(seed)
    # The chats move in step, about CHATS sends a round (a chat's next message waits for
    # the last one to be done), and a kill lands at r1's first send after its share is
    # reached: up to a round later (two on a loaded machine), and the next kill's round is
    # one later still. Shares up to 5/6 of the sends left the last kill without an r1 send
    # to land in (CI: 2 of 3 kills); up to 1/2, 66 runs (up to three at once) made all
    # three but the last came as late as the 96th of 102 sends; up to 2/5, 30 runs (three
    # at once) made all three by the 73rd.
    kill_at = sorted(rng.sample(range(total // 6, total * 2 // 5), KILLS))

    def replica(name: str) -> Replica:
        argv = python(
            "-m", "tests.shared._flow_replica", backend_name, str(path), name, str(tmp_path)
        )
        return Replica(Child(argv, stdin=True).start(), name)

    r1, r2 = replica("r1"), replica("r2")
    everyone = [r1, r2]  # every incarnation, for their DONE lines
    kills: list[tuple[int, int]] = []  # (sends at the channel, r1's unfinished inbounds)
    fed: dict[str, int] = dict.fromkeys(chats, 0)  # per chat: messages given so far
    armed: int | None = None  # r1's output line count when a kill was armed
    t0 = time.monotonic()
    try:
        for r in (r1, r2):
            r.child.wait_for("ready")
        deadline = time.monotonic() + LIMIT_S

        def finished() -> set[str]:
            return set().union(*(r.marked("DONE") for r in everyone))

        def give(r: Replica, mid: str) -> None:
            c = mid.split("-", maxsplit=1)[0]
            text = next(t for i, t, _ in scripts[c] if i == mid)
            r.given.append(mid)
            r.tell(f"in {mid} {c} {text}")
            r.tell(f"wait {mid}")

        while True:
            log = channel_log(tmp_path)
            seen: dict[str, set[str]] = collections.defaultdict(set)
            for line in log:
                seen[line["chat"]].add(line["text"])
            if all(done_text(c) in seen[c] for c in chats):
                break
            assert time.monotonic() < deadline, f"not every flow done after {LIMIT_S}s"
            done = finished()
            for r in (r1, r2):
                assert r.child.alive(), f"{r.name} exited: {r.child.tail()}"
                assert not r.marked("ERR"), f"{r.name}: {r.child.tail()}"
            for c in chats:
                n = fed[c]
                if n == len(scripts[c]):
                    continue
                mid, _, after = scripts[c][n]
                if n > 0 and scripts[c][n - 1][0] not in done:
                    continue
                if after is not None and after not in seen[c]:
                    continue
                give((r1, r2)[(n + int(c[2:])) % 2], mid)  # alternately
                fed[c] = n + 1
            busy = [mid for mid in r1.given if mid not in done]
            if armed is None and kill_at and len(log) >= kill_at[0] and busy:
                armed = len(r1.child.lines)  # kill r1 at its next send
            if armed is not None and any(
                line.startswith("SENDING ") for line in r1.child.lines[armed:]
            ):
                kill_at.pop(0)
                armed = None
                time.sleep(rng.uniform(0.0, 2 * DELAY))  # before, during or after the call
                r1.child.kill()
                unfinished = [mid for mid in r1.given if mid not in finished()]
                kills.append((len(channel_log(tmp_path)), len(unfinished)))
                for mid in unfinished:  # the channel delivers again what r1 never answered
                    give(r2, mid)
                r1 = replica("r1")  # restarted, as a supervisor would
                everyone.append(r1)
                r1.child.wait_for("ready")
                continue
            time.sleep(0.02)
        summaries = []
        for r in (r1, r2):
            r.tell("end")
        for r in (r1, r2):
            r.child.wait_for("IDLE")
        for r in (r1, r2):
            r.tell("report")
            summaries.append(json.loads(r.child.wait_for("SUMMARY ").split(" ", 1)[1]))
            r.child.finish()
    finally:
        for r in everyone:
            r.child.__exit__(None, None, None)
    elapsed = time.monotonic() - t0

    log = channel_log(tmp_path)
    per_chat: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    for line in log:
        per_chat[line["chat"]][line["text"]] += 1
    duplicates = sum(n - 1 for counts in per_chat.values() for n in counts.values() if n > 1)
    lost = sum(1 for c in chats for t in expected(c, bad.get(c)) if per_chat[c][t] == 0)
    questions = sum(n for counts in per_chat.values() for t, n in counts.items() if t[0] == "q")
    summary = summaries[-1]  # r2's (every replica reads the same journal)
    ambiguous: collections.Counter[str] = collections.Counter()
    for r in everyone:  # every incarnation's log, the killed ones' too
        for said in r.child.lines:
            if "ambiguous send " in said and " says it went out" in said:
                ambiguous["resolved sent"] += 1
            elif "ambiguous send " in said and " says it never arrived" in said:
                ambiguous["resolved unsent"] += 1
            elif " is ambiguous" in said:  # the channel could not tell: the policy guessed
                ambiguous["guessed"] += 1
    by_replica = collections.Counter(line["replica"] for line in log)
    print(
        f"\n  flow replicas/{backend_name}: {CHATS} chats, {len(kills)} kills of r1 (sends at the "
        f"channel, r1's unfinished inbounds: {kills}; seed {seed}), {questions} questions for "
        f"{CHATS * QUESTIONS}, {len(log)} sends for {total} (per replica {dict(by_replica)}), "
        f"{duplicates} duplicates, {lost} lost, ambiguous {sum(ambiguous.values())} "
        f"{dict(ambiguous)}, {elapsed:.0f}s"
    )
    assert len(kills) == KILLS, f"only {len(kills)} of {KILLS} kills happened"
    wrong = {
        c: (
            dict(per_chat[c] - expected(c, bad.get(c))),
            dict(expected(c, bad.get(c)) - per_chat[c]),
        )
        for c in chats
        if per_chat[c] != expected(c, bad.get(c))
    }
    assert not wrong, f"chats whose texts are not each expected one once (extra, missing): {wrong}"
    ids = {mid for c in chats for mid, _, _ in scripts[c]}
    assert summary["inbox"] == dict.fromkeys(ids, "done"), summary["inbox"]
    assert set(summary["outbox"].values()) == {"sent"}, summary["outbox"]
    assert summary["flows"] == {c: ["done", len(scripts[c]) - 1] for c in chats}
    assert ambiguous["guessed"] == 0, dict(ambiguous)
    assert sum(s["metrics"]["outboxAmbiguous"] for s in summaries) == 0
