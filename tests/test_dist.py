"""botmesh as a team installs it: the release check of ``make dist`` (tests/dist.py), run once
for the module, then what the released files hold and what the installed wheel does.

The sdist and the wheel hold LICENSE and NOTICE and say ``License-Expression: Apache-2.0``;
``twine check --strict`` passes; the wheel, installed with its dependencies into a fresh
virtualenv outside the repository, holds one import name (``botmesh``), leaves a user's own
``state`` package alone, prints its one version, runs a bot module from another folder in
one process (``botmesh run``) and has LICENSE and NOTICE in its dist-info. The image's
install step (the Dockerfile's COPY lines, then ``pip install /src``) installs them too.
(tests/kafka/test_wheel.py runs the installed worker on the test broker.)
"""

from __future__ import annotations

import re
import shlex
import shutil
import tarfile
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from botmesh._version import __version__
from tests import dist

ROOT = dist.ROOT


@pytest.fixture(scope="module")
def release(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dist.Release]:
    """``make dist``'s check, in a temporary folder: it raises if any step fails."""
    tmp = tmp_path_factory.mktemp("dist")
    yield dist.release_check(tmp / "out", tmp / "work")


@pytest.fixture
def user_folder(tmp_path: Path) -> Path:
    folder = tmp_path / "mybot"
    (folder / "state").mkdir(parents=True)
    (folder / "state" / "__init__.py").write_text('NAME = "the user\'s own state"\n')
    (folder / "shop_bot.py").write_text(dist.USER_BOT)
    return folder


# -- what the released files hold -------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.xdist_group("dist")
def test_license_and_notice_are_in_the_sdist_and_the_wheel(release: dist.Release) -> None:
    built = release.built
    top, info = f"botmesh-{__version__}", f"botmesh-{__version__}.dist-info"
    with tarfile.open(built.sdist) as sdist:
        assert {f"{top}/LICENSE", f"{top}/NOTICE"} <= set(sdist.getnames())
        member = sdist.extractfile(f"{top}/PKG-INFO")
        assert member is not None
        pkg_info = member.read().decode()
    with zipfile.ZipFile(built.wheel) as wheel:
        assert {f"{info}/licenses/LICENSE", f"{info}/licenses/NOTICE"} <= set(wheel.namelist())
        assert wheel.read(f"{info}/licenses/LICENSE") == (ROOT / "LICENSE").read_bytes()
        metadata = wheel.read(f"{info}/METADATA").decode()
    for text in (pkg_info, metadata):
        assert re.search(r"^Metadata-Version: 2\.[4-9]$", text, re.M), text[:200]
        assert "\nLicense-Expression: Apache-2.0\n" in text
        assert "\nLicense-File: LICENSE\n" in text and "\nLicense-File: NOTICE\n" in text
        assert "\nClassifier: Programming Language :: Python :: 3.13\n" in text
    assert "Apache License" in (ROOT / "LICENSE").read_text()
    assert "Copyright 2026 the botmesh authors" in (ROOT / "NOTICE").read_text()


def _without(archive: Path, dest: Path, dropped: str) -> Path:
    """A copy of the sdist ``archive`` without its member ending in ``dropped``."""
    with tarfile.open(archive) as source, tarfile.open(dest, "w:gz") as copy:
        for member in source.getmembers():
            if not member.name.endswith(dropped):
                copy.addfile(member, source.extractfile(member) if member.isfile() else None)
    return dest


def _rewritten(wheel: Path, dest: Path, old: str, new: str) -> Path:
    """A copy of ``wheel`` with ``old`` replaced by ``new`` in its METADATA."""
    with zipfile.ZipFile(wheel) as source, zipfile.ZipFile(dest, "w") as copy:
        for item in source.infolist():
            data = source.read(item)
            if item.filename.endswith(".dist-info/METADATA"):
                assert old.encode() in data
                data = data.replace(old.encode(), new.encode())
            copy.writestr(item, data)
    return dest


@pytest.mark.slow
@pytest.mark.xdist_group("dist")
def test_the_check_refuses_a_release_without_notice_or_expression(
    release: dist.Release, tmp_path: Path
) -> None:
    """The check is not a formality: a NOTICE missing from the sdist, a wheel whose metadata
    has the old ``License:`` field in place of the expression, each fail it."""
    built = release.built
    no_notice = _without(built.sdist, tmp_path / built.sdist.name, "/NOTICE")
    with pytest.raises(dist.ReleaseError, match="sdist: no NOTICE"):
        dist.check_artifacts(dist.Built(no_notice, built.wheel))
    (tmp_path / "w").mkdir()
    old_style = _rewritten(
        built.wheel,
        tmp_path / "w" / built.wheel.name,
        "License-Expression: Apache-2.0",
        "License: Apache-2.0",
    )
    with pytest.raises(dist.ReleaseError, match="License-Expression None"):
        dist.check_artifacts(dist.Built(built.sdist, old_style))


@pytest.mark.slow
@pytest.mark.xdist_group("dist")
def test_twine_check_strict_passes(release: dist.Release) -> None:
    dist.twine_check(release.built)  # raises with twine's output


# -- the installed wheel ----------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.xdist_group("dist")
def test_the_installed_wheel_answers_with_the_echo_bot(
    release: dist.Release, tmp_path: Path
) -> None:
    out = dist.smoke(release.python, tmp_path)  # also: LICENSE and NOTICE in the dist-info
    assert dist.SMOKE_REPLY in out


@pytest.mark.slow
@pytest.mark.xdist_group("dist")
def test_one_import_name_and_no_state_of_ours(release: dist.Release, tmp_path: Path) -> None:
    python = release.python
    out = dist.run_installed(python, "-c", "import botmesh; print(botmesh.__file__)", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert Path(out.stdout.strip()).is_relative_to(python.parent.parent), out.stdout
    for name in ("state", "streams", "topics", "providers", "examples", "tests"):
        out = dist.run_installed(python, "-c", f"import {name}", cwd=tmp_path)
        assert out.returncode != 0 and f"No module named '{name}'" in out.stderr, name
    code = "from botmesh.streams.ops.tools import request_send"
    out = dist.run_installed(python, "-c", code, cwd=tmp_path)
    assert out.returncode == 0, out.stderr


@pytest.mark.slow
@pytest.mark.xdist_group("dist")
def test_the_installed_command_prints_the_one_version(
    release: dist.Release, tmp_path: Path
) -> None:
    python = release.python
    out = dist.run_installed(python.parent / "botmesh", "--version", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f"botmesh {__version__}"
    code = "import importlib.metadata as m; print(m.version('botmesh'))"
    assert dist.run_installed(python, "-c", code, cwd=tmp_path).stdout.strip() == __version__


@pytest.mark.slow
@pytest.mark.xdist_group("dist")
def test_a_bot_in_another_folder_runs_in_one_process(
    release: dist.Release, user_folder: Path
) -> None:
    command = ["run", "--app", "shop_bot:bot", "--journal", "none", "--chat-id", "c1"]
    botmesh = release.python.parent / "botmesh"
    out = dist.run_installed(botmesh, *command, cwd=user_folder, stdin="hello\n")
    assert out.returncode == 0, out.stderr
    assert "[c1] shop: hello (the user's own state)" in out.stdout, out.stdout + out.stderr


# -- the image and make dist ------------------------------------------------------------------


def dockerfile_copies() -> list[tuple[list[str], str]]:
    """The Dockerfile's ``COPY`` lines: (sources, destination)."""
    copies = []
    for line in (ROOT / "Dockerfile").read_text().splitlines():
        if line.startswith("COPY "):
            *sources, dest = shlex.split(line)[1:]
            copies.append((sources, dest))
    return copies


@pytest.mark.slow
@pytest.mark.xdist_group("dist")
def test_the_image_installs_license_and_notice(tmp_path: Path) -> None:
    """The image's install step without Docker (no engine here): what its COPY lines put in
    /src, then ``pip install /src`` (alone) into a fresh virtualenv."""
    src = tmp_path / "src"
    for sources, dest in dockerfile_copies():
        assert dest.startswith("/src"), dest
        target = tmp_path / dest.lstrip("/")
        for pattern in sources:
            found = sorted(ROOT.glob(pattern))
            assert found or pattern.endswith("*"), f"COPY {pattern}: nothing there"
            for path in found:
                if path.is_dir():
                    ignore = shutil.ignore_patterns("__pycache__")
                    shutil.copytree(path, target, ignore=ignore, dirs_exist_ok=True)
                else:
                    target.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(path, target / path.name)
    python = dist.fresh_venv(tmp_path / "venv", with_pip=False)
    dist.install(python, src, deps=False)
    info = dist.site_packages(python) / f"botmesh-{__version__}.dist-info"
    for name in dist.LICENSE_FILES:
        assert (info / "licenses" / name).read_bytes() == (ROOT / name).read_bytes(), name


def test_make_dist_runs_the_release_check() -> None:
    makefile = (ROOT / "Makefile").read_text()
    recipe = re.search(r"^dist:.*## .+\n((?:\t.*\n)+)", makefile, re.M)
    assert recipe is not None, "no dist target with a ## help line"
    assert "-m tests.dist" in recipe.group(1)
    phony = re.search(r"^\.PHONY:(.*)$", makefile, re.M)
    assert phony is not None and "dist" in phony.group(1).split()
