"""Example bots and the demo behind ``make run`` (not part of the installed package)."""
