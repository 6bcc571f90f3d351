"""Search/replace hunks: how the model's editor and repairer change a kernel.

A small model rewrites a whole function badly (it copies it back, or drops a
line it did not mean to touch); a hunk names only the lines it changes. Each
hunk's ``search`` text must occur exactly once in the text it edits. It is
matched exactly first, then line by line with leading and trailing blanks
ignored (small models re-indent what they copy); a hunk that matches nowhere,
or more than once, is reported with the reason so the model can be told once.
Hunks apply in order, each to the result of the ones before it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Hunk:
    search: str
    replace: str


@dataclass(frozen=True)
class HunkFailure:
    index: int
    """Position of the hunk in the answer, from 1."""
    why: str


@dataclass(frozen=True)
class HunkResult:
    text: str
    """The edited text (the original when no hunk applied)."""
    applied: tuple[int, ...]
    """Positions (from 1) of the hunks that applied."""
    failures: tuple[HunkFailure, ...]

    def report(self) -> str:
        """The failures as the model should read them."""
        return "\n".join(f"hunk {f.index}: {f.why}" for f in self.failures)


def searchable_lines(kernel_text: str) -> list[str]:
    """The kernel's lines a hunk may search for: those with text that occur exactly once in it (the editor's
    grammar offers only these)."""
    lines = []
    for line in kernel_text.splitlines():
        if line.strip() and line not in lines and kernel_text.count(line) == 1:
            lines.append(line)
    return lines


def _exact(text: str, search: str) -> tuple[int, int] | str:
    first = text.find(search)
    if first < 0:
        return "not found"
    if text.find(search, first + 1) >= 0:
        return "found more than once; include more lines so it is unique"
    return first, first + len(search)


def _by_lines(text: str, search: str) -> tuple[int, int] | str:
    """The span of the lines of ``text`` that equal ``search``'s lines, blanks at both ends ignored."""
    wanted = [line.strip() for line in search.strip("\n").splitlines()]
    while wanted and not wanted[-1]:
        wanted.pop()
    if not wanted or not any(wanted):
        return "the search text is empty"
    lines = text.splitlines(keepends=True)
    stripped = [line.strip() for line in lines]
    offsets = [0]
    for line in lines:
        offsets.append(offsets[-1] + len(line))
    hits = [i for i in range(len(lines) - len(wanted) + 1) if stripped[i:i + len(wanted)] == wanted]
    if not hits:
        return "not found in the kernel; copy the lines to change exactly from the kernel"
    if len(hits) > 1:
        return f"found {len(hits)} times; include more lines so it is unique"
    start = hits[0]
    end = offsets[start + len(wanted)]
    # The replaced span ends before the last line's newline, so the replacement keeps it.
    if lines[start + len(wanted) - 1].endswith("\n"):
        end -= 1
    return offsets[start], end


def _reindent(replace: str, indent: str) -> str:
    """The replacement for a line-wise match: its first line follows the matched line's own indentation
    (kept in the text); when none of its other lines is indented, the model dropped the indentation
    the line-wise match ignored, and they get the matched line's back."""
    lines = replace.strip("\n").splitlines() or [""]
    rest = lines[1:]
    if indent and not any(line.startswith((" ", "\t")) for line in rest):
        rest = [indent + line if line.strip() else line for line in rest]
    return "\n".join([lines[0].lstrip(" \t"), *rest])


def apply_hunks(text: str, hunks: Sequence[Hunk]) -> HunkResult:
    """Apply ``hunks`` to ``text`` in order; those that do not match are skipped and reported."""
    applied: list[int] = []
    failures: list[HunkFailure] = []
    for number, hunk in enumerate(hunks, start=1):
        if not hunk.search.strip():
            failures.append(HunkFailure(number, "the search text is empty"))
            continue
        if hunk.search == hunk.replace:
            failures.append(HunkFailure(number, "search and replace are the same; the hunk changes nothing"))
            continue
        span = _exact(text, hunk.search)
        replacement = hunk.replace
        if span == "not found":
            # Only a missing text is looked for again, ignoring blanks at the ends of lines; one that occurs
            # more than once exactly would occur more than once line by line too.
            span = _by_lines(text, hunk.search)
            if isinstance(span, str):
                failures.append(HunkFailure(number, span))
                continue
            # The first matched line's indentation stays in the text; the replacement follows it.
            line = text[span[0]:span[1]]
            indent = line[: len(line) - len(line.lstrip(" \t"))]
            span = (span[0] + len(indent), span[1])
            replacement = _reindent(hunk.replace, indent)
        if isinstance(span, str):
            failures.append(HunkFailure(number, span))
            continue
        start, end = span
        text = text[:start] + replacement + text[end:]
        applied.append(number)
    return HunkResult(text, tuple(applied), tuple(failures))
