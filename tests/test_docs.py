"""The front door and the manual (README.md, docs/*.md) hold together: every relative link resolves (the file exists,
and an ``#anchor`` names a heading of the target file by GitHub's slug), the README stays at most 300 lines and links
every page of docs/, names every registered backend in backticks, and every ``make <target>`` the pages show exists in
the Makefile. Standard library only: the registry is read from backends/__init__.py's source, no torch import."""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
README_MAX_LINES = 300
FENCE = re.compile(r"^\s*(```|~~~)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
INLINE_CODE = re.compile(r"(`+)(.+?)\1")
# [text](target) and ![alt](target); the target ends at the first space (an optional "title") or ")"
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
MAKE = re.compile(r"(?<![\w-])make\s+(?:[A-Z_][A-Z0-9_]*=\S*\s+)*([a-z][a-z0-9_-]*)")


def pages() -> list[Path]:
    return [README, *sorted((ROOT / "docs").glob("*.md"))]


def split(text: str) -> tuple[list[str], list[str]]:
    """(prose lines, code lines): lines inside fenced blocks are code, the rest prose."""
    prose, code, fenced = [], [], False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        (code if fenced else prose).append(line)
    return prose, code


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: code and link markup dropped, lower case, every character but letters, digits,
    ``_``, ``-`` and spaces removed (emphasis ``*`` with them; ``_`` stays, as GitHub keeps it), spaces to hyphens."""
    text = INLINE_CODE.sub(lambda m: m.group(2), heading)
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", text)  # a link in a heading keeps its text
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every heading's anchor in ``path``, with GitHub's -1, -2 ... for repeated headings."""
    seen: dict[str, int] = {}
    out = set()
    for line in split(path.read_text())[0]:
        m = HEADING.match(line)
        if not m:
            continue
        base = slug(m.group(2))
        n = seen.get(base, 0)
        out.add(base if n == 0 else f"{base}-{n}")
        seen[base] = n + 1
    return out


def links(path: Path) -> list[str]:
    """The link targets of ``path``'s prose (not inside code blocks or inline code)."""
    out = []
    for line in split(path.read_text())[0]:
        out += LINK.findall(INLINE_CODE.sub("", line))
    return out


def broken_links(path: Path) -> list[str]:
    """Every relative link of ``path`` that does not resolve: a missing file, or an anchor no heading has."""
    bad = []
    for target in links(path):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):  # https:, mailto: ...: not ours to check
            continue
        file, _, anchor = target.partition("#")
        dest = (path.parent / file).resolve() if file else path
        if not dest.exists():
            bad.append(f"{path.relative_to(ROOT)}: {target} (no such file)")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            bad.append(f"{path.relative_to(ROOT)}: {target} (no heading #{anchor} in {dest.relative_to(ROOT)})")
    return bad


def registered_backends() -> list[str]:
    """The names in backends/__init__.py's REGISTRY, read from its source."""
    tree = ast.parse((ROOT / "backends" / "__init__.py").read_text())
    for node in tree.body:
        target = node.target if isinstance(node, ast.AnnAssign) else (node.targets[0] if isinstance(node, ast.Assign)
                                                                      else None)
        if isinstance(target, ast.Name) and target.id == "REGISTRY":
            return [ast.literal_eval(key) for key in node.value.keys]  # the entries name shared dicts: keys only
    raise AssertionError("backends/__init__.py has no REGISTRY")


def make_targets() -> set[str]:
    return set(re.findall(r"^([A-Za-z0-9_.-]+)\s*:(?!=)", (ROOT / "Makefile").read_text(), re.M))


def make_mentions(path: Path) -> set[str]:
    """The targets of ``make ...`` in ``path``'s code: inline code spans and fenced blocks (prose says "make sure")."""
    prose, code = split(path.read_text())
    spans = [m.group(2) for line in prose for m in INLINE_CODE.finditer(line)]
    return {t for text in spans + code for t in MAKE.findall(text)}


@pytest.mark.parametrize("path", pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(path):
    assert not broken_links(path), "\n".join(broken_links(path))


def test_the_readme_is_a_front_door_not_a_manual():
    lines = len(README.read_text().splitlines())
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines (at most {README_MAX_LINES}: move detail to docs/)"


def test_the_readme_links_every_docs_page():
    linked = {(ROOT / t.partition("#")[0]).resolve() for t in links(README)}
    unlinked = [p.name for p in sorted((ROOT / "docs").glob("*.md")) if p.resolve() not in linked]
    assert not unlinked, f"README.md does not link docs/{', docs/'.join(unlinked)}"


def test_the_readme_names_every_registered_backend():
    text = README.read_text()
    missing = [n for n in registered_backends() if f"`{n}`" not in text]
    assert not missing, f"README.md's backends table lacks {', '.join(missing)} (in backticks)"


@pytest.mark.parametrize("path", pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_make_target_shown_exists(path):
    unknown = sorted(make_mentions(path) - make_targets())
    assert not unknown, f"{path.relative_to(ROOT)} shows make {', make '.join(unknown)}: not a Makefile target"


def test_the_checks_can_fail(tmp_path):
    """A broken file link, a broken anchor, a duplicate heading's anchor and an unknown make target are caught."""
    (tmp_path / "a.md").write_text("# Top\n\n## Two `words`: here\n\n## Two words here\n\n```\n# not a heading\n```\n")
    page = tmp_path / "b.md"
    page.write_text("[ok](a.md#two-words-here) [dup](a.md#two-words-here-1) [self](#b) [web](https://x.org/#y)\n"
                    "# B\n[gone](c.md) [no anchor](a.md#not-a-heading) `[in code](nowhere.md)`\n"
                    "`make bench` `make no-such-target` make sure\n")
    global ROOT
    saved, ROOT = ROOT, tmp_path
    try:
        assert broken_links(page) == ["b.md: c.md (no such file)",
                                      "b.md: a.md#not-a-heading (no heading #not-a-heading in a.md)"]
    finally:
        ROOT = saved
    assert make_mentions(page) == {"bench", "no-such-target"}
    assert "no-such-target" not in make_targets() and "bench" in make_targets()
    assert slug("Saying why: communication, bandwidth, FLOPs, energy, prediction") == \
        "saying-why-communication-bandwidth-flops-energy-prediction"
    assert slug("Real data: an ImageNet folder") == "real-data-an-imagenet-folder"
    assert slug("The example: `allreduce_flat`") == "the-example-allreduce_flat"
    assert slug("nn.DataParallel, **fairly**") == "nndataparallel-fairly"
