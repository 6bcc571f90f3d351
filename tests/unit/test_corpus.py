"""The real-code corpus (``benchmarks/corpus/``): every entry is a usable, attributed benchmark.

Data-driven over every ``benchmarks/corpus/NAME/`` folder: the spec parses and
describes the kernel's parameters in order and type, the launch evaluates at the
main size and at every variant, the notes hold what the baseline needs, and
ORIGIN names a repository (not one kept for independent evaluation), a full
commit, a path and a licence file that is present. At least 30 entries are held
out (``"heldout": true`` in their notes). The ``nvcc`` test compiles every
``kernel.cu`` for sm_90 and finds the kernel's entry in the cubin.
"""

from __future__ import annotations

import json
import math
import re
import shutil
from pathlib import Path

import pytest

from kernel_lsp.core import expr
from kernel_lsp.core.index import build_index
from kernel_lsp.core.parse import comment_ranges
from kernel_lsp.core.source import directive_lines, preprocess
from kernel_lsp.core.spec import FLOAT_TYPES, ArrayParam, ScalarParam, parse_spec
from kernel_lsp.core.static_check import spec_type_matches

CORPUS = Path(__file__).resolve().parents[2] / "benchmarks" / "corpus"
ENTRIES = sorted(p.name for p in CORPUS.iterdir() if p.is_dir() and not p.name.startswith("_"))
#: Kernels from outside the corpus, tried as a new user would (``corpus_suite.py --corpus benchmarks/outside``):
#: attributed and usable as the corpus's are, measured on their own.
OUTSIDE = CORPUS.parent / "outside"
OUTSIDE_ENTRIES = sorted(p.name for p in OUTSIDE.iterdir() if p.is_dir() and not p.name.startswith("_"))

#: Suites kept for independent evaluation: nothing in the corpus may come from them.
RESERVED_REPOS = ("llnl/rajaperf", "zjin-lcf/hecbench", "nvidia/cuda-samples")
#: The categories the issue asks the corpus to cover.
CATEGORIES = frozenset((
    "streaming", "stencil1d", "stencil2d", "stencil3d", "reduction", "histogram", "transpose", "gemm",
    "batched_contraction", "allpairs", "softmax", "normalisation", "gather", "scan", "underfilled", "other",
))
#: Local headers a kernel folder may include (searched for type aliases such as ``DATA_TYPE``); Rodinia's srad
#: kernels get ``fp`` from ``define.c``, which its host includes before them.
HEADER_SUFFIXES = (".cuh", ".h", ".hpp", ".c")


def folder_of(name: str) -> Path:
    return (OUTSIDE if name in OUTSIDE_ENTRIES else CORPUS) / name


def spec_of(name: str):
    path = folder_of(name) / "spec.json"
    return parse_spec(json.loads(path.read_text(encoding="utf-8")), str(path.parent))


def origin_of(name: str) -> dict[str, str]:
    fields: dict[str, str] = {}
    for line in (folder_of(name) / "ORIGIN").read_text(encoding="utf-8").splitlines():
        match = re.match(r"^([a-z]+):\s*(.*)$", line)
        if match and match.group(1) not in fields:
            fields[match.group(1)] = match.group(2).strip()
    return fields


def index_of(name: str, source: str):
    """The kernel index of ``kernel.cu`` with its own macros' view, as the server and the rules read it (a
    macro between a kernel's type and its name, SHOC's ``LAUNCH_BOUNDS``, hides the kernel from the text alone)."""
    data = source.encode()
    lines = "".join(line + "\n" for line in directive_lines(data, comment_ranges(data)))
    return build_index(source, preprocess(lines, str(folder_of(name) / "kernel.cu")))


def local_sources(name: str) -> list[Path]:
    """kernel.cu and the local headers it may include (its folder and ``_common``)."""
    folder = folder_of(name)
    found = [folder / "kernel.cu"]
    for where in (folder, CORPUS / "_common"):
        found += sorted(p for p in where.iterdir() if p.suffix in HEADER_SUFFIXES)
    return found


def type_aliases(name: str) -> dict[str, set[str]]:
    """``#define NAME type`` and ``typedef type NAME;`` of the kernel's local files: name -> every spelling found.

    The index reads the file as written (local includes are not expanded yet), so
    a parameter declared ``DATA_TYPE *a`` has base type ``DATA_TYPE``; the alias
    tells the test which C type that is. A name defined differently in ``#if``
    branches (llm.c's ``floatX``) has several spellings: the compiler decides
    which one holds, so :func:`test_kernel_compiles_for_sm90_with_its_entry`
    checks those parameters on the preprocessed text instead.
    """
    aliases: dict[str, set[str]] = {}
    word = r"(?:unsigned\s+|signed\s+|const\s+)*[A-Za-z_]\w*(?:\s+(?:long|int))*"
    for path in local_sources(name):
        text = path.read_text(encoding="utf-8")
        for match in re.finditer(rf"^\s*#\s*define\s+([A-Za-z_]\w*)\s+({word})\s*$", text, re.M):
            aliases.setdefault(match.group(1), set()).add(match.group(2))
        for match in re.finditer(rf"\btypedef\s+({word})\s+([A-Za-z_]\w*)\s*;", text):
            aliases.setdefault(match.group(2), set()).add(match.group(1))
    return aliases


def template_aliases(source: str, kernel: str) -> dict[str, str]:
    """A template kernel's type parameters -> the types of its explicit instantiation in ``source``.

    ``template <class T, int blockSize> __global__ void reduce(...)`` with
    ``template __global__ void reduce<float, 256>(...);`` gives ``{"T": "float"}``.
    """
    # ``__launch_bounds__(…)`` or a macro standing for it (SHOC's ``LAUNCH_BOUNDS (…)``) may sit before the name.
    header = re.search(rf"template\s*<([^>]*)>\s*__global__\s+void\s+(?:[A-Za-z_]\w*\s*\([^)]*\)\s*)?{kernel}\s*\(", source)
    instance = re.search(rf"template\s+__global__\s+void\s+{kernel}\s*<([^>]*)>\s*\(", source)
    if header is None or instance is None:
        return {}
    names = [part.split()[-1] for part in header.group(1).split(",")]
    args = [part.strip() for part in instance.group(1).split(",")]
    return dict(zip(names, args))


def resolve_type(base_type: str, aliases: dict[str, set[str]]) -> str | None:
    """The C type behind ``base_type``; None when an alias on the way has several spellings."""
    seen = set()
    while base_type in aliases and base_type not in seen:
        seen.add(base_type)
        if len(aliases[base_type]) > 1:
            return None
        (base_type,) = aliases[base_type]
    return base_type


def test_the_outside_set_is_apart_from_the_corpus():
    """No outside kernel shares a folder name or its (repository, file, kernel) with a corpus entry."""
    assert len(OUTSIDE_ENTRIES) >= 20 and not set(OUTSIDE_ENTRIES) & set(ENTRIES)

    def source_of(name: str) -> tuple[str, str, str]:
        origin = origin_of(name)
        return origin["repository"].lower(), origin["path"], origin["kernel"]

    assert not {source_of(n) for n in OUTSIDE_ENTRIES} & {source_of(n) for n in ENTRIES}


def test_corpus_is_large_enough_and_covers_the_categories():
    assert len(ENTRIES) >= 42, ENTRIES
    notes = {name: spec_of(name).notes for name in ENTRIES}
    assert CATEGORIES - {"other"} <= {n["category"] for n in notes.values()}
    assert sum(1 for n in notes.values() if n["control"]) >= 6


def test_a_held_out_third_of_the_corpus():
    """Entries added after the transformations were written (``"heldout": true``): at least 30 of them,
    with controls among them, so that a run on them alone says how the optimizer does on code it was
    not designed against."""
    notes = [spec_of(name).notes for name in ENTRIES]
    heldout = [n for n in notes if n.get("heldout")]
    assert len(heldout) >= 30
    assert sum(1 for n in heldout if n["control"]) >= 3
    assert len(heldout) < len(notes)


@pytest.mark.parametrize("name", ENTRIES + OUTSIDE_ENTRIES)
def test_spec_parses_and_launch_evaluates(name: str):
    assert re.fullmatch(r"[a-z0-9]+_[a-z0-9_]+", name), "corpus folders are named suite_kernel in lowercase"
    spec = spec_of(name)
    for variant in [None, *range(len(spec.variants))]:
        resolved = spec.resolve(variant)
        assert all(d >= 1 for d in resolved.original.grid + resolved.original.block)
        assert math.prod(resolved.original.block) <= 1024
        assert all(size >= 1 for size in resolved.sizes.values())
    if name in ENTRIES:
        assert spec.variants or not spec.scalars, "an entry with scalar parameters checks a rewrite at another size too"


@pytest.mark.parametrize("name", ENTRIES + OUTSIDE_ENTRIES)
def test_notes_give_category_control_and_compulsory_bytes(name: str):
    notes = spec_of(name).notes
    assert notes is not None
    assert notes["category"] in CATEGORIES
    assert isinstance(notes["control"], bool)
    assert isinstance(notes.get("heldout", False), bool)
    env = {p.name: int(p.value) for p in spec_of(name).scalars if p.type not in FLOAT_TYPES}
    for key in ("bytes_min", "flops"):
        if key in notes:
            value = notes[key] if isinstance(notes[key], (int, float)) else expr.evaluate(str(notes[key]), env)
            assert value > 0, key
    assert "bytes_min" in notes


@pytest.mark.parametrize("name", ENTRIES + OUTSIDE_ENTRIES)
def test_spec_params_match_the_kernel(name: str):
    spec = spec_of(name)
    source = (folder_of(name) / "kernel.cu").read_text(encoding="utf-8")
    kernels = [f for f in index_of(name, source).functions if f.is_kernel and f.name == spec.kernel]
    assert kernels, f"kernel.cu has no __global__ {spec.kernel}"
    params = kernels[0].params
    assert [p.name for p in params] == [p.name for p in spec.params]
    aliases = {**type_aliases(name), **{k: {v} for k, v in template_aliases(source, spec.kernel).items()}}
    for sp, p in zip(spec.params, params):
        assert isinstance(sp, ArrayParam) == (p.pointer_depth > 0), p.name
        base = resolve_type(p.base_type, aliases)
        if base is None:
            continue  # a conditional typedef: checked on the preprocessed text by the nvcc test
        struct = sp.struct if isinstance(sp, ArrayParam) else None
        assert spec_type_matches(sp.type, base, struct), f"{p.name}: spec {sp.type} vs '{p.base_type}' ({base})"
        if isinstance(sp, ScalarParam) and sp.type not in FLOAT_TYPES:
            assert isinstance(sp.value, int)


@pytest.mark.parametrize("name", ENTRIES + OUTSIDE_ENTRIES)
def test_origin_names_repo_commit_path_and_licence(name: str):
    origin = origin_of(name)
    match = re.fullmatch(r"https://github\.com/([\w.-]+/[\w.-]+)", origin.get("repository", ""))
    assert match, origin
    assert match.group(1).lower() not in RESERVED_REPOS
    assert re.fullmatch(r"[0-9a-f]{40}", origin.get("commit", ""))
    assert origin.get("path", "").endswith((".cu", ".cuh", ".h"))
    assert origin.get("kernel") == spec_of(name).kernel.split("::")[-1] or spec_of(name).kernel in origin.get("kernel", "")
    licence = re.search(r"((?:\.\./)+(?:corpus/)?_licenses/\S+)", origin.get("licence", ""))
    assert licence and (folder_of(name) / licence.group(1)).resolve().is_file()
    assert "changes" in origin


def needs_nvcc(test):
    return pytest.mark.nvcc(pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")(test))


@needs_nvcc
@pytest.mark.parametrize("name", ENTRIES + OUTSIDE_ENTRIES)
def test_kernel_compiles_for_sm90_with_its_entry(name: str, tmp_path: Path):
    from kernel_lsp.services.harness.compile import compile_cubin, find_entry
    from kernel_lsp.services.toolchain import BuildFlags
    from kernel_lsp.services.proc import run

    folder = folder_of(name)
    result = compile_cubin((folder / "kernel.cu").read_text(encoding="utf-8"), str(tmp_path), "kernel",
                           BuildFlags(flags=("-I", str(folder))).for_arch("sm_90"))
    assert result.ok, result.log
    spec = spec_of(name)
    entry, problem = find_entry(result.entries, spec.kernel)
    assert entry is not None, problem
    # Parameters whose type is a conditional typedef: the preprocessed text holds only the branch that applies.
    source = (folder / "kernel.cu").read_text(encoding="utf-8")
    params = next(f for f in index_of(name, source).functions if f.is_kernel and f.name == spec.kernel).params
    aliases = type_aliases(name)
    undecided = {p.base_type for p in params if resolve_type(p.base_type, aliases) is None}
    if undecided:
        pre = run(["nvcc", "-E", "-arch=sm_90", f"-I{folder}", str(folder / "kernel.cu")], timeout_s=120)
        assert pre.ok, pre.stderr
        for sp, p in zip(spec.params, params):
            if p.base_type in undecided:
                found = set(re.findall(rf"\btypedef\s+([\w ]+?)\s+{p.base_type}\s*;", pre.stdout))
                assert len(found) == 1, (p.base_type, found)
                assert spec_type_matches(sp.type, found.pop()), f"{p.name}: spec {sp.type} vs '{p.base_type}'"


def _baseline_module():
    import importlib.util

    path = CORPUS.parent / "corpus_baseline.py"
    module_spec = importlib.util.spec_from_file_location("corpus_baseline", path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module


def test_baseline_plans_a_floor_for_every_entry():
    baseline = _baseline_module()
    assert baseline.entries(None) == ENTRIES
    for name in ENTRIES:
        spec = spec_of(name)
        floor, bound, bytes_min, flops = baseline.floor_us(spec)
        assert floor is not None and floor > 0, name
        assert floor >= 1e6 * bytes_min / baseline.DRAM_BYTES_PER_S
        assert bound == ("fp32" if flops and flops / baseline.FP32_FLOPS_PER_S > bytes_min / baseline.DRAM_BYTES_PER_S else "dram")


def test_baseline_writes_its_times_into_the_notes(tmp_path: Path, monkeypatch):
    baseline = _baseline_module()
    shutil.copytree(CORPUS / "shoc_triad", tmp_path / "shoc_triad")
    monkeypatch.setattr(baseline, "CORPUS", str(tmp_path))
    baseline.write_notes("shoc_triad", 45.6789, 11.7, "NVIDIA H200")
    notes = json.loads((tmp_path / "shoc_triad" / "spec.json").read_text(encoding="utf-8"))["notes"]
    assert (notes["baseline_us"], notes["floor_us"], notes["baseline_gpu"]) == (45.679, 11.7, "NVIDIA H200")
    assert notes["category"] == "streaming"
    assert parse_spec(json.loads((tmp_path / "shoc_triad" / "spec.json").read_text(encoding="utf-8"))).notes == notes


def test_baseline_notes_come_from_a_results_file(tmp_path: Path, monkeypatch):
    baseline = _baseline_module()
    corpus = tmp_path / "corpus"
    shutil.copytree(CORPUS / "shoc_triad", corpus / "shoc_triad")
    monkeypatch.setattr(baseline, "CORPUS", str(corpus))
    results = {"dry_run": False, "machine": {"gpu": {"name": "NVIDIA H200"}},
               "kernels": [{"name": "shoc_triad", "median_us": 20.0, "floor_us": 11.7}, {"name": "not_here", "median_us": 1.0, "floor_us": 1.0},
                           {"name": "shoc_triad_failed", "median_us": None, "floor_us": 2.0}]}
    (tmp_path / "results.json").write_text(json.dumps(results), encoding="utf-8")
    assert baseline.main(["--notes-from", str(tmp_path / "results.json")]) == 0
    notes = json.loads((corpus / "shoc_triad" / "spec.json").read_text(encoding="utf-8"))["notes"]
    assert (notes["baseline_us"], notes["floor_us"], notes["baseline_gpu"]) == (20.0, 11.7, "NVIDIA H200")
    (tmp_path / "dry.json").write_text(json.dumps({**results, "dry_run": True}), encoding="utf-8")
    with pytest.raises(SystemExit):
        baseline.main(["--notes-from", str(tmp_path / "dry.json")])
