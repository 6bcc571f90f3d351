"""The flag policy for compile_commands.json: an allow-list of flag forms."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from kernel_lsp.services.compile_db import CompileDb, compiler_allowed, filter_flags
from kernel_lsp.services.toolchain import build_flags, dropped_flags_message
from kernel_lsp.config import Settings


def run(args, tmp_path: Path, allowed=()):
    return filter_flags(args, str(tmp_path), str(tmp_path), allowed)


@pytest.mark.parametrize("args, why", [
    (["-ccbin", "/opt/evil/g++"], "allowedCompilers"),
    (["-ccbin=/opt/evil/g++"], "allowedCompilers"),
    (["--compiler-bindir", "/opt/evil"], "allowedCompilers"),
    (["--compiler-bindir=/opt/evil"], "allowedCompilers"),
    (["-Xcompiler", "-wrapper,/opt/evil.sh"], "'-wrapper'"),
    (["-Xcompiler=-B/opt/evil"], "'-B/opt/evil'"),
    (["--compiler-options", "-fplugin=/opt/evil.so"], "'-fplugin=/opt/evil.so'"),
    (["-Xcompiler", "-fPIC,-specs=/opt/evil.specs"], "'-specs=/opt/evil.specs'"),
    (["-Xcompiler", "-Wp,-MD,/tmp/out"], "'-Wp'"),
    (["-include", "/etc/hostname"], "outside the workspace"),
    (["--pre-include=/etc/passwd"], "outside the workspace"),
    (["@/tmp/args.rsp"], "response file"),
    (["--options-file", "/tmp/args"], "not among"),
    (["-optf", "/tmp/args"], "not among"),
    (["-Xlinker", "--wrap=main"], "not among"),
    (["-Xptxas", "--input-as-string"], "ptxas option"),
    (["--run"], "not among"),
    (["--keep", "--keep-dir", "/tmp/x"], "not among"),
    (["-time", "/tmp/timing.csv"], "not among"),
    (["-std=c++17;touch /tmp/x"], "not a plain std value"),
])
def test_program_choosing_and_outside_reading_flags_are_dropped_with_a_reason(tmp_path, args, why):
    result = run(args, tmp_path)
    assert result.kept == ()
    assert result.dropped and why in result.dropped[0].reason, result.dropped


def test_value_of_a_dropped_flag_is_not_read_as_a_flag(tmp_path):
    # "-Xlinker -DX" must not leave "-DX" behind as a macro, nor "-o" as our output.
    result = run(["-Xlinker", "-DX", "-Xcompiler", "-wrapper,/x", "-DY"], tmp_path)
    assert result.kept == ("-DY",)


def test_plain_flags_are_kept(tmp_path):
    inc = tmp_path / "inc"
    args = ["-I", "inc", "-Iother", "-isystem", "/usr/local/cuda/include", "-DA=1", "-D", "B", "-UC",
            "-std=c++17", "--std", "c++20", "-arch=sm_90", "-gencode", "arch=compute_90,code=[sm_90,compute_90]",
            "--expt-relaxed-constexpr", "--extended-lambda", "-O3", "-G", "-lineinfo", "-rdc=true",
            "-maxrregcount=64", "--use_fast_math", "-Wno-deprecated-gpu-targets", "-Xcompiler", "-fPIC,-Wall,-O2",
            "-Xptxas", "-O3,-v", "-include", "inc/pre.h", "-x", "cu"]
    kept = run(args, tmp_path).kept
    assert kept == (
        "-I", str(inc), f"-I{tmp_path / 'other'}", "-isystem", "/usr/local/cuda/include", "-DA=1", "-D", "B", "-UC",
        "-std=c++17", "--std=c++20", "-arch=sm_90", "-gencode=arch=compute_90,code=[sm_90,compute_90]",
        "--expt-relaxed-constexpr", "--extended-lambda", "-O3", "-G", "-lineinfo", "-rdc=true",
        "-maxrregcount=64", "--use_fast_math", "-Wno-deprecated-gpu-targets", "-Xcompiler", "-fPIC,-Wall,-O2",
        "-Xptxas", "-O3,-v", "-include", str(tmp_path / "inc" / "pre.h"), "-x", "cu",
    )
    assert run(args, tmp_path).dropped == ()


def test_outputs_and_inputs_are_dropped_without_a_word(tmp_path):
    result = run(["-c", "k.cu", "-o", "k.o", "-MD", "-MF", "k.d", "-odir", "out", "-ok.o", "-cubin"], tmp_path)
    assert result == type(result)((), ())


def test_include_inside_the_workspace_through_a_link_out_is_dropped(tmp_path):
    outside = tmp_path.parent / f"{tmp_path.name}-outside"
    outside.mkdir()
    (outside / "s.h").write_text("")
    (tmp_path / "link").symlink_to(outside)
    result = run(["-include", "link/s.h"], tmp_path)
    assert result.kept == () and "outside the workspace" in result.dropped[0].reason


def test_ccbin_kept_only_for_compilers_the_user_allows(tmp_path):
    gxx = tmp_path / "bin" / "g++-13"
    gxx.parent.mkdir()
    gxx.write_text("")
    assert run(["-ccbin", str(gxx)], tmp_path, allowed=(str(tmp_path / "bin" / "g++-*"),)).kept == ("-ccbin", str(gxx))
    assert run(["-ccbin", str(gxx)], tmp_path, allowed=("/usr/bin/*",)).kept == ()
    # A relative path is matched (and passed) as the absolute path it names.
    assert run(["-ccbin", "bin/g++-13"], tmp_path, allowed=(str(tmp_path / "bin" / "*"),)).kept == ("-ccbin", str(gxx))
    assert compiler_allowed("g++", str(tmp_path), ()) is None


def test_database_entry_reports_dropped_flags_and_the_warning_names_them(tmp_path):
    (tmp_path / "compile_commands.json").write_text(json.dumps([{
        "directory": str(tmp_path), "file": "k.cu",
        "arguments": ["nvcc", "-ccbin", "/opt/evil", "-DOK", "-include", "/etc/hostname", "-c", "k.cu"],
    }]))
    flags = CompileDb().flags_for(str(tmp_path / "k.cu"), str(tmp_path))
    assert flags.flags == ("-DOK",)
    assert [d.flag for d in flags.dropped] == ["-ccbin /opt/evil", "-include /etc/hostname"]
    message = dropped_flags_message(flags)
    assert message.severity == "warning" and message.code == "flags-dropped"
    assert "'-ccbin /opt/evil'" in message.message and "'-include /etc/hostname'" in message.message
    build = build_flags(Settings(), str(tmp_path / "k.cu"), workspace_root=str(tmp_path), compile_db=CompileDb())
    argv = build.argv("k.cu")
    assert "-ccbin" not in argv and "/etc/hostname" not in argv and "-DOK" in argv
    # The warning travels with the flags: every compile of the file shows it.
    assert [m.code for m in build.notices] == ["flags-dropped"]


def test_deeply_nested_database_is_a_message(tmp_path):
    (tmp_path / "compile_commands.json").write_text("[" * 200_000)
    flags = CompileDb().flags_for(str(tmp_path / "k.cu"), str(tmp_path))
    assert flags.flags is None and "nested too deeply" in (flags.problem or "")


def test_unreadable_database_is_a_message(tmp_path):
    db = tmp_path / "compile_commands.json"
    db.write_text("[]")
    db.chmod(0)
    try:
        if os.access(db, os.R_OK):
            pytest.skip("running as a user who can read any file")
        flags = CompileDb().flags_for(str(tmp_path / "k.cu"), str(tmp_path))
        assert flags.flags is None and "cannot be read" in (flags.problem or "")
    finally:
        db.chmod(0o644)


def test_check_trusts_only_the_databases_own_folder(tmp_path):
    project = tmp_path / "project"
    project.mkdir()
    (tmp_path / "secret.h").write_text("")
    (project / "compile_commands.json").write_text(json.dumps([{
        "directory": str(project), "file": "k.cu", "arguments": ["nvcc", "-include", str(tmp_path / "secret.h")],
    }]))
    # The editor's workspace is the folder the user opened; the CLI's current folder is not a boundary.
    assert CompileDb().flags_for(str(project / "k.cu"), str(tmp_path)).flags == ("-include", str(tmp_path / "secret.h"))
    assert CompileDb(trust_workspace=False).flags_for(str(project / "k.cu"), str(tmp_path)).flags == ()
