"""The compiler service: buffer text compiled in a temp folder, messages mapped back, failures as values."""

from __future__ import annotations

import json
import shutil
import stat
import sys
import threading
import time
from pathlib import Path

import pytest

from kernel_lsp.config import Settings
from kernel_lsp.services.compile_db import CompileDb
from kernel_lsp.services.toolchain import build_flags, compile_in, compile_source, split_arch_flags



def needs_nvcc(test):
    """Mark a test ``nvcc`` and skip it when nvcc is not on PATH."""
    return pytest.mark.nvcc(pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")(test))

SOURCE = """\
#include "helper.cuh"
namespace ns {
template <int N> __global__ void scale(float* p) { p[threadIdx.x] *= N * HELPER; }
}
__global__ void tiles(float* out) {
    __shared__ float t[32][33];
    t[threadIdx.y][threadIdx.x] = out[threadIdx.x];
    __syncthreads();
    out[threadIdx.x] = t[threadIdx.x][threadIdx.y];
}
extern "C" __global__ void plain() {}
void host(float* p) { ns::scale<3><<<1, 64>>>(p); }
"""


def _fake_tool(folder: Path, body: str) -> str:
    path = folder / "fake-nvcc"
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def test_argv_uses_settings_or_database_flags(tmp_path: Path) -> None:
    settings = Settings(arch="sm_80", include_paths=("/inc",), extra_flags=("-O3",))
    src = tmp_path / "src"
    src.mkdir()
    argv = build_flags(settings, str(src / "k.cu")).argv("k.cu")
    assert argv == ["nvcc", "-arch=sm_80", "-cubin", "-Xptxas", "-v", "-lineinfo", "-I", str(src), "-I", "/inc",
                    "-O3", "-o", "k.cubin", "k.cu"]
    (tmp_path / "compile_commands.json").write_text(json.dumps(
        [{"directory": str(src), "file": "k.cu", "arguments": ["nvcc", "-arch=sm_75", "-DX", "-c", "k.cu"]}]))
    flags = build_flags(settings, str(src / "k.cu"), workspace_root=str(tmp_path), compile_db=CompileDb())
    with_db = flags.argv("k.cu")
    assert "-arch=sm_80" not in with_db and with_db.count("-arch=sm_75") == 1 and "-DX" in with_db
    assert flags.flags_source == "compile_commands.json" and flags.target_arch == "sm_75"
    # The verifier builds for the GPU it measures on: only the architecture changes, never the -D flags.
    assert flags.for_arch("sm_90").argv("k.cu") == [a if a != "-arch=sm_75" else "-arch=sm_90" for a in with_db]


def test_arch_flags_are_split_from_the_rest() -> None:
    assert split_arch_flags(("-DX", "-gencode", "arch=compute_80,code=sm_80", "-O3", "--gpu-architecture=sm_70")) == (
        ("-gencode", "arch=compute_80,code=sm_80", "--gpu-architecture=sm_70"), ("-DX", "-O3"))
    assert build_flags(Settings(extra_flags=("-arch=sm_86", "-DY")), "/x/k.cu").arch_flags == ("-arch=sm_86",)


@needs_nvcc
def test_resources_by_name_and_local_include(tmp_path: Path) -> None:
    (tmp_path / "helper.cuh").write_text("#define HELPER 2\n")
    path = tmp_path / "k.cu"
    path.write_text("// on disk: something else entirely\n")
    result = compile_source(SOURCE, str(path), Settings())
    assert result.ok, result.messages
    assert set(result.resources) == {"ns::scale<3>", "tiles", "plain"}
    tiles = result.resources_for("tiles")
    assert tiles is not None and tiles.shared_bytes_static == 32 * 33 * 4 and tiles.registers_per_thread
    assert result.resources_for("scale") is result.resources["ns::scale<3>"]
    assert result.resources_for("ns::scale") is result.resources["ns::scale<3>"]
    assert result.resources_for("missing") is None
    assert path.read_text() == "// on disk: something else entirely\n"  # never written
    assert result.flags_source == "settings"


@needs_nvcc
def test_messages_name_the_document_not_the_temp_file(tmp_path: Path) -> None:
    path = tmp_path / "broken.cu"
    result = compile_source("__global__ void k() {\n  int x = nope;\n}\n", str(path), Settings())
    assert not result.ok and result.returncode != 0
    [error] = result.errors
    assert error.path == str(path) and error.line == 2 and error.column == 11
    assert "nope" in error.message


@needs_nvcc
def test_compile_commands_flags_are_used(tmp_path: Path) -> None:
    path = tmp_path / "k.cu"
    (tmp_path / "compile_commands.json").write_text(json.dumps([
        {"directory": str(tmp_path), "file": "k.cu", "arguments": ["nvcc", "-DNEEDED=1", "-c", "k.cu"]}
    ]))
    text = "#ifndef NEEDED\n#error no flags\n#endif\n__global__ void k() {}\n"
    result = compile_source(text, str(path), Settings(), workspace_root=str(tmp_path), compile_db=CompileDb())
    assert result.ok, result.messages
    assert result.flags_source == "compile_commands.json" and "-DNEEDED=1" in result.argv


def test_missing_nvcc_is_a_message(tmp_path: Path) -> None:
    result = compile_source("__global__ void k() {}\n", str(tmp_path / "k.cu"), Settings(nvcc_path="/no/such/nvcc"))
    assert result.tool_missing is not None and "/no/such/nvcc" in result.tool_missing
    assert "nvccPath" in result.tool_missing and not result.ok


def test_hanging_nvcc_times_out(tmp_path: Path) -> None:
    fake = _fake_tool(tmp_path, "exec sleep 60")
    result = compile_source("x", str(tmp_path / "k.cu"), Settings(nvcc_path=fake, compile_timeout_s=0.5))
    assert result.timed_out and result.wall_s < 10
    assert any("did not finish within 0.5 s" in p for p in result.problems)


def test_cancel_stops_the_compiler(tmp_path: Path) -> None:
    fake = _fake_tool(tmp_path, "exec sleep 60")
    cancel = threading.Event()
    threading.Timer(0.3, cancel.set).start()
    result = compile_source("x", str(tmp_path / "k.cu"), Settings(nvcc_path=fake), cancel=cancel)
    assert result.cancelled and result.wall_s < 10


def test_compiler_sees_the_buffer_under_the_documents_name(tmp_path: Path) -> None:
    # A fake nvcc that reports what it was given: the file name and the text in it.
    fake = _fake_tool(tmp_path, 'for last; do :; done; echo "$last($(wc -l < "$last")): error: seen" >&2; exit 1')
    path = tmp_path / "mine.cuh"
    result = compile_source("a\nb\nc\n", str(path), Settings(nvcc_path=fake))
    [error] = result.errors
    assert error.path == str(path) and error.line == 3 and error.message == "seen"


def test_overlapping_compiles_of_one_text_run_nvcc_once_and_each_gets_its_cubin(tmp_path: Path) -> None:
    # A save's diagnostics and its profile compile the same text with the same flags at nearly the same time.
    runs = tmp_path / "runs"
    fake = _fake_tool(tmp_path, f'echo run >> {runs}; sleep 0.6; '
                                'for a; do [ "$prev" = -o ] && printf "cubin" > "$a"; prev=$a; done; exit 0')
    flags = build_flags(Settings(nvcc_path=fake), str(tmp_path / "k.cu"))
    folders = [tmp_path / "a", tmp_path / "b"]
    for folder in folders:
        folder.mkdir()
    results: list = [None, None]

    def compile(i: int, text: str) -> None:
        results[i] = compile_in(text, str(folders[i]), "buffer.cu", flags, document_path=str(tmp_path / "k.cu"))

    first = threading.Thread(target=compile, args=(0, "same"))
    first.start()
    second = threading.Thread(target=compile, args=(1, "same"))
    time.sleep(0.2)
    second.start()
    first.join()
    second.join()
    assert runs.read_text().splitlines() == ["run"]
    for folder, result in zip(folders, results):
        assert result.ok and result.cubin_path == str(folder / "buffer.cubin")
        assert Path(result.cubin_path).read_bytes() == b"cubin"
    # A finished compile that left no dependency list (this nvcc writes none) is not kept: the next one
    # runs nvcc again, as does another text at the same time.
    compile(0, "same")
    assert runs.read_text().splitlines() == ["run", "run"]
    other = threading.Thread(target=compile, args=(1, "other"))
    other.start()
    compile(0, "same")
    other.join()
    assert runs.read_text().splitlines() == ["run"] * 4


#: A fake nvcc that resolves ``#include "name"`` through its ``-I`` folders as nvcc does, writes the
#: ``-MF`` dependency list and a cubin made of what it read, and logs each run.
FAKE_NVCC_WITH_DEPENDENCIES = """#!{python}
import re, sys
from pathlib import Path
args = sys.argv[1:]
with open({runs!r}, "a") as log:
    log.write("run\\n")
value = lambda flag: args[args.index(flag) + 1] if flag in args else None
folders = [args[i + 1] for i, a in enumerate(args) if a == "-I"]
source = Path(args[-1])
read, text = [], source.read_text()
for name in re.findall(r'#include "([^"]+)"', text):
    found = next((Path(f) / name for f in folders if (Path(f) / name).exists()), None)
    if found is None:
        print(f"{{source}}(1): error: cannot open source file \\"{{name}}\\"", file=sys.stderr)
        sys.exit(1)
    read.append(str(found))
    text += found.read_text()
if value("-MF"):
    Path(value("-MF")).write_text(value("-o") + " : " + " \\\\\\n    ".join([str(source), *read]) + "\\n")
Path(value("-o")).write_text("cubin of " + text)
"""


@pytest.fixture
def reusing(tmp_path: Path):
    """(compile(text, settings_changes) -> result, the number of nvcc runs so far, the include folders)."""
    from kernel_lsp.services import toolchain

    toolchain._FINISHED.clear()
    runs = tmp_path / "runs"
    fake = tmp_path / "fake-nvcc"
    fake.write_text(FAKE_NVCC_WITH_DEPENDENCIES.format(python=sys.executable, runs=str(runs)))
    fake.chmod(0o755)
    project, extra = tmp_path / "project", tmp_path / "extra"
    project.mkdir()
    extra.mkdir()
    document = project / "k.cu"
    scratch = iter(range(1000))

    def compile(text: str, **settings) -> object:
        flags = build_flags(Settings(nvcc_path=str(fake), include_paths=(str(extra),), **settings), str(document))
        folder = tmp_path / f"scratch{next(scratch)}"
        folder.mkdir()
        return compile_in(text, str(folder), "buffer.cu", flags, document_path=str(document))

    def count() -> int:
        return len(runs.read_text().splitlines()) if runs.exists() else 0

    yield compile, count, project, extra
    toolchain._FINISHED.clear()


def test_a_finished_compile_is_reused_while_nothing_it_read_changed(reusing) -> None:
    compile, count, project, extra = reusing
    (extra / "common.cuh").write_text("#define COMMON 1\n")
    text = '#include "common.cuh"\n__global__ void k() {}\n'
    first = compile(text)
    again = compile(text)
    assert first.ok and again.ok and count() == 1
    # The cubin is the caller's own copy, in its own folder.
    assert again.cubin_path != first.cubin_path
    assert Path(again.cubin_path).read_text() == Path(first.cubin_path).read_text()
    # Editors write swap and backup files beside the sources: nothing nvcc read changed.
    (project / ".k.cu.swp").write_text("swap")
    (extra / "common.cuh~").write_text("backup")
    compile(text)
    assert count() == 1
    # Another text, other flags: compiled.
    compile(text + "// edit\n")
    compile(text, extra_flags=("-DX=1",))
    assert count() == 3


def test_an_edited_header_is_read_again(reusing) -> None:
    compile, count, project, extra = reusing
    header = extra / "common.cuh"
    header.write_text("#define COMMON 1\n")
    text = '#include "common.cuh"\n'
    compile(text)
    header.write_text("#define COMMON 22\n")
    edited = compile(text)
    assert count() == 2 and "COMMON 22" in Path(edited.cubin_path).read_text()


def test_a_header_that_appears_in_front_of_the_one_read_is_read(reusing) -> None:
    compile, count, project, extra = reusing
    # The file's own folder comes before the include paths: a header added there shadows extra's.
    (extra / "common.cuh").write_text("#define FROM_EXTRA\n")
    text = '#include "common.cuh"\n'
    compile(text)
    (project / "common.cuh").write_text("#define FROM_PROJECT\n")
    shadowed = compile(text)
    assert count() == 2 and "FROM_PROJECT" in Path(shadowed.cubin_path).read_text()


def test_a_compile_that_failed_for_a_missing_header_runs_again(reusing) -> None:
    compile, count, project, extra = reusing
    text = '#include "later.cuh"\n'
    failed = compile(text)
    assert not failed.ok and "later.cuh" in failed.log
    (project / "later.cuh").write_text("\n")
    assert compile(text).ok and count() == 2
