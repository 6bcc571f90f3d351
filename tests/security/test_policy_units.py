"""The pieces behind issue 27's fixes, one at a time: the command-line policy, the compiler allow-list, the
bounded readers of nvcc's output and of oversized messages, and the work budgets."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from pathlib import Path

import pytest

from kernel_lsp.config import resolve
from kernel_lsp.core.argv_policy import SHELL_ACTIVE, path_matches, pattern_problem, safe_flags
from kernel_lsp.core.budgets import MAX_INDEX_UNITS, REDUCED_BYTES, budget
from kernel_lsp.core.nvcc_output import MAX_MESSAGES, read_diagnostics
from kernel_lsp.services import proc
from kernel_lsp.services.compile_db import compiler_allowed, filter_flags
from kernel_lsp.services.toolchain import BuildFlags, build_flags, compile_in, settings_flags
from kernel_lsp.server.stdio import MAX_BODY_BYTES, MessageReader, Unread


# ---------------------------------------------------------------- what reaches nvcc's shell

@pytest.mark.parametrize("char", sorted(SHELL_ACTIVE))
def test_every_shell_active_character_drops_its_flag_and_value(char: str) -> None:
    kept, dropped = safe_flags(["-DOK=1", "-I", f"/x/a{char}b", f"-DBAD=a{char}b", "-isystem", "/fine", "-O3"])
    assert kept == ("-DOK=1", "-isystem", "/fine", "-O3")
    assert [flag for flag, _ in dropped] == [f"-I /x/a{char}b", f"-DBAD=a{char}b"]
    assert all("shell" in why for _, why in dropped)


def test_values_nvcc_passes_unquoted_hold_plain_words_only() -> None:
    kept, dropped = safe_flags(["-Xcompiler", "-fPIC,-O2", "-Xcompiler", "-Wall;touch x", "--ptxas-options=-v|y",
                                "-Xptxas", "-O3"])
    assert kept == ("-Xcompiler", "-fPIC,-O2", "-Xptxas", "-O3")
    assert [flag for flag, _ in dropped] == ["-Xcompiler -Wall;touch x", "--ptxas-options=-v|y"]


def test_compile_database_values_pass_the_same_check(tmp_path: Path) -> None:
    result = filter_flags(["-DA=$(x)", "--define-macro=B=`x`", "-U", 'C("x")', "-I/ok", "-DD=1"], str(tmp_path),
                          str(tmp_path))
    assert result.kept == ("-I/ok", "-DD=1")
    assert len(result.dropped) == 3


@pytest.mark.parametrize("layer", ["workspace settings", "initializationOptions", "user file"])
def test_settings_flags_of_every_layer_pass_the_policy(tmp_path: Path, layer: str) -> None:
    evil = tmp_path / "evil.sh"
    evil.write_text("#!/bin/sh\n")
    evil.chmod(0o755)
    settings = resolve((layer, {"extraFlags": ["-ccbin", str(evil), "-DX=$(y)", "-DOK"],
                                "includePaths": ["/inc", "/a`b`"]}, layer != "workspace settings"))
    kept, dropped = settings_flags(settings, str(tmp_path))
    assert kept == ("-I", "/inc", "-DOK")
    assert [(key, d.flag) for key, d in dropped] == [("includePaths", "/a`b`"), ("extraFlags", f"-ccbin {evil}"),
                                                     ("extraFlags", "-DX=$(y)")]


def test_a_files_folder_with_shell_text_is_linked_not_passed(tmp_path: Path) -> None:
    folder = tmp_path / "p$(x)"
    folder.mkdir()
    flags = build_flags(resolve(), str(folder / "k.cu"))
    assert flags.linked_folders == (str(folder),)
    argv = flags.argv("buffer.cu", {str(folder): "/tmp/scratch/include-0"})
    assert "/tmp/scratch/include-0" in argv and str(folder) not in argv
    assert build_flags(resolve(), str(tmp_path / "k.cu")).linked_folders == ()


def test_a_linked_folder_serves_every_compile_in_one_scratch_folder(tmp_path: Path) -> None:
    folder = tmp_path / "p`x`"
    folder.mkdir()
    seen = tmp_path / "argv.txt"
    fake = tmp_path / "nvcc"
    fake.write_text(f"#!/bin/sh\nprintf '%s\\n' \"$@\" >> '{seen}'\n")
    fake.chmod(0o755)
    flags = build_flags(resolve(("user file", {"nvccPath": str(fake)})), str(folder / "k.cu"))
    workdir = tmp_path / "work"
    workdir.mkdir()
    for stem in ("original", "candidate"):  # as the verifier compiles both in its folder
        assert compile_in("x", str(workdir), f"{stem}.cu", flags).returncode == 0
    passed = [line for line in seen.read_text().splitlines() if line.startswith(str(workdir) + "/include-")]
    assert len(passed) == 2 and len(set(passed)) == 1 and os.path.realpath(passed[0]) == str(folder)
    assert str(folder) not in seen.read_text()


def test_compile_refuses_a_command_line_the_shell_would_act_on(tmp_path: Path) -> None:
    """The last check, on the whole command line: a fake nvcc that would leave a marker is never started."""
    marker = tmp_path / "ran"
    fake = tmp_path / "nvcc"
    fake.write_text(f"#!/bin/sh\ntouch '{marker}'\n")
    fake.chmod(0o755)
    workdir = tmp_path / "work"
    workdir.mkdir()
    result = compile_in("x", str(workdir), "buffer.cu", BuildFlags(nvcc=str(fake), flags=("-DX=$(y)",)))
    assert not marker.exists() and result.errors and "nvcc was not run" in result.errors[0].message
    compile_in("x", str(workdir), "buffer.cu", BuildFlags(nvcc=str(fake), flags=("-DX=1",)))
    assert marker.exists()  # the same fake runs when nothing is wrong: the refusal above was the check's


# ---------------------------------------------------------------- allowedCompilers

def test_patterns_match_one_segment_at_a_time() -> None:
    assert path_matches("/usr/bin/g++-12", "/usr/bin/g++-*")
    assert not path_matches("/usr/bin/sub/g++-12", "/usr/bin/*")
    assert not path_matches("/usr/bin/../../repo/evil.sh", "/usr/bin/*")
    assert pattern_problem("/usr/bin/../*") and pattern_problem("bin/*") and pattern_problem("/usr/bin/$x")
    assert not path_matches("/usr/bin/gcc", "/usr/bin/../bin/*")


def test_the_compiler_is_matched_by_its_real_path(tmp_path: Path) -> None:
    allowed = tmp_path / "allowed"
    repo = tmp_path / "repo"
    allowed.mkdir()
    repo.mkdir()
    real = allowed / "x86_64-cc-12"
    real.write_text("#!/bin/sh\n")
    real.chmod(0o755)
    (allowed / "cc-12").symlink_to(real)       # Debian's /usr/bin/g++-12 -> x86_64-linux-gnu-g++-12
    evil = repo / "cc-12"
    evil.write_text("#!/bin/sh\n")
    evil.chmod(0o755)
    (repo / "inside").symlink_to(allowed)      # a workspace link into the allowed folder, to its own file
    patterns = (f"{allowed}/cc-*",)
    assert compiler_allowed(str(allowed / "cc-12"), str(repo), patterns) == str(allowed / "cc-12")
    assert compiler_allowed(f"{allowed}/../repo/cc-12", str(repo), patterns) is None
    assert compiler_allowed(str(repo / "inside" / ".." / "repo" / "cc-12"), str(repo), patterns) is None
    assert compiler_allowed(str(repo / "inside" / "cc-12"), str(repo), patterns) == str(allowed / "cc-12")
    assert compiler_allowed(str(evil), str(repo), (f"{allowed}/*",)) is None


def test_bad_patterns_are_settings_problems() -> None:
    settings = resolve(("user file", {"allowedCompilers": ["/usr/bin/../*"]}))
    assert settings.allowed_compilers == () and "'..'" in settings.problems[0]


# ---------------------------------------------------------------- nvcc's output

def test_reading_diagnostics_is_linear_and_capped() -> None:
    echo = "  " + "__attribute__((global)) int;" * 2_400          # a 66 KB echoed source line
    block = "f.cu(1): warning #1866-D: attribute does not apply to any entity\n" + echo + "\n" + " " * 60_000 + "^\n\n"
    for repeats in (200, 800):
        start = time.perf_counter()
        found = read_diagnostics(block * repeats)
        took = time.perf_counter() - start
        assert len(found.messages) == min(repeats, MAX_MESSAGES) and found.more == max(0, repeats - MAX_MESSAGES)
        assert all(len(m.message) < 5_000 for m in found.messages)
        print(f"{repeats} messages of {len(block) * repeats / 2**20:.0f} MB: {took:.2f} s")
        assert took < 5.0


def test_a_child_printing_without_end_is_read_in_part_and_stopped() -> None:
    script = "import sys\nwhile True:\n    sys.stdout.write('x' * 1023 + '\\n')\n"
    start = time.perf_counter()
    result = proc.run([sys.executable, "-c", script], timeout_s=60, max_output_bytes=(1 << 20, 1 << 18),
                      stop_after_bytes=32 << 20)
    assert time.perf_counter() - start < 30
    assert result.output_overflow and result.returncode is None
    assert len(result.stdout) <= (1 << 20) + (1 << 18) and result.skipped_bytes > 16 << 20
    assert all(len(line) == 1023 for line in result.stdout.splitlines())  # whole lines on both sides of the gap


def test_a_capped_child_that_ends_keeps_its_start_and_end() -> None:
    script = "print('first'); print('m' * 5_000_000); print('last')"
    result = proc.run([sys.executable, "-c", script], timeout_s=60, max_output_bytes=(1 << 16, 1 << 16))
    lines = result.stdout.splitlines()
    assert result.ok and lines[0] == "first" and lines[-1] == "last" and result.skipped_bytes >= 5_000_000


# ---------------------------------------------------------------- oversized messages

def _body(**params: object) -> bytes:
    return json.dumps(params).encode()


@pytest.mark.parametrize("body, fields", [
    (_body(jsonrpc="2.0", method="textDocument/didOpen", params={"textDocument": {
        "uri": "file:///a.cu", "languageId": "cuda", "version": 4, "text": 'x "uri": "file:///fake" \\"id\\": 1'}}),
     ("textDocument/didOpen", "file:///a.cu", 4)),
    # Keys in any order (Neovim's encoder keeps none): the method after the text.
    (_body(params={"textDocument": {"text": "y" * 1000, "version": 2, "uri": "file:///b%20c.cu"}},
           method="textDocument/didChange"), ("textDocument/didChange", "file:///b%20c.cu", 2)),
    (_body(jsonrpc="2.0", id=7, method="textDocument/didOpen", params={"textDocument": {"uri": "file:///a.cu"}}), None),
    (_body(jsonrpc="2.0", method="workspace/didChangeConfiguration", params={"uri": "file:///a.cu"}), None),
])
def test_an_unread_body_gives_its_method_uri_and_version(body: bytes, fields: object) -> None:
    data = bytearray(b"junk" + body + b"more")
    assert asyncio.run(Unread(data, 4, 4 + len(body)).fields()) == fields


def test_the_reader_leaves_an_oversized_body_where_it_is() -> None:
    big = _body(method="textDocument/didOpen", params={"textDocument": {"uri": "file:///h.cu", "version": 1,
                                                                         "text": "k" * (MAX_BODY_BYTES + 10)}})
    small = _body(jsonrpc="2.0", id=1, method="shutdown")
    reader = MessageReader.__new__(MessageReader)
    reader._buffer = bytearray(b"Content-Length: %d\r\n\r\n" % len(big) + big + b"Content-Length: %d\r\n\r\n" % len(small) + small)
    first, second = reader._take()
    assert isinstance(first, Unread) and first.size_bytes == len(big) and second == small
    assert asyncio.run(first.fields()) == ("textDocument/didOpen", "file:///h.cu", 1)


def test_a_publication_holds_at_most_1000_diagnostics() -> None:
    from lsprotocol import types

    from kernel_lsp.core.parse import ParsedDocument
    from kernel_lsp.server.base import MAX_PUBLISHED_DIAGNOSTICS, KernelLspServer
    from kernel_lsp.server.documents import DocumentState

    server = KernelLspServer()
    sent: list[types.PublishDiagnosticsParams] = []
    server.text_document_publish_diagnostics = sent.append  # type: ignore[method-assign]
    at = types.Range(start=types.Position(line=0, character=0), end=types.Position(line=0, character=1))
    asked: list[str] = []

    def many(state, doc):
        asked.append("many")
        return [types.Diagnostic(range=at, message=str(i)) for i in range(5_000)]

    def later(state, doc):
        asked.append("later")
        return []

    server.state.diagnostic_sources[:] = [many, later]
    server.state.publish_diagnostics(DocumentState("file:///x.cu", 1, ParsedDocument(""), "/x.cu"))
    [published] = sent
    assert len(published.diagnostics) == MAX_PUBLISHED_DIAGNOSTICS + 1 and asked == ["many"]
    assert published.diagnostics[-1].code == "more-diagnostics" and "4000 or more" in published.diagnostics[-1].message


# ---------------------------------------------------------------- work budgets

def test_budgets() -> None:
    assert budget(1000, 10) == budget(1000)
    assert not budget(1000).reduced and budget(1000).analysis is None
    assert budget(2 << 20, 10).analysis and not budget(2 << 20, 10).reduced
    assert budget(1000, MAX_INDEX_UNITS + 1).reduced and "top-level declarations" in budget(1000, MAX_INDEX_UNITS + 1).index
    assert budget(REDUCED_BYTES + 1).reduced and budget(REDUCED_BYTES + 1).compile is None
    refused = budget(MAX_BODY_BYTES + 1)
    assert refused.index == refused.analysis == refused.compile and "not indexed, analysed or compiled" in refused.compile


def test_settings_out_of_range_are_refused() -> None:
    settings = resolve(("workspace settings", {"compileTimeoutS": -1, "optimizeBudgetS": float("inf"),
                                               "arch": "sm_90;x", "minSpeedup": 0.5}, False))
    assert settings == resolve()
    assert len(settings.problems) == 4 and all("ignored" in p for p in settings.problems)
