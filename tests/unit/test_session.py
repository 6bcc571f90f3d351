"""One session wires every nvcc run, spec look-up and verifier of a file: the editor's verification compiles
with the flags of its diagnostics (extraFlags, the compile database, include paths), and the CLI and the
server resolve specs alike."""

from __future__ import annotations

import json
import shutil
import stat
import threading
from pathlib import Path

import pytest

from kernel_lsp.config import Settings
from kernel_lsp.core.verdict import Reason, Verdict
from kernel_lsp.services import optimizer
from kernel_lsp.services.compile_db import CompileDb
from kernel_lsp.services.harness import GpuUnavailable, verify
from kernel_lsp.services.session import Session, resolve_spec

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

#: Compiles only when both macros come from the command line, as the user's build defines them.
GUARDED = """\
#if !defined(FROM_SETTINGS) || !defined(FROM_DB)
#error "built without the project's flags"
#endif
__global__ void scale(int n, const float* x, float* y) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = FROM_SETTINGS * x[i];
}
"""
SPEC = {"kernel": "scale", "params": [{"name": "n", "scalar": "int32", "value": 1024},
                                       {"name": "x", "array": "float32", "size": "n", "init": "uniform(-1,1)", "role": "in"},
                                       {"name": "y", "array": "float32", "size": "n", "init": "zeros", "role": "out"}],
        "grid": ["n/256", 1, 1], "block": [256, 1, 1]}


def _project(tmp_path: Path) -> tuple[Path, Session]:
    """A workspace whose compile_commands.json defines FROM_DB and whose settings add -DFROM_SETTINGS=2."""
    src = tmp_path / "src"
    src.mkdir()
    path = src / "k.cu"
    path.write_text(GUARDED)
    (tmp_path / "compile_commands.json").write_text(json.dumps(
        [{"directory": str(src), "file": "k.cu", "arguments": ["nvcc", "-DFROM_DB=1", "-c", "k.cu", "-o", "k.o"]}]))
    settings = Settings(extra_flags=("-DFROM_SETTINGS=2",), include_paths=(str(tmp_path / "inc"),))
    return path, Session(settings, workspace_root=str(tmp_path), compile_db=CompileDb())


def _recording_nvcc(folder: Path) -> str:
    """An nvcc that appends its argv (one JSON list a line) to argv.log and fails."""
    tool = folder / "fake-nvcc"
    log = folder / "argv.log"
    tool.write_text(f"#!/bin/sh\npython3 -c 'import json,sys; print(json.dumps(sys.argv[1:]))' \"$@\" >> {log}\nexit 1\n")
    tool.chmod(tool.stat().st_mode | stat.S_IXUSR)
    return str(tool)


def _device_flags(argv: list[str]) -> list[str]:
    """The flags that decide how the file is compiled: everything but the architecture, outputs (the cubin
    and the dependency list) and input."""
    out, skip = [], False
    for i, a in enumerate(argv):
        if skip:
            skip = False
            continue
        if a in ("-o", "-MF"):
            skip = True
            continue
        if a.startswith("-arch") or i == len(argv) - 1 or a in ("-cubin", "-Xptxas", "-v", "-lineinfo"):
            continue
        out.append(a)
    return out


def test_verifier_and_diagnostics_get_the_same_flags(tmp_path: Path) -> None:
    path, session = _project(tmp_path)
    options = session.verify_options(str(path))
    diagnostics = session.build_flags(str(path))
    assert options.build == diagnostics
    assert "-DFROM_SETTINGS=2" in options.build.flags and "-DFROM_DB=1" in options.build.flags
    assert options.build.flags_source == "compile_commands.json"
    assert ["-I", str(path.parent)] == list(options.build.flags[1:3])
    assert (options.seeds, options.min_speedup, options.timeout_s) == (3, 1.05, 120.0)


def test_every_nvcc_run_of_the_file_has_the_same_command_line(tmp_path: Path) -> None:
    path, session = _project(tmp_path)
    fake = _recording_nvcc(tmp_path)
    session = Session(Settings(nvcc_path=fake, extra_flags=("-DFROM_SETTINGS=2",)), workspace_root=session.workspace_root,
                      compile_db=CompileDb())
    session.compile(GUARDED, str(path))
    verdict = verify(GUARDED, GUARDED, _spec(path), session.verify_options(str(path), arch="sm_90"))
    assert verdict.reason is Reason.COMPILE_ERROR  # the fake nvcc fails every build
    runs = [json.loads(line) for line in (tmp_path / "argv.log").read_text().splitlines()]
    # The harness's own input-drawing kernels are not the user's file: they build without its flags.
    runs = [r for r in runs if not any(part.endswith("harness_helpers.cu") for part in r)]
    assert len(runs) == 3  # diagnostics, then the original and the candidate
    diagnostics, *verifier = (_device_flags(r) for r in runs)
    assert all(v == diagnostics for v in verifier)
    assert "-DFROM_SETTINGS=2" in diagnostics and "-DFROM_DB=1" in diagnostics


def _spec(path: Path):
    from kernel_lsp.core.spec import parse_spec

    return parse_spec(SPEC, str(path.parent))


@pytest.mark.nvcc
def test_a_define_from_extra_flags_reaches_the_verifiers_compile(tmp_path: Path) -> None:
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc is not on PATH")
    from kernel_lsp.services.harness import VerifyOptions

    path, session = _project(tmp_path)
    assert session.compile(GUARDED, str(path)).ok
    # Options built by hand (the old editor path) drop the project's flags: the verification stops at the compile.
    bare = verify(GUARDED, GUARDED, _spec(path), VerifyOptions(arch="sm_90", seeds=1))
    assert bare.reason is Reason.COMPILE_ERROR and "built without the project's flags" in bare.errors[0]
    try:
        verdict = verify(GUARDED, GUARDED, _spec(path), session.verify_options(str(path), arch="sm_90", seeds=1))
    except GpuUnavailable:
        return  # both files compiled and passed the static checks: only the GPU was missing
    assert verdict.reason is not Reason.COMPILE_ERROR, verdict.errors


def test_the_server_search_verifies_with_the_sessions_flags(tmp_path: Path, monkeypatch) -> None:
    """The editor's "Optimize" job builds its verifier from the session, not by hand."""
    from kernel_lsp.server import optimize_actions
    from kernel_lsp.server.base import KernelLspServer
    from kernel_lsp.server.documents import DocumentState
    from kernel_lsp.core.parse import ParsedDocument

    path, session = _project(tmp_path)
    seen = []

    def factory(options=None):
        seen.append(options)
        return lambda original, candidate, spec, cancel: Verdict(False, Reason.NOT_FASTER, ("scripted",))

    monkeypatch.setattr(optimizer, "harness_verifier", factory)
    server = KernelLspServer()
    state = server.state
    kb = tmp_path / "kb.sqlite3"
    state.settings = Settings(extra_flags=session.settings.extra_flags, kb_path=str(kb), optimize_budget_candidates=1)
    state.workspace_root = session.workspace_root
    doc = DocumentState(path.as_uri(), 3, ParsedDocument(GUARDED), str(path))

    class Ctx:
        cancel = threading.Event()

        def report(self, message, pct):
            pass

    result = optimize_actions.run_search(state, doc, "scale", _spec(path), GUARDED, 3, Ctx())
    assert len(seen) == 1 and seen[0].build == state.session().build_flags(str(path))
    assert "-DFROM_DB=1" in seen[0].build.flags and "-DFROM_SETTINGS=2" in seen[0].build.flags
    assert result.document_version == 3 and kb.exists()


def test_spec_resolution_order(tmp_path: Path) -> None:
    path = tmp_path / "k.cu"
    inline = "// kernel-lsp: spec " + json.dumps({k: v for k, v in SPEC.items() if k != "kernel"}) + "\n" + GUARDED
    found = resolve_spec(str(path), inline, "scale")
    assert found.origin == "in-source" and found.spec is not None and found.spec.kernel == "scale"
    assert resolve_spec(str(path), inline, None).origin == "in-source"
    sidecar = tmp_path / "k.cu.scale.spec.json"
    sidecar.write_text(json.dumps({**SPEC, "block": [128, 1, 1]}))
    found = resolve_spec(str(path), inline, "scale")
    assert found.origin == "sidecar" and found.spec_path == str(sidecar) and found.spec.launch.block[0] == "128"
    explicit = tmp_path / "other.json"
    explicit.write_text(json.dumps({**SPEC, "block": [64, 1, 1]}))
    assert resolve_spec(str(path), inline, "scale", str(explicit)).spec.launch.block[0] == "64"
    missing = resolve_spec(str(path), GUARDED, "other")
    assert missing.spec is None and "Create launch spec for other" in (missing.problem or "")
    sidecar.write_text("{not json")
    broken = resolve_spec(str(path), inline, "scale")
    assert broken.spec is None and broken.origin == "sidecar" and "invalid" in (broken.problem or "")


def test_stores_open_for_one_search_and_report_problems(tmp_path: Path) -> None:
    session = Session(Settings(), kb_path=str(tmp_path / "kb.sqlite3"), traces_path=str(tmp_path / "t.sqlite3"))
    with session.stores(traces=True) as stores:
        assert stores.kb is not None and stores.traces is not None and stores.messages == ()
    with Session(use_kb=False).stores(traces=False) as stores:
        assert stores.kb is None and stores.traces is None
    (tmp_path / "blocker").write_text("a file where a folder should be")
    with Session(kb_path=str(tmp_path / "blocker" / "kb.sqlite3")).stores(traces=False) as stores:
        assert stores.kb is None and "knowledge base unavailable" in stores.messages[0]


def test_the_rules_see_macros_from_local_headers(tmp_path: Path) -> None:
    """A kernel body written as a macro in a header: restrict-const must see that it writes ``a``."""
    (tmp_path / "body.cuh").write_text("#define BODY a[i] = b[i] + s * c[i];\n")
    source = ('#include "body.cuh"\n'
              "__global__ void triad(float *a, float *b, float *c, float s, int n) {\n"
              "    int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
              "    if (i < n) { BODY; }\n"
              "}\n")
    path = tmp_path / "triad.cu"
    path.write_text(source)
    spec = {"kernel": "triad", "params": [
        {"name": n, "array": "float32", "size": "n", "init": "uniform(-1,1)", "role": "inout"} for n in "abc"]
        + [{"name": "s", "scalar": "float32", "value": 2.0}, {"name": "n", "scalar": "int32", "value": 1024}],
        "grid": ["n/256", 1, 1], "block": [256, 1, 1]}
    from kernel_lsp.core.spec import parse_spec

    result = Session(Settings(), use_kb=False).optimize(source, str(path), "triad", parse_spec(spec, str(tmp_path)),
                                                       verify=False)
    restrict = [r.candidate for r in result.results if r.candidate.technique == "restrict-const"]
    assert restrict, [r.candidate.technique for r in result.results]
    for candidate in restrict:
        # Read alone, the file shows no write to a (the body is in the header) and the rule made it const.
        head = candidate.source.split("{", 1)[0]
        assert "const float* a" not in head and "const float* __restrict__ a" not in head
        assert "const float* b" in head or "const float* __restrict__ b" in head


def test_a_spec_type_the_kernel_may_not_hold_is_a_warning_and_a_macro_type_is_read_through(tmp_path: Path) -> None:
    """lavaMD writes ``#define fp double`` and ``fp* qv``: a float64 array fits; a float64 array for a ``float*``
    parameter is used but warned about."""
    source = ("#define fp double\n"
              "__global__ void k(fp* qv, float* out, int n) {\n"
              "    int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
              "    if (i < n) out[i] = (float)qv[i];\n}\n")
    path = tmp_path / "k.cu"
    path.write_text(source)
    spec = {"kernel": "k", "grid": ["ceil_div(n,128)", 1, 1], "block": [128, 1, 1],
            "params": [{"name": "qv", "array": "float64", "size": "n", "init": "uniform(0,1)", "role": "in"},
                       {"name": "out", "array": "float64", "size": "n", "init": "zeros", "role": "out"},
                       {"name": "n", "scalar": "int32", "value": 1024}]}
    explicit = tmp_path / "k.json"
    explicit.write_text(json.dumps(spec))
    found = Session(Settings(), use_kb=False).resolve_spec(str(path), source, "k", str(explicit))
    assert found.spec is not None
    assert found.warnings == ("params[1]: spec type float64 vs the kernel's 'float' for 'out'",), found.warnings
