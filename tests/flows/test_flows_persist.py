"""A persistent five-question flow survives a restart on every backend that persists: the
runtime stops after answer 2, a new runtime on the same journal takes answers 3 to 5;
every question reaches the channel exactly once, no answer is lost."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from botmesh.testing import ManualClock, MockProvider
from tests.backends import BACKENDS, BackendHandle
from tests.flows.kit import QUESTIONS, Chat, five_bot, start_app

PERSISTENT = sorted(name for name, case in BACKENDS.items() if case.persistent)


@pytest.mark.parametrize("backend_name", PERSISTENT)
async def test_five_questions_across_a_restart(backend_name: str, tmp_path: Path) -> None:
    handle = BackendHandle(BACKENDS[backend_name], tmp_path / "journal")
    kv = await handle.open()
    clock = ManualClock()
    channel = MockProvider()
    try:
        bot, _ = five_bot()
        app = await start_app(bot, kv=kv, clock=clock, provider=channel)
        chat = Chat(app)
        for text in ["/start", "a1", "a2"]:
            await chat.say(text)
        await app.stop()

        kv = await handle.reopen()
        bot2, seen2 = five_bot()
        app2 = await start_app(bot2, kv=kv, clock=clock, provider=channel)
        chat.app = app2
        for text in ["a3", "a4", "a5"]:
            await chat.say(text)
        asked = Counter(m.text for m in channel.sent)
        assert {q: asked[q] for q in QUESTIONS} == dict.fromkeys(QUESTIONS, 1)
        assert asked["thanks a1,a2,a3,a4,a5"] == 1
        [ended] = seen2.ended
        assert (ended.status, ended.result) == ("done", ["a1", "a2", "a3", "a4", "a5"])
        assert seen2.handled == []  # every answer went to the flow
        [record] = await app2.ops.flows("c")
        assert (record.status, record.steps) == ("done", 5)
        await app2.stop()
    finally:
        await handle.close()
