"""The ``browser`` fixture: a headless Chromium (Selenium's ``WebDriver``) with a fresh
profile in the test's ``tmp_path``, quit after the test. Without a browser the test fails,
naming what to install; it is never skipped (see ``tests/browser/__init__.py``).

A test module elsewhere imports it (``from tests.browser.conftest import browser``), as
``tests/gateway/conftest.py`` imports the Kafka fixtures. Browser tests carry
``pytestmark = [pytest.mark.browser, pytest.mark.xdist_group("browser")]``: in a parallel
run (``make test``: ``--dist loadgroup``) they share one worker, so one browser runs at a
time. Not yet under pytest 9.2: pytest-xdist 3.8 writes the group into ``item._nodeid``,
which pytest 9.2 no longer reads, so every group is ignored (pytest-xdist issue 1386).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from selenium.webdriver.chrome.webdriver import WebDriver

from tests.browser import BrowserUnavailable, start_chromium

__all__ = ["browser"]


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[WebDriver]:
    """A headless Chromium for one test (profile and chromedriver log in ``tmp_path/browser``)."""
    try:
        driver = start_chromium(tmp_path / "browser")
    except BrowserUnavailable as exc:
        pytest.fail(f"no browser for the browser tests: {exc}", pytrace=False)
    try:
        yield driver
    finally:
        driver.quit()
