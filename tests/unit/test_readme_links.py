"""Every relative link in the repository's Markdown files resolves in a clone: the file or folder exists inside
the repository, and an anchor (``README.md#beside-clangd``, ``#quick-start``) names a heading of the file it points
into, by GitHub's heading ids. Links to other sites are not fetched (nothing here reaches the network)."""

from __future__ import annotations

import re
import unicodedata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: Folders that are not the project's documents (installs, builds, caches).
SKIPPED = {"node_modules", "build", "dist", "out", "__pycache__"}

_FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.M | re.S)
_CODE_SPAN = re.compile(r"(`+)(.+?)\1", re.S)
_INLINE = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]*)>?(?:\s+\"[^\"]*\")?\s*\)")
_REFERENCE = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$", re.M)
_HTML = re.compile(r"""<(?:a|img)\b[^>]*?\b(?:href|src)\s*=\s*["']([^"']*)["']""", re.I)
_HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$", re.M)
_SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:|^//")


def markdown_files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*.md")
                  if not any(part.startswith(".") or part in SKIPPED for part in p.relative_to(root).parts[:-1]))


def _prose(text: str) -> str:
    """The text without fenced code blocks and code spans (a link written inside code is an example, not a link)."""
    return _CODE_SPAN.sub(" ", _FENCE.sub("", text))


def links(text: str) -> list[str]:
    prose = _prose(text)
    return [m.group(1) for pattern in (_INLINE, _REFERENCE, _HTML) for m in pattern.finditer(prose)]


def slug(heading: str) -> str:
    """GitHub's id for a heading: its text (code, emphasis and links as their words), lower case, every character
    but letters, marks, digits, ``_``, ``-`` and spaces dropped, spaces as ``-``."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading).replace("`", "").lower()
    kept = "".join(c for c in text if c in " -_" or unicodedata.category(c)[0] in "LMN")
    return kept.replace(" ", "-")


def anchors(text: str) -> set[str]:
    """The ids of a Markdown file's headings, duplicates numbered as GitHub numbers them (``-1``, ``-2``)."""
    seen: dict[str, int] = {}
    ids = set()
    for match in _HEADING.finditer(_FENCE.sub("", text)):
        base = slug(match.group(2))
        count = seen.get(base, 0)
        seen[base] = count + 1
        ids.add(base if count == 0 else f"{base}-{count}")
    return ids


def broken_links(path: Path, root: Path) -> list[str]:
    """Each relative link of the Markdown file ``path`` that does not resolve inside ``root``, with why."""
    text = path.read_text(encoding="utf-8")
    problems = []
    for target in links(text):
        if not target or _SCHEME.match(target):
            continue
        file_part, _, anchor = target.partition("#")
        resolved = (path.parent / file_part).resolve() if file_part else path
        where = f"{path.relative_to(root)}: ({target})"
        if not resolved.is_relative_to(root.resolve()):
            problems.append(f"{where} points outside the repository")
        elif not resolved.exists():
            problems.append(f"{where} names no file")
        elif anchor:
            if resolved.suffix != ".md" or resolved.is_dir():
                problems.append(f"{where} has an anchor into a file that is not Markdown")
            elif anchor not in anchors(resolved.read_text(encoding="utf-8")):
                problems.append(f"{where}: no heading with the id '{anchor}'")
    return problems


def test_every_relative_link_and_anchor_in_the_repository_resolves():
    files = markdown_files(ROOT)
    assert ROOT / "README.md" in files and ROOT / "examples" / "README.md" in files
    checked = sum(1 for f in files for t in links(f.read_text(encoding="utf-8")) if t and not _SCHEME.match(t))
    assert checked >= 20  # the READMEs link their files; a checker that finds none checks nothing
    problems = [problem for f in files for problem in broken_links(f, ROOT)]
    assert problems == []


def test_the_checker_finds_missing_files_anchors_and_links_out_of_the_repository(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "guide.md").write_text("# Guide\n\n## Set-up: the two commands\n\n## Set-up: the two commands\n")
    (tmp_path / "README.md").write_text(
        "See [the guide](docs/guide.md#set-up-the-two-commands), [again](docs/guide.md#set-up-the-two-commands-1),\n"
        "[gone](docs/missing.md), [no heading](docs/guide.md#install), [up](../elsewhere.md),\n"
        "[site](https://example.com/x.md), ![logo](docs/logo.png), `[code](not/a/link.md)` and\n"
        "```\n[fenced](also/not.md)\n```\n"
        '<a href="docs/">folder</a> <a href="docs/nothing/">gone</a>\n[ref]: docs/guide.md#guide\n')
    problems = broken_links(tmp_path / "README.md", tmp_path)
    assert problems == [
        "README.md: (docs/missing.md) names no file",
        "README.md: (docs/guide.md#install): no heading with the id 'install'",
        "README.md: (../elsewhere.md) points outside the repository",
        "README.md: (docs/logo.png) names no file",
        "README.md: (docs/nothing/) names no file",
    ]


def test_heading_ids_follow_github():
    assert slug("Set-up: the two commands") == "set-up-the-two-commands"
    assert slug("Neovim (0.7 or newer; 0.11's `vim.lsp.config` where present)") == \
        "neovim-07-or-newer-011s-vimlspconfig-where-present"
    assert slug("`manifest.json`") == "manifestjson"
    assert slug("[Beside](x.md) clangd") == "beside-clangd"
