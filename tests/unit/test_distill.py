"""Verified rewrites as the editor's and planner's training chats (kernel_lsp.core.distill, services.distill_data)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kernel_lsp.config import Settings
from kernel_lsp.core.distill import declared_names, hunks_between, rename_locals, widen_indices
from kernel_lsp.core.hunks import apply_hunks
from kernel_lsp.core.spec import parse_spec
from kernel_lsp.services import distill_data as dd
from kernel_lsp.services.model_jobs import edit_schema, parse_choice, parse_edit, searchable_lines
from kernel_lsp.services.session import Session

ROOT = Path(__file__).resolve().parents[2]

BEFORE = """__global__ void k(float *out, const float *in, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        float v = in[i];
        out[i] = 2.0f * v;
    }
}"""


def test_the_hunks_are_whole_unique_lines_and_give_the_rewrite_back() -> None:
    after = BEFORE.replace("const float *in", "const float *__restrict__ in").replace(
        "        float v = in[i];", "        float v = __ldg(&in[i]);\n        v += 0.0f;")
    hunks = hunks_between(BEFORE, after)
    assert hunks is not None and len(hunks) == 2
    lines = searchable_lines(BEFORE)
    assert all(h.search in lines for h in hunks)
    assert apply_hunks(BEFORE, hunks).text == after


def test_an_insertion_goes_with_a_unique_neighbour_and_a_deletion_leaves_a_blank_line() -> None:
    inserted = BEFORE.replace("    if (i < n) {", "    #pragma unroll 1\n    if (i < n) {")
    [hunk] = hunks_between(BEFORE, inserted)
    assert hunk.search == "    int i = blockIdx.x * blockDim.x + threadIdx.x;" and apply_hunks(BEFORE, [hunk]).text == inserted
    deleted = BEFORE.replace("        float v = in[i];\n        out[i] = 2.0f * v;", "        out[i] = 2.0f * in[i];")
    hunks = hunks_between(BEFORE, deleted)
    assert hunks is not None and apply_hunks(BEFORE, hunks).text.replace("\n\n", "\n") == deleted


def test_a_change_to_a_line_that_is_not_unique_cannot_be_written() -> None:
    # "    }" closes both the if and (with other indentation) nothing else, but "}" lines repeat.
    twice = BEFORE.replace("    }\n}", "    }\n    }\n}").replace("    if (i < n) {", "    if (i < n) {\n    {")
    assert hunks_between(twice, twice.replace("    }\n    }\n}", "    } }\n}")) is None


def test_locals_are_renamed_alike_and_parameters_kept() -> None:
    after = BEFORE.replace("        float v = in[i];", "        float v = __ldg(&in[i]);")
    assert declared_names(BEFORE) == ("i", "v")
    before2, after2 = rename_locals((BEFORE, after), {"i": "idx", "v": "val"})
    assert "idx < n" in before2 and "__ldg(&in[idx])" in after2 and "float val" in after2
    # A new name that is already an identifier would be captured: refused.
    assert rename_locals((BEFORE, after), {"i": "n"}) is None
    assert hunks_between(before2, after2) is not None


def test_thread_indices_are_widened_alike_or_not_at_all() -> None:
    after = BEFORE.replace("        float v = in[i];", "        float v = __ldg(&in[i]);")
    before2, after2 = widen_indices((BEFORE, after))
    assert "    long i = blockIdx.x" in before2 and "    long i = blockIdx.x" in after2 and "__ldg" in after2
    # A rewrite that no longer declares the index as int: no variant (it would not carry the same change).
    assert widen_indices((BEFORE, after.replace("int i =", "unsigned i ="))) is None
    assert widen_indices(("__global__ void k(int n) { int m = n; }",) * 2) is None


@pytest.fixture(scope="module")
def session(tmp_path_factory):
    return Session(Settings(kb_path=str(tmp_path_factory.mktemp("kb") / "kb.sqlite")), workspace_root=str(ROOT),
                   use_kb=False)


def _corpus(name: str):
    folder = ROOT / "benchmarks" / "corpus" / name
    spec = parse_spec(json.loads((folder / "spec.json").read_text()), str(folder))
    return (folder / "kernel.cu").read_text(), str(folder / "kernel.cu"), spec


def test_a_corpus_kernels_verified_rewrites_become_editor_and_planner_chats(session) -> None:
    run = json.loads((ROOT / "benchmarks" / "results" / "corpus_suite.json").read_text())
    outcomes = dd.outcomes_in_corpus_run(run)
    accepted = dd.faster(outcomes)
    name = "rodinia_hotspot"
    assert accepted[name], "the recorded run accepted candidates of this kernel"
    source, path, spec = _corpus(name)
    found = dd.rewrites(name, source, path, spec, accepted[name], session, heldout=False)
    assert found and all(r.generator in accepted[name] for r in found)
    rows = list(dd.chat_rows(found, variants=1))
    assert rows
    for row in rows:
        system, user, answer = row["messages"]
        assert system["role"] == "system" and user["role"] == "user" and answer["role"] == "assistant"
        meta = row["metadata"]
        assert meta["split"] == "train" and meta["job"] == "editor" and meta["speedup"] > 1.0
        kernel = user["content"].split("```cuda\n", 1)[1].split("\n```", 1)[0]
        hunks, _plan = parse_edit(answer["content"])
        # The answer is one the editor's grammar allows, and it makes the verified kernel.
        allowed = edit_schema(searchable_lines(kernel))["properties"]["hunks"]["items"]["properties"]["search"]["enum"]
        assert all(h.search in allowed for h in hunks)
        rewrite = next(r for r in found if r.generator == meta["generator"])
        made = apply_hunks(kernel, hunks).text
        if meta["variant"] == "original":
            assert [line for line in made.splitlines() if line.strip()] == \
                [line for line in rewrite.after.splitlines() if line.strip()]
    plan = dd.planner_chat(name, source, path, spec, outcomes[name], session, heldout=True)
    assert plan is not None and plan["metadata"]["split"] == "heldout"
    recorded = plan["metadata"]["recorded"]
    # The answer is the entry recorded fastest; entries none of whose candidates ran are unknown, not slow.
    assert recorded[plan["metadata"]["choice"]] == max(v for v in recorded.values() if v is not None) > 1.0
    assert set(recorded) == set(plan["metadata"]["menu"])
    choice = parse_choice(plan["messages"][2]["content"], plan["metadata"]["menu"])
    assert choice is not None and choice[0] == plan["metadata"]["choice"]


def test_the_committed_data_keeps_held_out_kernels_out_of_training() -> None:
    rows = [json.loads(line) for line in (ROOT / "training" / "data" / "chats.jsonl").read_text().splitlines()]
    heldout = set()
    for folder in (ROOT / "benchmarks" / "corpus").iterdir():
        spec_file = folder / "spec.json"
        if spec_file.is_file() and (json.loads(spec_file.read_text()).get("notes") or {}).get("heldout"):
            heldout.add(folder.name)
    assert heldout
    for row in rows:
        meta = row["metadata"]
        assert (meta["split"] == "heldout") == (meta["name"] in heldout), meta
        # The closest example shown in a prompt never comes from a held-out kernel.
        assert meta.get("example_from") not in heldout
