"""botmesh as a user installs it, on the broker: the wheel built from this checkout, installed
into a fresh virtualenv outside the repository, runs a bot module from another folder as a
worker on the test broker (``botmesh worker``). What the wheel holds and what it does
without a broker (one import name, the version, ``botmesh run``) is tests/test_dist.py's,
on the wheel of ``make dist``'s check.

The fresh virtualenv gets the wheel alone (``--no-deps``); its dependencies come from this
test's own environment through a ``.pth`` line added after the check of what the wheel
installed, so the test needs no package index.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import sysconfig
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from botmesh._version import __version__
from botmesh.streams.ops.tools import demo_records, end_offsets, produce_inbound, tail_receipts
from botmesh.streams.provision import ensure_topics
from botmesh.topics import Catalog
from tests import dist
from tests.kill import Child

# The wheel is built once for the module: in a parallel run its tests share one worker.
pytestmark = [pytest.mark.kafka, pytest.mark.slow, pytest.mark.xdist_group("wheel")]


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The fresh virtualenv's python, with the wheel of this checkout installed."""
    tmp = tmp_path_factory.mktemp("wheel")
    # setuptools builds in the source tree: build a copy of it (tests/dist.py's)
    source = dist.copy_source(tmp / "source")
    out = tmp / "dist"
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    build = [*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(out), str(source)]
    subprocess.run(build, check=True, cwd=tmp, capture_output=True)
    (wheel,) = out.glob("botmesh-*.whl")
    assert wheel.name.startswith(f"botmesh-{__version__}-")

    python = dist.fresh_venv(tmp / "venv", with_pip=False)
    site = dist.site_packages(python)
    before = set(os.listdir(site))
    dist.install(python, wheel, deps=False, index=False)
    added = set(os.listdir(site)) - before
    assert added == {"botmesh", f"botmesh-{__version__}.dist-info"}, sorted(added)
    # the dependencies, from this environment (after the wheel's own files were counted)
    (site / "zz-deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    yield python


@pytest.fixture
def user_folder(tmp_path: Path) -> Path:
    folder = tmp_path / "mybot"
    (folder / "state").mkdir(parents=True)
    (folder / "state" / "__init__.py").write_text('NAME = "the user\'s own state"\n')
    (folder / "shop_bot.py").write_text(dist.USER_BOT)
    return folder


async def test_a_bot_in_another_folder_runs_on_the_broker(
    installed: Path, user_folder: Path, kafka_bootstrap: str, topic_prefix: str
) -> None:
    cat = Catalog(topic_prefix)
    ensure_topics(kafka_bootstrap, cat.specs(partitions=2))
    start = await end_offsets(kafka_bootstrap, cat.sent)
    command = [
        str(installed.parent / "botmesh"),
        "worker",
        "--app",
        "shop_bot:bot",
        "--provider",
        "mock",
        "--bootstrap",
        kafka_bootstrap,
        "--prefix",
        topic_prefix,
        "--data-dir",
        str(user_folder / "data"),
        "--instance-id",
        f"{topic_prefix}-0",
        "--loglevel",
        "warning",
    ]
    with Child(command, cwd=user_folder, env=dist.user_env()) as child:
        records = demo_records(1, 1, run="wheel")
        await produce_inbound(kafka_bootstrap, cat.inbound, records)
        receipts = tail_receipts(kafka_bootstrap, cat.sent, start=start)
        deadline = time.monotonic() + 120  # a hang guard
        try:
            while True:
                task = asyncio.ensure_future(anext(receipts))
                while not task.done():
                    assert child.alive(), child.tail(60)
                    if time.monotonic() > deadline:
                        task.cancel()
                        pytest.fail(f"no receipt from the installed worker:\n{child.tail(60)}")
                    await asyncio.wait({task}, timeout=0.5)
                seen = task.result()
                if seen.receipt.inbound_id == records[0].id:
                    break
        finally:
            await receipts.aclose()
        assert seen.receipt.state == "sent"
        assert child.stop() == 0, child.tail(60)
