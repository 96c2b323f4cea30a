"""Every path the deployment files and the READMEs name is there: what a kustomization loads
(resources, components, patches, generators' files), the repository paths their comments
point a reader to (``kubectl apply -k deploy/k8s/...``), and every relative link of the
READMEs, down to the heading a ``file.md#section`` link names.

Nothing here runs kustomize or renders markdown: the files are read as text and YAML, so a
moved file or a renamed section fails here, not on a user's cluster or a reader's click.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml  # type: ignore[import-untyped]

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"

#: Folders a run creates (gitignored): a path into them names what a command will write.
_GENERATED = frozenset({".cache", ".run"})
#: The repository's top folders: a path in a comment or in prose starting with one of them
#: is read from the repository's root.
_TOP = ("deploy", "docs", "botmesh", "tests", "bench", ".ci")
#: ``deploy/k8s/x.yaml`` at a word's start (not ``/etc/botmesh/...``, not ``../botmesh/...``:
#: a user's own checkout, as in an example overlay).
_REPO_PATH = re.compile(
    r"(?<![\w./~-])(?:" + "|".join(re.escape(t) for t in _TOP) + r")/[\w.-]+(?:/[\w.-]+)*/?"
)
_LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)|!\[[^\]]*\]\(([^)\s]+)\)")
_FENCE = re.compile(r"^(```|~~~).*?^\1\s*$", re.MULTILINE | re.DOTALL)
_KUSTOMIZATION_NAMES = ("kustomization.yaml", "kustomization.yml", "Kustomization")


def _text_files(folder: Path) -> Iterator[Path]:
    for path in sorted(folder.rglob("*")):
        if not path.is_file() or _GENERATED & set(path.relative_to(ROOT).parts):
            continue
        if path.suffix in {".yaml", ".yml", ".md", ".sh", ".json", ".properties", ".xml", ".py"}:
            yield path


def kustomizations() -> list[Path]:
    return [p for p in _text_files(DEPLOY) if p.name in _KUSTOMIZATION_NAMES]


def readmes() -> list[Path]:
    return [ROOT / "README.md", *(p for p in _text_files(DEPLOY) if p.name == "README.md")]


# -- kustomizations ---------------------------------------------------------------------------


def _remote(entry: str) -> bool:
    return "://" in entry or entry.startswith(("github.com/", "git@"))


def kustomize_paths(doc: dict[str, Any]) -> list[str]:
    """The local paths a kustomization (or a Component) loads, in every field that takes one."""
    named: list[str] = []
    for field in ("resources", "components", "bases", "crds", "patchesStrategicMerge"):
        named += [e for e in doc.get(field) or [] if isinstance(e, str)]
    for field in ("generators", "transformers", "validators"):
        named += [e for e in doc.get(field) or [] if isinstance(e, str) and "\n" not in e]
    for field in ("patches", "patchesJson6902", "replacements"):
        named += [e["path"] for e in doc.get(field) or [] if isinstance(e, dict) and "path" in e]
    for field in ("configMapGenerator", "secretGenerator"):
        for gen in doc.get(field) or []:
            # ``files``: ``path`` or ``key=path``; ``envs``: paths; ``env``: one (old form)
            named += [f.split("=", 1)[-1] for f in gen.get("files") or []]
            named += list(gen.get("envs") or []) + ([gen["env"]] if gen.get("env") else [])
    openapi = doc.get("openapi") or {}
    if isinstance(openapi, dict) and "path" in openapi:
        named.append(openapi["path"])
    return [e for e in named if not _remote(e)]


def test_kustomize_paths_reads_every_field_that_names_a_file() -> None:
    doc = {
        "resources": ["a.yaml", "https://example.com/x.yaml", "github.com/o/r//k?ref=v1"],
        "components": ["../c"],
        "patches": [{"path": "p.yaml"}, {"patch": "- op: remove"}],
        "configMapGenerator": [{"files": ["k=f.txt", "g.txt"], "envs": ["e.env"]}],
        "secretGenerator": [{"env": "s.env"}],
        "patchesStrategicMerge": ["sm.yaml"],
    }
    assert kustomize_paths(doc) == [
        "a.yaml",
        "../c",
        "sm.yaml",
        "p.yaml",
        "f.txt",
        "g.txt",
        "e.env",
        "s.env",
    ]


def test_every_path_a_kustomization_loads_is_there() -> None:
    found = kustomizations()
    assert {p.parent.relative_to(ROOT).as_posix() for p in found} >= {
        "deploy/k8s",
        "deploy/k8s/components/servicemonitor",
    }
    missing: list[str] = []
    for path in found:
        [doc] = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
        for entry in kustomize_paths(doc):
            target = (path.parent / entry).resolve()
            loaded = target.is_file() or any((target / n).is_file() for n in _KUSTOMIZATION_NAMES)
            if not loaded:
                missing.append(f"{path.relative_to(ROOT)}: {entry}")
    assert not missing, missing


# -- paths named in comments and prose ----------------------------------------------------------


def repo_paths(text: str) -> list[str]:
    """The repository paths ``text`` names (``deploy/k8s/README.md``, ``docs/``)."""
    return [m.group(0).rstrip(".") for m in _REPO_PATH.finditer(text)]


def test_repo_paths_finds_paths_and_leaves_others() -> None:
    text = (
        "kubectl apply -k deploy/k8s/overlays/monitoring  # see `docs/operating.md`.\n"
        "mounted at /etc/botmesh/kafka-tls; ../botmesh/deploy/k8s in your overlay; "
        "(tests/test_deploy_k8s.py)"
    )
    assert repo_paths(text) == [
        "deploy/k8s/overlays/monitoring",
        "docs/operating.md",
        "tests/test_deploy_k8s.py",
    ]


def test_every_repository_path_the_deployment_files_name_is_there() -> None:
    files = [*_text_files(DEPLOY), ROOT / "README.md", ROOT / "Dockerfile"]
    checked = 0
    missing: list[str] = []
    for path in files:
        for line_no, line in enumerate(path.read_text().splitlines(), 1):
            for named in repo_paths(line):
                if _GENERATED & set(Path(named).parts):
                    continue  # a run writes it
                checked += 1
                if not (ROOT / named).exists():
                    missing.append(f"{path.relative_to(ROOT)}:{line_no}: {named}")
    assert checked >= 20
    assert not missing, missing


#: A section named in prose: ``(README, "Channels")``, ``docs/operating.md "Traces"``.
_SECTION = re.compile(r"\b(README|[\w./-]+\.md)(?:'s)?,? \"([^\"]+)\"")


def test_every_section_the_deployment_files_name_is_there() -> None:
    """``README`` is the repository's; ``x.md`` a path from the repository's root."""
    missing: list[str] = []
    for path in [*_text_files(DEPLOY), ROOT / "README.md"]:
        for name, section in _SECTION.findall(path.read_text()):
            page = ROOT / ("README.md" if name == "README" else name)
            if not page.is_file() or slug(section) not in anchors(page.read_text()):
                missing.append(f"{path.relative_to(ROOT)}: {name}, {section!r}")
    assert not missing, missing


# -- README links -----------------------------------------------------------------------------


def slug(heading: str) -> str:
    """GitHub's anchor of a heading (mkdocs' toc makes the same for our headings)."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link: its text
    text = re.sub(r"[^\w\- ]", "", text.strip().lower())
    return text.replace(" ", "-")


def anchors(markdown: str) -> set[str]:
    """The anchors of a markdown file: its headings' slugs (GitHub numbers repeats: ``-1``),
    ``{#id}`` attributes and ``<a name|id="...">`` tags."""
    found: set[str] = set()
    counts: dict[str, int] = {}
    for match in re.finditer(r"^#{1,6}\s+(.+?)\s*#*\s*$", _FENCE.sub("", markdown), re.M):
        heading = match.group(1)
        explicit = re.search(r"\{#([\w-]+)\}\s*$", heading)
        if explicit:
            found.add(explicit.group(1))
            continue
        base = slug(heading)
        n = counts.get(base, 0)
        counts[base] = n + 1
        found.add(base if n == 0 else f"{base}-{n}")
    found |= set(re.findall(r"<a\s+(?:name|id)=\"([^\"]+)\"", markdown))
    return found


def links(markdown: str) -> list[str]:
    """The link targets of a markdown file, outside code blocks and code spans."""
    text = re.sub(r"`[^`\n]*`", "", _FENCE.sub("", markdown))
    return [a or b for a, b in _LINK.findall(text)]


def test_anchors_and_links_read_markdown_as_github_does() -> None:
    page = (
        "# botmesh\n## Set-up\n## The worker on `Kafka`\n## Set-up\n### Apply it {#apply}\n"
        "```\n## not a heading\n[not a link](nowhere.md)\n```\n"
        "See [a](docs/x.md#set-up), ![img](i.png) and `[code](no.md)`, [web](https://x.org).\n"
    )
    assert anchors(page) == {"botmesh", "set-up", "the-worker-on-kafka", "set-up-1", "apply"}
    assert links(page) == ["docs/x.md#set-up", "i.png", "https://x.org"]


@pytest.mark.parametrize("readme", readmes(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_of_the_readmes_resolves(readme: Path) -> None:
    missing: list[str] = []
    for target in links(readme.read_text()):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):
            continue  # https:, mailto:
        file_part, _, anchor = target.partition("#")
        linked = (readme.parent / file_part).resolve() if file_part else readme
        if not linked.exists():
            missing.append(f"{target}: no {linked.relative_to(ROOT)}")
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked.read_text()):
            missing.append(f"{target}: no heading #{anchor} in {linked.relative_to(ROOT)}")
    assert not missing, missing
