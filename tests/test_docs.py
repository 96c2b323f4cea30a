"""The docs are a contract: the site builds strictly, and every example in it runs.

- ``mkdocs build --strict`` succeeds: a broken link or anchor, a page left out of the
  navigation or a navigation entry without its page fails it (``validation`` in
  mkdocs.yml), and so does a docstring the API reference cannot render;
- the API reference documents every name of the public modules' ``__all__``;
- every ```` ```python ```` block of README.md and docs/**/*.md runs in a fresh interpreter,
  in an empty temporary folder, unless the line before it says why it cannot
  (``<!-- not run: it needs a broker -->``); those still compile;
- every ``botmesh ...`` command of a ```` ```bash ```` block parses with the real command
  line (``botmesh._cli.main.cli``), running nothing: each documented command and option
  exists and takes the values shown;
- every ```` ```toml ```` block is a configuration file botmesh reads;
- README.md stays a front door: at most 200 lines, its relative links lead to files.
"""

from __future__ import annotations

import ast
import os
import re
import shlex
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import click
import pytest
import yaml  # type: ignore[import-untyped]  # pyyaml ships no types

from botmesh._cli.main import cli
from botmesh.settings import read_config_file

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
#: The public modules and the API reference's pages (tests/test_exports.py holds their
#: ``__all__`` to what they really export).
PUBLIC_MODULES = ["botmesh", "botmesh.errors", "botmesh.journal", "botmesh.testing"]
#: At most this many examples may be marked as not run; each needs a reason.
NOT_RUN_BUDGET = 2
README_LINES = 200

FENCE = re.compile(
    r"^(?P<indent>[ \t]*)(?P<fence>`{3,})(?P<info>[^`\n]*)\n"
    r"(?P<body>.*?)^(?P=indent)(?P=fence)[ \t]*$",
    re.MULTILINE | re.DOTALL,
)
NOT_RUN = re.compile(r"<!--\s*not run:(?P<why>.*?)-->")
MARKER_LINE = re.compile(r"^[ \t]*<!--\s*not run:", re.MULTILINE)
SHELL = {"bash", "sh", "shell", "console"}
ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
OPERATORS = {"|", "||", "&", "&&", ";", ";;", "(", ")"}
REDIRECTIONS = {">", ">>", "<", "<<", ">&", "<&"}


@dataclass(frozen=True)
class Block:
    """One fenced code block of a page."""

    page: str
    line: int
    lang: str
    code: str
    #: Why it is not run (``<!-- not run: why -->`` right before it), or None.
    not_run: str | None

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"


def blocks(pages: list[Path] = PAGES) -> Iterator[Block]:
    for path in pages:
        text = path.read_text()
        for match in FENCE.finditer(text):
            before = text[: match.start()].rstrip().rpartition("\n")[2]
            marker = NOT_RUN.fullmatch(before.strip())
            yield Block(
                page=str(path.relative_to(ROOT)),
                line=text.count("\n", 0, match.start()) + 1,
                lang=match["info"].strip().split(" ")[0],
                code=textwrap.dedent(match["body"]),
                not_run=marker["why"].strip() if marker else None,
            )


ALL = list(blocks())
PYTHON = [b for b in ALL if b.lang == "python"]
RUNNABLE = [b for b in PYTHON if b.not_run is None]


def shell_commands(code: str) -> Iterator[tuple[int, list[str]]]:
    """The simple commands of a shell block, each with the line it starts on: continued
    lines joined, comments dropped, split at pipes, ``&``, ``;`` and subshells, leading
    ``NAME=value`` assignments dropped."""
    logical: list[tuple[int, str]] = []
    pending: tuple[int, str] | None = None
    for number, line in enumerate(code.split("\n"), 1):
        start, text = pending if pending is not None else (number, "")
        text += line
        if text.endswith("\\"):
            pending = (start, text[:-1] + " ")
        else:
            pending = None
            logical.append((start, text))
    for number, line in logical:
        lexer = shlex.shlex(_without_comment(line), posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        lexer.commenters = ""
        for words in _split(list(lexer)):  # an unbalanced quote raises ValueError
            while words and ASSIGNMENT.match(words[0]):
                words.pop(0)
            if words:
                yield number, words


def _without_comment(line: str) -> str:
    """The line up to its comment: a ``#`` that starts a word, outside quotes."""
    quote = ""
    for i, char in enumerate(line):
        if quote:
            quote = "" if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i]
    return line


def _split(tokens: list[str]) -> Iterator[list[str]]:
    words: list[str] = []
    skip = False
    for token in tokens:
        if skip:  # a redirection's target
            skip = False
        elif token in REDIRECTIONS:
            skip = True
        elif token in OPERATORS:
            yield words
            words = []
        else:
            words.append(token)
    yield words


def botmesh_commands() -> Iterator[tuple[str, list[str]]]:
    for block in ALL:
        if block.lang not in SHELL:
            continue
        try:
            commands = list(shell_commands(block.code))
        except ValueError as exc:  # shlex: an unbalanced quote
            raise ValueError(f"{block.where}: {exc}") from None
        for number, words in commands:
            if words[0] == "botmesh":
                yield f"{block.page}:{block.line + number}", words[1:]


COMMANDS = list(botmesh_commands())


def parse_command_line(args: list[str]) -> str:
    """Parse ``botmesh ARGS`` as the real command line does, calling no command: each
    group's options, then its subcommand's, with their types, choices and required
    options. Returns the command's path (``dlq list``); raises ``click.ClickException``."""
    command: click.Command = cli
    name = "botmesh"
    path: list[str] = []
    parent: click.Context | None = None
    while True:
        ctx = click.Context(command, info_name=name, parent=parent)
        with ctx.scope(cleanup=False):
            rest = click.Command.parse_args(command, ctx, list(args))
        if not isinstance(command, click.Group):
            return " ".join(path)
        if not rest:
            if command.invoke_without_command:  # a group that is a command too (``send``)
                return " ".join(path)
            raise click.UsageError(f"botmesh {' '.join(path)}: no command given", ctx)
        name, args = rest[0], rest[1:]
        sub = command.get_command(ctx, name)
        if sub is None:
            raise click.UsageError(f"no such command {' '.join([*path, name])!r}", ctx)
        command, parent = sub, ctx
        path.append(name)


# -- the site ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    built = subprocess.run(
        # not --quiet: it hides the warnings from --strict, and the build passes
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(out)],
        cwd=ROOT,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert built.returncode == 0, f"mkdocs build --strict failed:\n{built.stderr[-4000:]}"
    return out


def test_the_build_is_strict() -> None:
    """A link to a missing page or anchor, a page left out of the navigation: each fails
    the build, rather than a line in its log."""
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    assert config["strict"] is True
    assert config["validation"] == {
        "omitted_files": "warn",
        "not_found": "warn",
        "absolute_links": "warn",
        "unrecognized_links": "warn",
        "anchors": "warn",
    }


@pytest.mark.xdist_group("docs-site")
def test_the_site_builds_with_every_page(site: Path) -> None:
    for page in (ROOT / "docs").rglob("*.md"):
        name = page.relative_to(ROOT / "docs").with_suffix("")
        html = name.parent if name.name == "index" else name
        assert (site / html / "index.html").exists(), page


@pytest.mark.xdist_group("docs-site")
def test_the_api_reference_documents_every_public_name(site: Path) -> None:
    import importlib

    anchors: set[str] = set()
    for page in (site / "api").rglob("*.html"):
        anchors |= set(re.findall(r'id="([\w.]+)"', page.read_text()))
    missing = [
        f"{module}.{name}"
        for module in PUBLIC_MODULES
        for name in importlib.import_module(module).__all__
        if name != "__version__" and f"{module}.{name}" not in anchors
    ]
    assert missing == [], "add these to docs/api/"


# -- the examples -----------------------------------------------------------------------------


@pytest.mark.parametrize("block", RUNNABLE, ids=[b.where for b in RUNNABLE])
def test_the_python_example_runs(block: Block, tmp_path: Path) -> None:
    script = tmp_path / "example.py"
    script.write_text(block.code)
    ran = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert ran.returncode == 0, f"{block.where}:\n{block.code}\n{ran.stderr[-3000:]}"


def test_an_example_not_run_says_why_and_still_compiles() -> None:
    marked = [b for b in ALL if b.not_run is not None]
    assert [b.where for b in marked if b.lang != "python"] == [], "only Python runs"
    assert [b.where for b in marked if not b.not_run] == [], "say why it is not run"
    for block in marked:
        compile(block.code, block.where, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    markers = sum(len(MARKER_LINE.findall(page.read_text())) for page in PAGES)
    assert markers == len(marked), "a <!-- not run --> marker must be right before its block"
    assert len(marked) <= NOT_RUN_BUDGET, [b.where for b in marked]
    assert len(RUNNABLE) >= 10  # the docs' examples are found at all


def test_every_code_block_names_its_language() -> None:
    assert [b.where for b in ALL if not b.lang] == []


@pytest.mark.parametrize(
    "args", [args for _, args in COMMANDS], ids=[where for where, _ in COMMANDS]
)
def test_the_documented_command_parses(args: list[str]) -> None:
    try:
        parse_command_line(args)
    except click.exceptions.Exit:  # --version, --help: parsed
        pass
    except click.ClickException as exc:
        pytest.fail(f"botmesh {shlex.join(args)}: {exc.format_message()}")


def test_the_commands_are_found_and_a_wrong_one_is_refused() -> None:
    documented = {parse_command_line(args) for _, args in COMMANDS}
    assert {"worker", "run", "topics create", "dlq retry", "replay", "status"} <= documented
    for wrong in (["worker"], ["dlq", "list", "--kind", "sent"], ["replay", "--no-such"]):
        with pytest.raises(click.UsageError):
            parse_command_line(wrong)
    assert list(shell_commands("A=1 botmesh status --json | jq . &  # a comment\n")) == [
        (1, ["botmesh", "status", "--json"]),
        (1, ["jq", "."]),
    ]
    assert list(shell_commands("botmesh send \\\n    --key a#2  # the chat's\n")) == [
        (1, ["botmesh", "send", "--key", "a#2"])
    ]


def test_a_configuration_file_shown_is_one_botmesh_reads(tmp_path: Path) -> None:
    shown = [b for b in ALL if b.lang == "toml"]
    assert shown
    for block in shown:
        path = tmp_path / "botmesh.toml"
        path.write_text(block.code)
        assert read_config_file(path), block.where


# -- the README -------------------------------------------------------------------------------


def test_the_readme_is_a_front_door() -> None:
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= README_LINES, "move the detail to a page of docs/"
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", readme)
    broken = [t for t in targets if "://" not in t and not (ROOT / t).exists()]
    assert broken == []
