"""compile_commands.json look-up and flag filtering."""

from __future__ import annotations

import json
from pathlib import Path

from kernel_lsp.services.compile_db import CompileDb, find_db, keep_flags


def test_keeps_parse_relevant_flags_and_drops_outputs(tmp_path: Path) -> None:
    args = ["-Iinc", "-I", "../other", "-DX=1", "-std=c++17", "-arch=sm_80", "--expt-relaxed-constexpr",
            "-o", "k.o", "-c", "k.cu", "-MD", "-MF", "k.d", "-O3", "-Xcompiler", "-fPIC"]
    kept = keep_flags(args, str(tmp_path / "build"), str(tmp_path / "k.cu"))
    assert kept == (
        f"-I{tmp_path / 'build' / 'inc'}", "-I", str(tmp_path / "other"), "-DX=1", "-std=c++17", "-arch=sm_80",
        "--expt-relaxed-constexpr", "-O3", "-Xcompiler", "-fPIC",
    )


def test_finds_entry_by_command_string_and_resolves_relative_file(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "k.cu").write_text("")
    (tmp_path / "build").mkdir()
    (tmp_path / "build" / "compile_commands.json").write_text(json.dumps([
        {"directory": str(tmp_path), "file": "src/other.cu", "command": "nvcc -DOTHER -c src/other.cu"},
        {"directory": str(tmp_path), "file": "src/k.cu", "command": "nvcc -DMINE='1' -Isrc -c src/k.cu"},
    ]))
    assert find_db(src / "k.cu", tmp_path) == tmp_path / "build" / "compile_commands.json"
    flags = CompileDb().flags_for(str(src / "k.cu"), str(tmp_path))
    assert flags.problem is None
    assert flags.flags == ("-DMINE=1", f"-I{src}")


def test_file_without_entry_and_workspace_without_db(tmp_path: Path) -> None:
    (tmp_path / "compile_commands.json").write_text("[]")
    assert CompileDb().flags_for(str(tmp_path / "k.cu"), str(tmp_path)).flags is None
    elsewhere = tmp_path / "a" / "b"
    elsewhere.mkdir(parents=True)
    # The search stops at the workspace root: a database above it is not used.
    assert find_db(elsewhere / "k.cu", elsewhere) is None


def test_malformed_database_is_a_message_and_is_reread_when_fixed(tmp_path: Path) -> None:
    db_path = tmp_path / "compile_commands.json"
    db_path.write_text("[{oops")
    db = CompileDb()
    broken = db.flags_for(str(tmp_path / "k.cu"), str(tmp_path))
    assert broken.flags is None and "not valid JSON" in (broken.problem or "")
    db_path.write_text(json.dumps([{"directory": str(tmp_path), "file": "k.cu", "arguments": ["nvcc", "-DOK", "k.cu"]}]))
    fixed = db.flags_for(str(tmp_path / "k.cu"), str(tmp_path))
    assert fixed.problem is None and fixed.flags == ("-DOK",)


def test_wrong_shapes_are_messages(tmp_path: Path) -> None:
    db_path = tmp_path / "compile_commands.json"
    db_path.write_text(json.dumps({"file": "k.cu"}))
    assert "must be a JSON array" in (CompileDb().flags_for(str(tmp_path / "k.cu"), str(tmp_path)).problem or "")
    db_path.write_text(json.dumps([{"directory": str(tmp_path), "file": "k.cu"}]))
    assert "no 'arguments' or 'command'" in (CompileDb().flags_for(str(tmp_path / "k.cu"), str(tmp_path)).problem or "")
