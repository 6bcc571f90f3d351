"""Profiling in the editor through the real server, backed by a recorded profile (no GPU needed).

The profile of ``transpose_smem_conflict`` recorded on an H200 (tests/fixtures/ncu) is put in
a profile store that the server is pointed at (``profileStore``), as the last good profile of
the workspace's copy of the file.
"""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import pytest
from fake_tools import EXISTS, GPU_H200, fake_tools_env
from lsp_helpers import SAXPY, hover_text, lsp_session, open_doc, position_of, wait_diagnostics
from lsprotocol import types

from kernel_lsp.core.profile import COLLECTOR_NCU, KernelProfile
from kernel_lsp.services import ncu_reader
from kernel_lsp.services.profiler import ProfileStore, sidecar_path

FIX = Path(__file__).resolve().parent.parent / "fixtures" / "ncu"
KERNEL = "transpose_smem_conflict"


def recorded_profile(source_file: Path) -> KernelProfile:
    with gzip.open(FIX / "dataset" / "bank_conflict_full.csv.gz", "rt") as f:
        record = ncu_reader.parse_raw_csv(f.read())[0]
    with gzip.open(FIX / "recorded" / "logs" / "bank_conflict_full_export_details.out.gz", "rt") as f:
        _, rules, _ = ncu_reader.parse_details_csv(f.read())[0]
    lines = ncu_reader.parse_source_csv((FIX / "recorded" / "logs" / "bank_conflict_full_export_source.out").read_text())
    (_, per_line), = lines.items()
    return KernelProfile(KERNEL, metrics=record.metrics, rules=rules, lines=per_line, source_file=str(source_file),
                         sections=("full",), duration_samples_us=(125.5,), collector=COLLECTOR_NCU)


@pytest.fixture
def profiled(tmp_path: Path) -> tuple[Path, Path]:
    for name in ("bank_conflict.cu", "common.cuh"):
        shutil.copy(FIX / "programs" / name, tmp_path / name)
    (tmp_path / "saxpy.cu").write_text(SAXPY)
    store = tmp_path / ".store"
    source = tmp_path / "bank_conflict.cu"
    ProfileStore(str(store)).set_last_good(str(source), KERNEL, recorded_profile(source))
    return tmp_path, store


def options(store: Path, **extra) -> dict:
    return {"profileStore": str(store), "nvccPath": "/nonexistent/nvcc", "ncuPath": "/nonexistent/ncu",
            "watchFiles": False, **extra}


#: The server sees a GPU (a stand-in nvidia-smi): profiling is offered, and ncu is whatever a test sets.
GPU_ENV = fake_tools_env({"nvidia-smi": GPU_H200, "ncu": EXISTS})
#: ncu that starts and fails, as it does when the GPU is taken or the driver refuses.
FAILING_NCU = 'echo "==ERROR== The application returned an error code (1)." >&2; exit 1'


def _hover(uri: str, position: types.Position) -> types.HoverParams:
    return types.HoverParams(text_document=types.TextDocumentIdentifier(uri=uri), position=position)


async def test_kernel_and_line_hover_from_a_stored_profile(profiled) -> None:
    root, store = profiled
    text = (root / "bank_conflict.cu").read_text()
    async with lsp_session(root, init_options=options(store)) as client:
        uri = open_doc(client, root / "bank_conflict.cu")
        on_kernel = await client.text_document_hover_async(_hover(uri, position_of(text, KERNEL, 3)))
        line16 = await client.text_document_hover_async(_hover(uri, types.Position(line=15, character=4)))
        outside = await client.text_document_hover_async(_hover(uri, types.Position(line=19, character=4)))
        diagnostics = await wait_diagnostics(client, uri, lambda ds: any(d.code == "hot-line" for d in ds))
    kernel_text = hover_text(on_kernel)
    assert "**Profile** (Nsight Compute)" in kernel_text and "duration 125.5 µs" in kernel_text
    assert "latency-bound (shared-bank-conflicts" in kernel_text
    assert "ncu advice — UncoalescedSharedAccess** (estimated speedup 89 %)" in kernel_text
    assert "Hottest lines: 16" in kernel_text
    line_text = hover_text(line16)
    assert line_text.startswith("**Line 16**") and "short_scoreboard" in line_text
    assert "excessive shared wavefronts (bank conflicts): 16,252,928" in line_text
    assert outside is None  # main() is not a profiled kernel
    hot = sorted(d.range.start.line for d in diagnostics if d.code == "hot-line")
    assert hot[0] == 11 and 15 in hot and len(hot) == 3  # lines 12, 16, 17 (1-based)
    assert all(d.severity == types.DiagnosticSeverity.Hint for d in diagnostics if d.code == "hot-line")


async def test_failed_profile_keeps_the_last_one_marked_stale(profiled) -> None:
    root, store = profiled
    source = root / "bank_conflict.cu"
    text = source.read_text()
    spec = {"kernel": KERNEL, "params": [
        {"name": "out", "array": "float32", "size": "width*width", "init": "zeros", "role": "out"},
        {"name": "in", "array": "float32", "size": "width*width", "init": "uniform(-1,1)", "role": "in"},
        {"name": "width", "scalar": "int32", "value": 4096}], "grid": ["width/32", "width/32", 1], "block": [32, 32, 1]}
    Path(sidecar_path(str(source), KERNEL)).write_text(json.dumps(spec))
    env = fake_tools_env({"nvidia-smi": GPU_H200, "ncu": FAILING_NCU})
    async with lsp_session(root, init_options=options(store, ncuPath="ncu"), env=env) as client:
        uri = open_doc(client, source)
        client.text_document_did_save(types.DidSaveTextDocumentParams(text_document=types.TextDocumentIdentifier(uri=uri)))
        message = await client.wait_for_notification(types.WINDOW_SHOW_MESSAGE)
        while "profiling" not in message.message:
            message = await client.wait_for_notification(types.WINDOW_SHOW_MESSAGE)
        hover = await client.text_document_hover_async(_hover(uri, position_of(text, KERNEL, 3)))
    assert "profiling transpose_smem_conflict" in message.message
    hover_md = hover_text(hover)
    assert "*stale: the last profiling attempt failed" in hover_md
    assert "latency-bound (shared-bank-conflicts" in hover_md  # the last good profile is still shown


FAKE_NCU = """#!{python}
# Stands in for ncu: prints a raw CSV recorded on an H200 (a run of metric groups) or writes a
# recorded report where -o points (a run with a section), and ncu's pass count.
import gzip, shutil, sys
argv = sys.argv
if argv[1:] == ["--version"]:
    print("Version 2025.3.1.0 (build 36398880) (public-release)")
    sys.exit(0)
print('==PROF== Profiling "transpose_smem_conflict" - 0: 0%....50%....100% - 18 passes')
if "-o" in argv:
    shutil.copy({report!r}, argv[argv.index("-o") + 1] + ".ncu-rep")
else:
    print(gzip.open({csv!r}, "rt").read())
"""


async def test_save_that_makes_a_kernel_slower_gets_a_warning(profiled) -> None:
    pytest.importorskip("ncu_report", reason="the server reads the recorded report with ncu_report")
    import sys

    root, store = profiled
    source = root / "bank_conflict.cu"
    text = source.read_text()
    # the stored profile says 100 µs; the new one (the recorded raw CSV) says 125.5 µs
    faster = recorded_profile(source)
    faster = KernelProfile(KERNEL, metrics={**faster.metrics, "gpu__time_duration.sum": 100_000.0},
                           source_file=str(source), duration_samples_us=(100.0, 100.5, 99.8))
    ProfileStore(str(store)).set_last_good(str(source), KERNEL, faster)
    fake = root / "fake-ncu"
    fake.write_text(FAKE_NCU.format(python=sys.executable, report=str(FIX / "recorded" / "reports" / "bank_conflict_source.ncu-rep"),
                                    csv=str(FIX / "dataset" / "bank_conflict_full.csv.gz")))
    fake.chmod(0o755)
    async with lsp_session(root, init_options=options(store, ncuPath=str(fake), profileProgram="/bin/true"),
                           env=GPU_ENV) as client:
        uri = open_doc(client, source)
        client.text_document_did_save(types.DidSaveTextDocumentParams(text_document=types.TextDocumentIdentifier(uri=uri)))
        diagnostics = await wait_diagnostics(client, uri, lambda ds: any(d.code == "slower" for d in ds))
        hover = await client.text_document_hover_async(_hover(uri, position_of(text, KERNEL, 3)))
    (slower,) = [d for d in diagnostics if d.code == "slower"]
    assert slower.severity == types.DiagnosticSeverity.Warning
    assert "125.5 µs vs 100.0 µs" in slower.message and "noise" in slower.message  # medians
    assert slower.range.start.line == 6  # the kernel's name
    hover_md = hover_text(hover)
    assert "duration 125.5 µs" in hover_md and "stale" not in hover_md
