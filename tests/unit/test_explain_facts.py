"""``optimize --explain`` on every corpus kernel (held-out ones included), every kernel from outside the corpus and
every example names facts, never text shapes.

Every rule is a transformation over the kernel model: a refusal says which fact of the analysis is
missing (a barrier, a guard, a bound, an index's stride), not which way of writing the code it was
built to match. The explain path is run as the CLI runs it (the session's preprocessed view of the
file) and every refusal is checked against the phrases the text-shape rules used to refuse with.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from kernel_lsp.config import Settings
from kernel_lsp.core.rules import RULES, evaluate
from kernel_lsp.core.spec import parse_spec
from kernel_lsp.services.session import Session

ROOT = Path(__file__).resolve().parents[2]
CORPUS = ROOT / "benchmarks" / "corpus"
OUTSIDE = ROOT / "benchmarks" / "outside"
EXAMPLES = ROOT / "examples"

#: What a refusal that names a text shape says: a statement or header it expected to look a given way.
TEXT_SHAPES = (
    re.compile(r"the body is not"),
    re.compile(r"global index declarations?"),
    re.compile(r"no '(for|if|int)\b"),
    re.compile(r"is not '(for|if|int|T )"),
    re.compile(r"(first|second|last|final) statement is not"),
    re.compile(r"not a plain statement"),
    re.compile(r"plain `"),
    re.compile(r"is not `(init|var|for|if)"),
    re.compile(r"header is not"),
    re.compile(r"which is not a barrier, a declaration or a tree step"),
    re.compile(r"is not one of:"),
    re.compile(r"not a counted( `?for`?)? loop"),
    re.compile(r"is not one update"),
    re.compile(r"statement is not"),
    re.compile(r"is not (of the form|written as)"),
    re.compile(r"(condition|test) is not `"),
)


def _targets() -> list[tuple[str, Path, Path]]:
    found = []
    for entry in [*sorted(CORPUS.iterdir()), *sorted(OUTSIDE.iterdir())]:
        spec = entry / "spec.json"
        if entry.name.startswith("_") or not spec.is_file():
            continue
        found.append((entry.name if entry.parent == CORPUS else f"outside:{entry.name}", entry / "kernel.cu", spec))
    for example in sorted(p for p in EXAMPLES.iterdir() if (p / "original.cu").is_file()):
        found.append((f"example:{example.name}", example / "original.cu", example / "spec.json"))
    return found


TARGETS = _targets()
_SESSION = Session(Settings(), workspace_root=str(ROOT), use_kb=False)


def test_the_phrases_catch_the_old_refusals() -> None:
    old = ["the body is not 'int r = global index; if (r < rows) { ... }'", "no x and y global index declarations",
           "no 'for (base = begin; base < end; base += blockDim.x)' tile loop",
           "its body holds `x = 1;`, which is not a barrier, a declaration or a tree step",
           "not a plain statement `A[i] = v;`", "its header is not `init; var < bound; var++`"]
    assert all(any(p.search(text) for p in TEXT_SHAPES) for text in old)


@pytest.mark.parametrize("name,path,spec_path", TARGETS, ids=[t[0] for t in TARGETS])
def test_explain_names_facts_only(name: str, path: Path, spec_path: Path) -> None:
    source = path.read_text(encoding="utf-8")
    spec = parse_spec(json.loads(spec_path.read_text()), str(spec_path.parent))
    outcomes = evaluate(source, spec.kernel, spec, preprocessed=_SESSION.preprocessed(str(path), source))
    assert [o.rule for o in outcomes] == [r.name for r in RULES]
    shapes = [(o.rule, o.why) for o in outcomes if not o.applicable and any(p.search(o.why) for p in TEXT_SHAPES)]
    assert not shapes, shapes
    assert all(o.why.strip() for o in outcomes)
    failed = [(o.rule, o.why) for o in outcomes if "a defect in kernel-lsp" in o.why]
    assert not failed, failed
