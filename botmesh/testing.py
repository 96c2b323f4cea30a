"""Test your bot's crash recovery: ``crashable``, ``CrashableProvider``, ``MockProvider``.

``crashable(kv)`` wraps a journal (a ``DurableKv``) in a ``FaultyKv``, the one fault kit of
botmesh's own tests and yours. It can "kill the process" at one precise journal write:
``crash_before(label)`` stops before the write lands, ``crash_after(label)`` right after it
landed. The crash raises ``SimulatedCrash``, a ``BaseException`` that the engine never
catches, and from then on the wrapper refuses every call, as a dead process would. It can
also make the journal fail without dying (``fail(label, times)``, ``down = True``): writes
raise ``JournalUnavailableError``, as an outage would. Abandon a crashed runtime and start
a new one on the *unwrapped* journal with the same ``instance_id``::

    shared = MemoryKv()
    a = crashable(shared)
    a.crash_before(Write.OUTBOX_MARK_SENT)   # the provider was called, the result never recorded
    app_a = botmesh.run(bot, CrashableProvider(a), journal=a, instance_id="i1")
    await app_a.start()
    with pytest.raises(SimulatedCrash):
        await app_a.handle(Inbound(id="m1", chat_id="chat", text="hi"))
    async with botmesh.run(bot, MockProvider(), journal=shared, instance_id="i1") as app_b:
        ...                                    # recovered: the send is ambiguous -> unknown

The write labels are ``botmesh.journal.Write`` (``WRITE_LABELS`` lists their values).
"""

from botmesh._bot.faults import WRITE_LABELS, CrashableProvider, FaultyKv, SimulatedCrash, crashable
from botmesh.providers.mock import MockProvider, SentCall
from botmesh.state.clock import ManualClock

__all__ = [
    "WRITE_LABELS",
    "CrashableProvider",
    "FaultyKv",
    "ManualClock",
    "MockProvider",
    "SentCall",
    "SimulatedCrash",
    "crashable",
]
