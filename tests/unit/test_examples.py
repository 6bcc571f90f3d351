"""Checks on examples/: the manifest, the launch specs and the kernels are consistent.

The GPU verdicts themselves are checked by the harness's GPU tests; here we make sure the
regression corpus they run is well formed, so a failing GPU test points at the harness and
not at a typo in an example: every file exists, every spec follows LAUNCH_SPEC.md v1,
every candidate keeps the original's kernel name and parameter list (but the one meant to
change it), honest rewrites carry no literal equal to a spec size (so the harness's
size-special-casing rule must not fire on them) while the size-special-casing cheats do,
and every kernel compiles for sm_90 except the one meant not to.
"""

from __future__ import annotations

import json
import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from kernel_lsp.services import proc
from kernel_lsp.services.toolchain import BuildFlags

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
MANIFEST = EXAMPLES / "manifest.json"

# The harness's verdict reasons (issue 3, item 1; issue 24 added timed_mismatch, speedup_collapse, size_dependent).
REASONS = {
    "ok", "compile_error", "signature_changed", "launch_error", "timeout", "mismatch", "nan_or_inf",
    "input_modified", "nondeterministic", "out_of_bounds", "history_dependent", "sanitizer", "static_check", "not_faster",
    "timed_mismatch", "speedup_collapse", "size_dependent",
}
ENTRY_KEYS = {"example", "original", "candidate", "spec", "expect", "candidate_launch", "needs_sanitize", "why"}
SCALAR_TYPES = {"int32", "uint32", "int64", "uint64", "float32", "float64"}
ARRAY_TYPES = {"int8", "uint8", "int32", "uint32", "int64", "uint64", "float16", "bfloat16", "float32", "float64"}
ROLES = {"in", "out", "inout"}
SPEC_KEYS = {"kernel", "params", "grid", "block", "dynamic_smem", "tolerance", "variants", "candidate"}
LAUNCH_KEYS = {"grid", "block", "dynamic_smem"}
INITS = re.compile(
    r"^(uniform|normal|randint|fill|list|perm|csr_rowptr|csr_colidx|file)\(.*\)$|^(zeros|ones|arange)$"
)
# C spelling of each spec element type, as the examples write it.
C_TYPES = {
    "int8": "signed char", "uint8": "unsigned char", "int32": "int", "uint32": "unsigned int",
    "int64": "long long", "uint64": "unsigned long long", "float16": "__half", "bfloat16": "__nv_bfloat16",
    "float32": "float", "float64": "double",
}


def _manifest() -> list[dict]:
    return json.loads(MANIFEST.read_text())


def _strip_comments(src: str) -> str:
    src = re.sub(r"/\*.*?\*/", " ", src, flags=re.S)
    return re.sub(r"//[^\n]*", " ", src)


def kernel_params(src: str, name: str) -> list[str]:
    """Parameter list of `__global__ void name(...)`, each entry whitespace-normalized."""
    code = _strip_comments(src)
    m = re.search(r"__global__\s+void\s+" + re.escape(name) + r"\s*\(([^)]*)\)", code)
    assert m, f"no __global__ void {name}(...) found"
    return [" ".join(p.replace("*", " * ").split()) for p in m.group(1).split(",") if p.strip()]


def int_literals(src: str) -> set[int]:
    """Decimal integer literals of the code (comments removed; float literals excluded)."""
    code = _strip_comments(src)
    return {int(t) for t in re.findall(r"(?<![\w.])(\d+)(?![\w.])", code)}


def spec_sizes(spec: dict) -> set[int]:
    """Integer scalar values of the spec, main values and every variant's."""
    ints = {p["name"] for p in spec["params"] if p.get("scalar", "").startswith(("int", "uint"))}
    values = {p["value"] for p in spec["params"] if p.get("name") in ints}
    for variant in spec.get("variants", []):
        values |= {v for k, v in variant.items() if k in ints}
    return values


def _check_launch(launch: dict, where: str) -> None:
    assert set(launch) <= LAUNCH_KEYS, f"{where}: unknown launch keys {set(launch) - LAUNCH_KEYS}"
    for key in ("grid", "block"):
        assert key in launch, f"{where}: launch without {key}"
        assert len(launch[key]) == 3, f"{where}: {key} needs 3 entries"
        assert all(isinstance(d, (int, str)) for d in launch[key]), f"{where}: {key} entries are numbers or expressions"


def _check_spec(spec: dict, where: str) -> None:
    assert set(spec) <= SPEC_KEYS, f"{where}: unknown keys {set(spec) - SPEC_KEYS}"
    assert isinstance(spec["kernel"], str) and spec["kernel"]
    _check_launch({k: spec[k] for k in ("grid", "block")}, where)
    names = [p["name"] for p in spec["params"]]
    assert len(names) == len(set(names)), f"{where}: duplicate parameter names"
    for p in spec["params"]:
        assert ("scalar" in p) != ("array" in p), f"{where}: {p['name']} must be exactly one of scalar/array"
        if "scalar" in p:
            assert p["scalar"] in SCALAR_TYPES, f"{where}: bad scalar type {p['scalar']}"
            assert isinstance(p["value"], (int, float)), f"{where}: {p['name']} needs a numeric value"
        else:
            assert p["array"] in ARRAY_TYPES, f"{where}: bad array type {p['array']}"
            assert p["role"] in ROLES, f"{where}: bad role {p.get('role')}"
            assert isinstance(p["size"], (int, str)), f"{where}: {p['name']} needs a size"
            assert INITS.match(p["init"]), f"{where}: unknown initializer {p['init']}"
    scalars = {p["name"] for p in spec["params"] if "scalar" in p}
    for variant in spec.get("variants", []):
        assert variant and set(variant) <= scalars, f"{where}: variant overrides non-scalars {set(variant) - scalars}"
    if "tolerance" in spec:
        assert set(spec["tolerance"]) == {"rtol", "atol"}, f"{where}: tolerance needs rtol and atol"
        assert all(v >= 0 for v in spec["tolerance"].values())
    if "candidate" in spec:
        _check_launch(spec["candidate"], where + " candidate")


def _expects(entry: dict, reason: str) -> bool:
    return reason in entry["expect"]["reason"]


def test_manifest_entries_are_complete_and_name_existing_files():
    entries = _manifest()
    assert len({e["example"] for e in entries}) >= 6
    rejected = [e for e in entries if not e["expect"]["accepted"]]
    assert len(rejected) >= 10
    for e in entries:
        assert set(e) == ENTRY_KEYS, f"{e.get('candidate')}: keys {set(e) ^ ENTRY_KEYS}"
        for key in ("original", "candidate", "spec"):
            assert (EXAMPLES / e[key]).is_file(), f"missing {e[key]}"
            assert e[key].startswith(e["example"] + "/"), f"{e[key]} outside its example folder"
        reasons = e["expect"]["reason"]
        assert isinstance(reasons, list) and reasons and set(reasons) <= REASONS, f"{e['candidate']}: {reasons}"
        # An accepted verdict has exactly one reason; a rejection never claims it.
        assert (reasons == ["ok"]) == e["expect"]["accepted"], e["candidate"]
        assert e["needs_sanitize"] == _expects(e, "sanitizer"), e["candidate"]
        if e["candidate_launch"] is not None:
            _check_launch(e["candidate_launch"], e["candidate"])
        assert e["why"].strip()


def test_every_kernel_file_is_in_the_manifest_and_every_example_has_a_readme():
    entries = _manifest()
    named = {e[k] for e in entries for k in ("original", "candidate")}
    on_disk = {str(p.relative_to(EXAMPLES)) for p in EXAMPLES.rglob("*.cu")}
    assert on_disk == named
    for example in {e["example"] for e in entries}:
        assert (EXAMPLES / example / "README.md").is_file(), example
    # Every honest/cheat file is prefixed so a reader knows what it is before opening it.
    for e in entries:
        stem = Path(e["candidate"]).name
        prefix = ("honest_",) if e["expect"]["accepted"] else ("cheat_", "slow_")
        assert stem.startswith(prefix), stem


def test_specs_follow_launch_spec_v1():
    for spec_path in sorted({e["spec"] for e in _manifest()}):
        _check_spec(json.loads((EXAMPLES / spec_path).read_text()), spec_path)


def test_spec_params_match_the_original_kernel_signature():
    for spec_path in sorted({e["spec"] for e in _manifest()}):
        spec = json.loads((EXAMPLES / spec_path).read_text())
        original = (EXAMPLES / spec_path).parent / "original.cu"
        params = kernel_params(original.read_text(), spec["kernel"])
        assert len(params) == len(spec["params"]), spec_path
        for c_param, p in zip(params, spec["params"]):
            words = c_param.split()
            assert words[-1] == p["name"], f"{spec_path}: {c_param} vs {p['name']}"
            if "scalar" in p:
                assert " ".join(words[:-1]) == C_TYPES[p["scalar"]], f"{spec_path}: {c_param}"
            else:
                assert "*" in words, f"{spec_path}: {c_param} is not a pointer"
                base = " ".join(w for w in words[:-1] if w not in {"const", "*", "__restrict__"})
                assert base == C_TYPES[p["array"]], f"{spec_path}: {c_param}"
                # `in` arrays are const in the original; written arrays must not be.
                assert ("const" in words) == (p["role"] == "in"), f"{spec_path}: {c_param} role {p['role']}"


def test_candidates_keep_the_kernel_name_and_parameter_list():
    changed = 0
    for e in _manifest():
        if _expects(e, "compile_error"):
            continue
        name = json.loads((EXAMPLES / e["spec"]).read_text())["kernel"]
        want = kernel_params((EXAMPLES / e["original"]).read_text(), name)
        got = kernel_params((EXAMPLES / e["candidate"]).read_text(), name)
        if _expects(e, "signature_changed"):
            assert got != want, e["candidate"]
            changed += 1
        else:
            assert got == want, f"{e['candidate']}: {got} != {want}"
    assert changed >= 1


# The harness's size-literal rule ignores literals up to 1024 (tile, block and warp sizes);
# cheats are held to that rule, honest rewrites to the stricter "no spec size at all".
SIZE_RULE_MIN = 1025


def test_size_literals_only_in_the_size_special_casing_cheats():
    special_cased = 0
    for e in _manifest():
        spec = json.loads((EXAMPLES / e["spec"]).read_text())
        source = (EXAMPLES / e["candidate"]).read_text()
        added = int_literals(source) - int_literals((EXAMPLES / e["original"]).read_text())
        hits = added & spec_sizes(spec)
        if e["expect"]["accepted"]:
            assert not hits, f"{e['candidate']}: literals {hits} equal spec sizes; a size rule could reject it"
            continue
        big_hits = {v for v in hits if v >= SIZE_RULE_MIN}
        # A stray size literal would let static_check pre-empt the reason a cheat is meant to test.
        noncoherent = "__ldg" in source or "__restrict__" in source
        if _expects(e, "static_check") and not noncoherent:
            assert big_hits, f"{e['candidate']}: expected a literal equal to a spec size"
            special_cased += 1
        else:
            assert not big_hits, f"{e['candidate']}: literals {big_hits} would trip the size rule"
    assert special_cased >= 1


def _check_resolved_launches(spec, where: str) -> None:
    """Both launches evaluate to legal CUDA launches at the main size and every variant."""
    for variant in [None, *range(len(spec.variants))]:
        resolved = spec.resolve(variant)
        for which, launch in (("original", resolved.original), ("candidate", resolved.candidate)):
            at = f"{where} {which} launch at variant {variant}"
            assert all(g >= 1 for g in launch.grid) and launch.grid[0] < 2**31 and max(launch.grid[1:]) < 65536, at
            bx, by, bz = launch.block
            assert min(launch.block) >= 1 and bx * by * bz <= 1024 and bz <= 64, at
            assert 0 <= launch.dynamic_smem_bytes <= 48 * 1024, at


def test_harness_prechecks_agree_with_the_manifest():
    """The harness's pure checks (spec parser, signature, static rules) give each entry its expected fate."""
    spec_mod = pytest.importorskip("kernel_lsp.core.spec")
    static = pytest.importorskip("kernel_lsp.core.static_check")
    for e in _manifest():
        if _expects(e, "compile_error"):
            continue
        spec_path = EXAMPLES / e["spec"]
        spec = spec_mod.parse_spec(spec_path.read_text(), base_dir=str(spec_path.parent))
        if e["candidate_launch"] is not None:
            spec = spec_mod.with_candidate_launch(spec, e["candidate_launch"])
        _check_resolved_launches(spec, e["candidate"])
        original = (EXAMPLES / e["original"]).read_text()
        candidate = (EXAMPLES / e["candidate"]).read_text()
        signature = static.check_signature(original, candidate, spec)
        assert not signature.spec_errors, f"{e['spec']}: {signature.spec_errors}"
        assert bool(signature.changed) == _expects(e, "signature_changed"), f"{e['candidate']}: {signature.changed}"
        if signature.changed:
            continue
        errors = static.check(original, candidate, spec).errors
        # An entry that lists static_check among other reasons may be caught later instead.
        if e["expect"]["reason"] == ["static_check"]:
            assert errors, f"{e['candidate']}: the static check found nothing"
        elif not _expects(e, "static_check"):
            assert not errors, f"{e['candidate']}: unexpected static findings {errors}"


def test_helpers_see_what_they_claim():
    # The checks above are only as good as these parsers: pin them on known snippets.
    src = 'extern "C" __global__ void k(const float* __restrict__ a, int n) // n = 4096\n{ x[8192] = 1.5f; }'
    assert kernel_params(src, "k") == ["const float * __restrict__ a", "int n"]
    assert int_literals(src) == {8192}


def test_harness_generates_every_variants_inputs_at_the_declared_sizes():
    """Variant sizes only (cheap): each array comes out with the size and type the spec declares."""
    spec_mod = pytest.importorskip("kernel_lsp.core.spec")
    inputs = pytest.importorskip("kernel_lsp.core.inputs")
    for spec_path in sorted({e["spec"] for e in _manifest()}):
        path = EXAMPLES / spec_path
        spec = spec_mod.parse_spec(path.read_text(), base_dir=str(path.parent))
        declared = {p["name"]: p["array"] for p in json.loads(path.read_text())["params"] if "array" in p}
        for variant in range(len(spec.variants)):
            arrays = inputs.make_inputs(spec, 7, variant, None)
            sizes = spec.resolve(variant).sizes
            assert set(arrays) == set(declared), spec_path
            for name, array in arrays.items():
                assert array.size == sizes[name], f"{spec_path} variants[{variant}] {name}"


def test_manifest_runner_passes_launch_overrides_and_sanitize():
    runner = _load_runner()
    entries = _manifest()
    with_launch = next(e for e in entries if e["candidate_launch"] is not None)
    argv = runner.verify_argv(with_launch, "kernel-lsp", ["--seeds", "5"])
    assert argv[argv.index("--candidate-launch") + 1] == json.dumps(with_launch["candidate_launch"])
    assert argv[-2:] == ["--seeds", "5"] and "--sanitize" not in argv
    sanitized = next(e for e in entries if e["needs_sanitize"])
    assert "--sanitize" in runner.verify_argv(sanitized, "kernel-lsp", [])
    plain = next(e for e in entries if e["candidate_launch"] is None and not e["needs_sanitize"])
    argv = runner.verify_argv(plain, "kernel-lsp", [])
    assert "--candidate-launch" not in argv and argv[-1] == "--json"


def _load_runner():
    import importlib.util

    spec = importlib.util.spec_from_file_location("verify_manifest", EXAMPLES / "verify_manifest.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.nvcc
def test_every_kernel_compiles_for_sm90_except_the_compile_error_cheat(tmp_path):
    nvcc = proc.which("nvcc")
    if nvcc is None:
        pytest.skip("nvcc not on PATH")
    entries = _manifest()
    must_fail = {e["candidate"] for e in entries if _expects(e, "compile_error")}
    files = sorted({e[k] for e in entries for k in ("original", "candidate")})

    def compile_one(rel: str) -> tuple[str, proc.ProcResult]:
        out = tmp_path / (rel.replace("/", "_") + ".cubin")
        return rel, proc.run([nvcc, "-arch=sm_90", "-cubin", "-o", str(out), str(EXAMPLES / rel)], timeout_s=300)

    # Two workers: the CI machine is small and nvcc is single-threaded per file.
    with ThreadPoolExecutor(max_workers=2) as pool:
        results = dict(pool.map(compile_one, files))
    for rel, res in results.items():
        if rel in must_fail:
            assert res.returncode not in (0, None) and "error" in res.stderr, rel
        else:
            assert res.returncode == 0, f"{rel}: {res.stderr[-2000:]}"


# Verdicts the harness reaches before any GPU time: compile, signature and static checks.
PRE_GPU_REASONS = {"compile_error", "signature_changed", "static_check"}


@pytest.mark.nvcc
def test_harness_rejects_the_pre_gpu_cheats_without_a_gpu():
    if proc.which("nvcc") is None:
        pytest.skip("nvcc not on PATH")
    harness = pytest.importorskip("kernel_lsp.services.harness")
    entries = [e for e in _manifest() if e["expect"]["reason"] and set(e["expect"]["reason"]) <= PRE_GPU_REASONS]
    assert len(entries) >= 3
    for e in entries:
        spec = harness.load_spec_file(str(EXAMPLES / e["spec"]))
        options = harness.VerifyOptions(arch="sm_90", build=BuildFlags(flags=("-I", str(EXAMPLES / e["example"]))))
        verdict = harness.verify(
            (EXAMPLES / e["original"]).read_text(), (EXAMPLES / e["candidate"]).read_text(), spec, options
        )
        assert not verdict.accepted and verdict.reason.value in e["expect"]["reason"], f"{e['candidate']}: {verdict}"
        assert verdict.errors, e["candidate"]
