"""``python -m tests.browser check``: start the headless Chromium of the browser tests, run a
line of JavaScript in it, quit it; print the versions and how long the start took (bash
.ci/run calls it before the suite, so a missing or broken browser stops CI at once)."""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

from tests.browser import BrowserUnavailable, open_chromium


def _check() -> None:
    with tempfile.TemporaryDirectory(prefix="botmesh-browser-") as folder:
        started = time.monotonic()
        try:
            with open_chromium(Path(folder)) as driver:
                ready = time.monotonic() - started
                answer = driver.execute_script("return 6 * 7")
                caps = driver.capabilities
        except BrowserUnavailable as exc:
            raise SystemExit(f"no browser for the browser tests: {exc}") from None
    if answer != 42:
        raise SystemExit(f"the browser's JavaScript answered {answer!r} to 6 * 7")
    driver_version = str(caps.get("chrome", {}).get("chromedriverVersion", "?")).split(" ")[0]
    print(
        f"Chromium {caps.get('browserVersion')} (chromedriver {driver_version}) starts in "
        f"{ready:.2f}s and runs JavaScript"
    )


if __name__ == "__main__":
    if sys.argv[1:] != ["check"]:
        raise SystemExit("usage: python -m tests.browser check")
    _check()
