"""The bot library: what ``from botmesh import Bot, run`` gives a bot author.

``bot.py`` a bot's definition (``Bot``, ``run``); ``runtime.py`` the bot bound to a provider
and a journal (``Runtime``); ``core.py`` its turns, events and send path; ``context.py``
what a handler gets; ``flow.py``, ``flow_runner.py`` conversation flows; ``media.py`` an
inbound's media; ``sends.py`` a send's options; ``parts.py`` what these ask of each other;
``faults.py`` the crash kit behind ``botmesh.testing``. The names are public through
``botmesh`` and ``botmesh.testing`` only.
"""
