"""Every counted ``for`` loop of every corpus kernel written the two other ways real code writes it (the counter
declared before a ``for`` without an initializer, and a ``while`` loop stepped at the end of its body): no rule
fails on the rewritten kernel. With ``KL_LOOP_FORMS_COMPILE=1`` and nvcc on PATH, every distinct candidate of a
rule that edits loops is compiled too (several hundred nvcc runs: minutes, so not by default)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest

from kernel_lsp.core.analysis import node_text, parse_text
from kernel_lsp.core.candidates import OptimizeRequest
from kernel_lsp.core.rules import RuleGenerator
from kernel_lsp.core.source import preprocess
from kernel_lsp.services.source_view import header_reader
from nvcc_check import compiles

CORPUS = Path(__file__).resolve().parents[2] / "benchmarks" / "corpus"
ENTRIES = sorted(p.name for p in CORPUS.iterdir() if (p / "spec.json").is_file() and not p.name.startswith("_"))
#: Rules whose rewrites move, split, copy or unroll a loop.
LOOP_RULES = ("warp-per-row", "block-per-row", "split-", "sector-per-row", "tile-contraction", "fixed-trip", "stencil",
              "row-cache", "load-batch", "register-accumulate", "shared-tile")


def loop_forms(text: str) -> list[tuple[str, str]]:
    """(name, text) of the kernel with one ``for (T v = e; c; u) { … }`` written as ``{ T v = e; for (; c; u) { … } }``
    or as ``{ T v = e; while (c) { … u; } }`` (the latter only where no ``continue`` would skip ``u``)."""
    src, root = parse_text(text)
    found, stack = [], [root]
    while stack:
        n = stack.pop()
        if n.type == "for_statement":
            found.append(n)
        stack.extend(n.children)
    out = []
    for n in found:
        init, cond, update, body = (n.child_by_field_name(f) for f in ("initializer", "condition", "update", "body"))
        if None in (init, cond, update, body) or init.type != "declaration" or body.type != "compound_statement":
            continue
        decl, test, step = node_text(src, init).rstrip(";"), node_text(src, cond), node_text(src, update)
        before, inner, after = src[:n.start_byte], src[body.start_byte:body.end_byte], src[n.end_byte:]
        line = n.start_point[0] + 1
        out.append((f"line {line} without an initializer",
                    (before + f"{{ {decl}; for (; {test}; {step}) ".encode() + inner + b" }" + after).decode()))
        if b"continue" not in inner:
            out.append((f"line {line} as a while loop",
                        (before + f"{{ {decl}; while ({test}) ".encode() + inner[:-1] + f" {step}; }} }}".encode()
                         + after).decode()))
    return out


@pytest.mark.parametrize("name", ENTRIES)
def test_every_loop_form_of_the_corpus_is_read_without_a_defect(name, tmp_path):
    path = str(CORPUS / name / "kernel.cu")
    spec = json.loads((CORPUS / name / "spec.json").read_text())
    reader = header_reader((os.path.dirname(path), str(CORPUS)))
    compile_all = os.environ.get("KL_LOOP_FORMS_COMPILE") == "1" and shutil.which("nvcc") is not None
    seen: set[str] = set()
    for form, text in loop_forms(Path(path).read_text()):
        generator = RuleGenerator(preprocessed=preprocess(text, path, reader),
                                  reprocess=lambda t: preprocess(t, path, reader))
        candidates = list(generator.generate(OptimizeRequest(source=text, path=path, kernel=spec["kernel"], spec=spec)))
        defects = [(o.rule, o.why) for o in generator.outcomes if "a defect in kernel-lsp" in o.why]
        assert not defects, (form, defects)
        if not compile_all:
            continue
        for c in candidates:
            digest = hashlib.sha256(c.source.encode()).hexdigest()
            if digest in seen or not any(rule in c.generator for rule in LOOP_RULES):
                continue
            seen.add(digest)
            compiles(c.source, tmp_path / digest[:12], CORPUS / name)
