"""The release check (``make dist``): build the sdist and the wheel of this checkout, check
them, install the wheel where a user would and run a bot with it.

``python -m tests.dist [--out dist]``:

1. **Build.** The checkout's files (those git lists, tracked or new, not ignored) are
   copied to a temporary folder, so the build writes nothing into the work tree; ``python
   -m build`` makes the sdist there and the wheel *from the sdist* (so a file the sdist
   lacks fails the wheel), each in an isolated environment with the build-system's own
   requirements from ``pyproject.toml``.
2. **Check.** Both hold ``LICENSE`` and ``NOTICE`` (byte-equal to the checkout's) and the
   metadata says ``License-Expression: Apache-2.0``, names both ``License-File``\\ s, the
   version of ``botmesh/_version.py``, ``Requires-Python`` and the Python classifiers; the
   wheel holds one import name (``botmesh``) and its dist-info; ``twine check --strict``.
3. **Install and run.** A fresh virtualenv in a temporary folder outside the repository
   gets the wheel and its dependencies (from the package index, as a user's would);
   ``botmesh --version`` prints the version, ``botmesh run`` with the echo bot answers a
   line of stdin, and ``LICENSE`` and ``NOTICE`` are in the installed dist-info.

Only then are the sdist and the wheel copied into ``--out``. tests/test_dist.py runs the
same steps (``make test``); tests/kafka/test_wheel.py reuses ``copy_source``,
``fresh_venv`` and ``site_packages``.
"""

from __future__ import annotations

import argparse
import email.message
import email.parser
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "LICENSE_FILES",
    "ROOT",
    "Built",
    "Release",
    "ReleaseError",
    "build",
    "check_artifacts",
    "copy_source",
    "fresh_venv",
    "install",
    "release_check",
    "run_installed",
    "site_packages",
    "smoke",
    "twine_check",
    "user_env",
]

ROOT = Path(__file__).resolve().parent.parent
LICENSE_FILES = ("LICENSE", "NOTICE")
PYTHONS = ("3.11", "3.12", "3.13")
#: What ``botmesh run`` gets on stdin, and the echo bot's answer to it.
SMOKE_LINE = "hi from the release check"
#: A user's bot in a folder of its own, beside a package of the user's named ``state``
#: (``tests/test_dist.py``, ``tests/kafka/test_wheel.py``): botmesh's own never collides.
USER_BOT = """\
import state
from botmesh import Bot, Context

bot = Bot("shop")


@bot.on_message
async def reply(ctx: Context) -> None:
    await ctx.reply(f"shop: {ctx.text} ({state.NAME})")
"""
SMOKE_REPLY = f"echo: {SMOKE_LINE}"


class ReleaseError(Exception):
    """An sdist or a wheel that is not fit to release; the message says what is wrong."""


def _require(ok: bool, what: str) -> None:
    if not ok:
        raise ReleaseError(what)


def _version() -> str:
    scope: dict[str, object] = {}
    exec((ROOT / "botmesh/_version.py").read_text(), scope)
    return str(scope["__version__"])


# -- build ----------------------------------------------------------------------------------


def copy_source(dest: Path) -> Path:
    """The checkout's files (tracked, or new and not ignored) copied into ``dest``."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        check=True,
        capture_output=True,
    ).stdout.decode()
    dest.mkdir(parents=True)
    for name in filter(None, listed.split("\0")):
        source = ROOT / name
        if source.is_file():  # a tracked file deleted in the work tree is not there
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)
    return dest


@dataclass(frozen=True)
class Built:
    sdist: Path
    wheel: Path


def build(source: Path, out: Path) -> Built:
    """The sdist of ``source`` and the wheel built from that sdist, in ``out``."""
    command = [sys.executable, "-m", "build", "--outdir", str(out), str(source)]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    _require(done.returncode == 0, f"python -m build failed:\n{done.stdout}\n{done.stderr}")
    version = _version()
    sdist, wheel = out / f"botmesh-{version}.tar.gz", out / f"botmesh-{version}-py3-none-any.whl"
    _require(sdist.is_file() and wheel.is_file(), f"built: {sorted(os.listdir(out))}")
    return Built(sdist, wheel)


# -- check ----------------------------------------------------------------------------------


def _metadata(text: str) -> email.message.Message:
    return email.parser.Parser().parsestr(text)


def check_metadata(meta: email.message.Message, where: str) -> None:
    """PEP 639's license fields, the version, the Python versions."""
    _require(meta["Name"] == "botmesh", f"{where}: Name {meta['Name']!r}")
    _require(meta["Version"] == _version(), f"{where}: Version {meta['Version']!r}")
    _require(
        meta["License-Expression"] == "Apache-2.0",
        f"{where}: License-Expression {meta['License-Expression']!r}, not 'Apache-2.0'",
    )
    _require(meta["License"] is None, f"{where}: a License field beside the expression")
    files = meta.get_all("License-File") or []
    _require(sorted(files) == sorted(LICENSE_FILES), f"{where}: License-File {files}")
    _require(meta["Requires-Python"] == ">=3.11", f"{where}: Requires-Python")
    classifiers = set(meta.get_all("Classifier") or [])
    wanted = {f"Programming Language :: Python :: {v}" for v in PYTHONS} | {"Typing :: Typed"}
    _require(wanted <= classifiers, f"{where}: classifiers lack {sorted(wanted - classifiers)}")
    _require(
        not any(c.startswith("License ::") for c in classifiers),
        f"{where}: a License classifier beside the expression",
    )


def check_artifacts(built: Built) -> None:
    """LICENSE and NOTICE in the sdist and the wheel, and their metadata."""
    version = _version()
    top = f"botmesh-{version}"
    with tarfile.open(built.sdist) as sdist:
        names = set(sdist.getnames())
        for name in LICENSE_FILES:
            _require(f"{top}/{name}" in names, f"sdist: no {name}")
            member = sdist.extractfile(f"{top}/{name}")
            assert member is not None
            _require(member.read() == (ROOT / name).read_bytes(), f"sdist: {name} differs")
        _require(f"{top}/PKG-INFO" in names, "sdist: no PKG-INFO")
        pkg_info = sdist.extractfile(f"{top}/PKG-INFO")
        assert pkg_info is not None
        check_metadata(_metadata(pkg_info.read().decode()), "sdist PKG-INFO")

    info = f"botmesh-{version}.dist-info"
    with zipfile.ZipFile(built.wheel) as wheel:
        names = set(wheel.namelist())
        tops = {n.split("/")[0] for n in names}
        _require(tops == {"botmesh", info}, f"wheel: top-level names {sorted(tops)}")
        for name in LICENSE_FILES:
            path = f"{info}/licenses/{name}"
            _require(path in names, f"wheel: no {path}")
            _require(wheel.read(path) == (ROOT / name).read_bytes(), f"wheel: {name} differs")
        _require("botmesh/py.typed" in names, "wheel: no botmesh/py.typed")
        check_metadata(_metadata(wheel.read(f"{info}/METADATA").decode()), "wheel METADATA")


def twine_check(built: Built) -> None:
    twine = [sys.executable, "-m", "twine", "check", "--strict"]
    command = [*twine, str(built.sdist), str(built.wheel)]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    _require(done.returncode == 0, f"twine check --strict:\n{done.stdout}\n{done.stderr}")


# -- install and run --------------------------------------------------------------------------


def fresh_venv(path: Path, *, with_pip: bool = True) -> Path:
    """A new virtualenv at ``path`` (this interpreter's version); its python."""
    command = [sys.executable, "-m", "venv", str(path)]
    subprocess.run(command if with_pip else [*command, "--without-pip"], check=True)
    return path / "bin" / "python"


def site_packages(python: Path) -> Path:
    code = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    out = subprocess.run([str(python), "-c", code], check=True, capture_output=True, text=True)
    return Path(out.stdout.strip())


def install(python: Path, target: Path, *, deps: bool = True, index: bool = True) -> None:
    """``target`` (a wheel, or a source folder to build) into ``python``'s virtualenv, with
    its dependencies or (``deps=False``) alone; ``index=False``: nothing from the package
    index (a source folder needs it for its build requirements)."""
    pip = [sys.executable, "-m", "pip", "--python", str(python), "--disable-pip-version-check"]
    command = [*pip, "install", "-q"]
    command += [] if deps else ["--no-deps"]
    command += [] if index else ["--no-index"]
    done = subprocess.run([*command, str(target)], capture_output=True, text=True, check=False)
    _require(done.returncode == 0, f"pip install {target.name}:\n{done.stdout}\n{done.stderr}")


#: What no longer comes with botmesh (issue 38): Faust capped click below 8.4.
RETIRED = ("faust-streaming", "mode-streaming", "aiokafka")


def check_dependencies(python: Path) -> str:
    """The newest click from the index next to the installed wheel, then ``pip check``;
    none of ``RETIRED`` installed. The click version installed."""
    pip = [sys.executable, "-m", "pip", "--python", str(python), "--disable-pip-version-check"]
    up = subprocess.run(
        [*pip, "install", "-q", "--upgrade", "click"], capture_output=True, text=True, check=False
    )
    _require(up.returncode == 0, f"pip install --upgrade click:\n{up.stdout}\n{up.stderr}")
    checked = subprocess.run([*pip, "check"], capture_output=True, text=True, check=False)
    _require(checked.returncode == 0, f"pip check after the newest click:\n{checked.stdout}")
    listed = subprocess.run(
        [*pip, "list", "--format=json"], capture_output=True, text=True, check=True
    )
    have = {d["name"].lower(): d["version"] for d in json.loads(listed.stdout)}
    _require(not set(RETIRED) & set(have), f"installed with botmesh: {set(RETIRED) & set(have)}")
    return str(have.get("click", ""))


def user_env() -> dict[str, str]:
    """This environment without our own Python settings (PYTHONPATH and the like)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    return {**env, "PYTHONPATH": "", "PYTHONUNBUFFERED": "1"}


def run_installed(
    *argv: str | Path, cwd: Path, stdin: str = "", timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """A command of the fresh virtualenv, run from ``cwd`` as a user would."""
    return subprocess.run(
        [str(a) for a in argv],
        cwd=cwd,
        env=user_env(),
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def smoke(python: Path, cwd: Path) -> str:
    """The installed command's version and ``botmesh run`` of the echo bot; the run's stdout."""
    botmesh = python.parent / "botmesh"
    version = run_installed(botmesh, "--version", cwd=cwd)
    _require(
        version.returncode == 0 and version.stdout.strip() == f"botmesh {_version()}",
        f"botmesh --version: {version.stdout!r} {version.stderr!r}",
    )
    command = ["run", "--app", "botmesh.examples.echo_bot:bot", "--journal", "memory://"]
    out = run_installed(botmesh, *command, cwd=cwd, stdin=f"{SMOKE_LINE}\n")
    _require(
        out.returncode == 0 and SMOKE_REPLY in out.stdout,
        f"botmesh run (status {out.returncode}) did not answer {SMOKE_LINE!r}:\n"
        f"{out.stdout}\n{out.stderr}",
    )
    # no broker: the message says what an installed botmesh can do (no checkout's kafka.sh)
    down = run_installed(botmesh, "status", "--bootstrap", "127.0.0.1:9", "--timeout", "2", cwd=cwd)
    _require(
        down.returncode == 3
        and "cannot reach Kafka at '127.0.0.1:9'" in down.stderr
        and "KAFKA_BOOTSTRAP_SERVERS" in down.stderr
        and "docker run -p 9092:9092 apache/kafka" in down.stderr
        and "kafka.sh" not in down.stderr,
        f"botmesh status without a broker (status {down.returncode}): {down.stderr!r}",
    )
    code = (
        "import importlib.metadata as m\n"
        "d = m.distribution('botmesh')\n"
        "print('\\n'.join(str(f) for f in d.files or [] if f.parent.name == 'licenses'))"
    )
    licenses = run_installed(python, "-c", code, cwd=cwd)
    names = {Path(line).name for line in licenses.stdout.split()}
    _require(names == set(LICENSE_FILES), f"installed dist-info licenses: {licenses.stdout!r}")
    return out.stdout


# -- the command ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Release:
    """A checked release: the sdist and the wheel in ``out``, and the fresh virtualenv's
    python that has the wheel installed."""

    built: Built
    python: Path


def release_check(out: Path, work: Path) -> Release:
    """Every step above, in the folder ``work`` (outside the repository); the checked sdist
    and wheel are copied to ``out``."""
    started = time.monotonic()

    def log(what: str) -> None:
        print(f"[dist {time.monotonic() - started:5.1f}s] {what}", flush=True)

    log("build: sdist, then the wheel from it")
    built = build(copy_source(work / "source"), work / "dist")
    check_artifacts(built)
    log(f"checked {built.sdist.name} and {built.wheel.name}: LICENSE, NOTICE, metadata")
    twine_check(built)
    log("twine check --strict: passed")
    python = fresh_venv(work / "venv")
    install(python, built.wheel)
    log(f"installed {built.wheel.name} and its dependencies into a fresh virtualenv")
    click = check_dependencies(python)
    log(f"the newest click ({click}) beside it, pip check clean; no faust, mode or aiokafka")
    (work / "user").mkdir()
    print(smoke(python, work / "user").rstrip(), flush=True)
    log(
        "botmesh --version and botmesh run answered; no broker: the installed package's hint; "
        "LICENSE and NOTICE installed"
    )
    out.mkdir(parents=True, exist_ok=True)
    copied = Built(out / built.sdist.name, out / built.wheel.name)
    shutil.copy2(built.sdist, copied.sdist)
    shutil.copy2(built.wheel, copied.wheel)
    log(f"{copied.sdist} {copied.wheel}")
    return Release(copied, python)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.dist", description=__doc__)
    parser.add_argument("--out", type=Path, default=ROOT / "dist", help="default: dist/")
    args = parser.parse_args(argv)
    try:
        with tempfile.TemporaryDirectory(prefix="botmesh-dist-") as work:
            release_check(args.out.resolve(), Path(work))
    except ReleaseError as exc:
        print(f"release check failed: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
