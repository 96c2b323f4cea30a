"""botmesh as a user installs it: the wheel built from this checkout, installed into a fresh
virtualenv outside the repository, holds one import name (``botmesh``), leaves a user's own
``state`` package alone, prints its one version, and runs a bot module from another folder
in one process (``botmesh run``) and on the test broker (``botmesh worker``).

The fresh virtualenv gets the wheel alone (``--no-deps``); its dependencies come from this
test's own environment through a ``.pth`` line added after the check of what the wheel
installed, so the test needs no package index.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import sysconfig
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from botmesh._version import __version__
from botmesh.streams.ops.tools import demo_records, end_offsets, produce_inbound, tail_receipts
from botmesh.streams.provision import ensure_topics
from botmesh.topics import Catalog
from tests.kill import Child

# The wheel is built once for the module: in a parallel run its tests share one worker.
pytestmark = [pytest.mark.kafka, pytest.mark.slow, pytest.mark.xdist_group("wheel")]

ROOT = Path(__file__).resolve().parent.parent.parent

#: A user's bot in a folder of its own, beside a package of the user's named ``state``.
BOT = """\
import state
from botmesh import Bot, Context

bot = Bot("shop")


@bot.on_message
async def reply(ctx: Context) -> None:
    await ctx.reply(f"shop: {ctx.text} ({state.NAME})")
"""


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The fresh virtualenv's python, with the wheel of this checkout installed."""
    tmp = tmp_path_factory.mktemp("wheel")
    source = tmp / "source"  # setuptools builds in the source tree: build a copy of it
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    shutil.copytree(
        ROOT / "botmesh", source / "botmesh", ignore=shutil.ignore_patterns("__pycache__")
    )
    dist = tmp / "dist"
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    build = [*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(dist), str(source)]
    subprocess.run(build, check=True, cwd=tmp, capture_output=True)
    (wheel,) = dist.glob("botmesh-*.whl")
    assert wheel.name.startswith(f"botmesh-{__version__}-")

    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    site = Path(
        subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
    )
    before = set(os.listdir(site))
    install = [*pip, "--python", str(python), "install", "--no-deps", "--no-index", str(wheel)]
    subprocess.run(install, check=True, cwd=tmp, capture_output=True)
    added = set(os.listdir(site)) - before
    assert added == {"botmesh", f"botmesh-{__version__}.dist-info"}, sorted(added)
    with zipfile.ZipFile(wheel) as whl:
        tops = {n.split("/")[0] for n in whl.namelist()}
    assert tops == {"botmesh", f"botmesh-{__version__}.dist-info"}, sorted(tops)
    # the dependencies, from this environment (after the wheel's own files were counted)
    (site / "zz-deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    yield python


@pytest.fixture
def user_folder(tmp_path: Path) -> Path:
    folder = tmp_path / "mybot"
    (folder / "state").mkdir(parents=True)
    (folder / "state" / "__init__.py").write_text('NAME = "the user\'s own state"\n')
    (folder / "shop_bot.py").write_text(BOT)
    return folder


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    return {**env, "PYTHONPATH": "", "PYTHONUNBUFFERED": "1"}


def _run(*argv: str | Path, cwd: Path, stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(a) for a in argv],
        cwd=cwd,
        env=_env(),
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_one_import_name_and_no_state_of_ours(installed: Path, tmp_path: Path) -> None:
    out = _run(installed, "-c", "import botmesh, sys; print(botmesh.__file__)", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert Path(out.stdout.strip()).is_relative_to(installed.parent.parent), out.stdout
    for name in ("state", "streams", "topics", "providers", "examples"):
        out = _run(installed, "-c", f"import {name}", cwd=tmp_path)
        assert out.returncode != 0 and f"No module named '{name}'" in out.stderr, name
    out = _run(installed, "-c", "from botmesh.streams.ops.tools import request_send", cwd=tmp_path)
    assert out.returncode == 0, out.stderr


def test_the_installed_command_prints_the_one_version(installed: Path, tmp_path: Path) -> None:
    out = _run(installed.parent / "botmesh", "--version", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f"botmesh {__version__}"
    meta = _run(
        installed, "-c", "import importlib.metadata as m; print(m.version('botmesh'))", cwd=tmp_path
    )
    assert meta.stdout.strip() == __version__


def test_a_bot_in_another_folder_runs_in_one_process(installed: Path, user_folder: Path) -> None:
    command = ["run", "--app", "shop_bot:bot", "--journal", "none", "--chat-id", "c1"]
    out = _run(installed.parent / "botmesh", *command, cwd=user_folder, stdin="hello\n")
    assert out.returncode == 0, out.stderr
    assert "[c1] shop: hello (the user's own state)" in out.stdout, out.stdout + out.stderr


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
    with Child(command, cwd=user_folder, env=_env()) as child:
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
