"""A malicious workspace runs nothing: compile_commands.json, workspace settings and ``kernel-lsp check``.

The workspace is what a cloned repository can contain: a script that would create a marker file when
run, and a compile database whose flags ask nvcc to run it (``-ccbin``, ``--compiler-bindir``,
``-Xcompiler -wrapper,PROG``), to read a file outside the workspace (``-include``), or to read more
arguments from a file (``@file``). nvcc runs the host compiler even for ``-cubin`` (it preprocesses
with it), so without the flag policy each of these runs the script.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from lsp_helpers import lsp_session, needs_nvcc, open_doc, wait_diagnostics, wait_message

from kernel_lsp.services.compile_db import DB_NAME

KERNEL = "__global__ void k(float* a) { a[threadIdx.x] *= 2.0f; }\n"
SECRET = "SECRET_OUTSIDE_THE_WORKSPACE_42"


#: One compile-database entry per attack, each with the old code's outcome (measured with the tree before the
#: flag policy: the first three ran the script, the fourth printed the outside file in a diagnostic).
FORMS = {
    "ccbin.cu": lambda ws, out: ["-ccbin", str(ws / "tools" / "cc.sh")],
    "bindir.cu": lambda ws, out: [f"--compiler-bindir={ws / 'tools'}"],
    "wrapper.cu": lambda ws, out: ["-Xcompiler", f"-wrapper,{ws / 'tools' / 'cc.sh'}"],
    "include.cu": lambda ws, out: ["-include", str(out / "secret.h")],
    "response.cu": lambda ws, out: [f"@{ws / 'more.rsp'}"],
}


def hostile_workspace(tmp_path: Path) -> tuple[Path, Path]:
    """(workspace, the marker the script would create); one .cu file per entry of :data:`FORMS`."""
    workspace = tmp_path / "cloned"
    outside = tmp_path / "outside"
    workspace.mkdir()
    outside.mkdir()
    marker = tmp_path / "PWNED"
    script = workspace / "tools" / "cc.sh"
    script.parent.mkdir()
    # Creates the marker, then runs what it was given (as a wrapper would).
    script.write_text(f"#!/bin/sh\ntouch '{marker}'\nexec \"$@\"\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    for name in ("gcc", "g++", "cc", "c++"):
        (workspace / "tools" / name).symlink_to(script)
    (outside / "secret.h").write_text(f"#error {SECRET}\n")
    (workspace / "more.rsp").write_text(f"-ccbin {script}\n")
    entries = []
    for name, form in FORMS.items():
        (workspace / name).write_text(KERNEL)
        entries.append({"directory": str(workspace), "file": name,
                        "arguments": ["nvcc", *form(workspace, outside), "-DKEPT=1", "-c", name]})
    (workspace / "compile_commands.json").write_text(json.dumps(entries))
    return workspace, marker


REASONS = {
    "ccbin.cu": ("-ccbin", "allowedCompilers"),
    "bindir.cu": ("--compiler-bindir", "allowedCompilers"),
    "wrapper.cu": ("-Xcompiler -wrapper", "run or load a program"),
    "include.cu": ("-include", "outside the workspace"),
    "response.cu": ("@", "response file"),
}


@needs_nvcc
async def test_editor_runs_nothing_from_a_hostile_workspace(tmp_path: Path) -> None:
    workspace, marker = hostile_workspace(tmp_path)
    script = workspace / "tools" / "cc.sh"
    hostile_settings = {"nvccPath": str(script), "ncuPath": str(script), "profileProgram": str(script),
                        "extraFlags": ["-ccbin", str(script), "-DFROM_WORKSPACE=1"]}
    async with lsp_session(workspace, workspace_settings=hostile_settings) as client:
        for name, (flag, why) in REASONS.items():
            uri = open_doc(client, workspace / name)
            diagnostics = await wait_diagnostics(client, uri, lambda ds: any(d.code == "flags-dropped" for d in ds))
            # The database's flags; the workspace's extraFlags have a warning of their own ("settings: ...").
            [dropped] = [d for d in diagnostics if d.code == "flags-dropped" and DB_NAME in d.message]
            assert any(d.code == "flags-dropped" and "settings: flags not passed" in d.message for d in diagnostics)
            assert flag in dropped.message and why in dropped.message, (name, dropped.message)
            assert "-DKEPT" not in dropped.message
            assert not any(SECRET in d.message for d in diagnostics)
        await wait_message(client, "setting 'nvccPath' ignored")
        await wait_message(client, "setting 'profileProgram' ignored")
        await wait_message(client, "extraFlags: '-ccbin")
    assert not marker.exists(), "a workspace-supplied program ran"


@needs_nvcc
@pytest.mark.parametrize("name", sorted(FORMS))
def test_check_runs_nothing_from_the_files_folder(tmp_path: Path, name: str) -> None:
    workspace, marker = hostile_workspace(tmp_path)
    # From another folder (the file's own folder is searched for a database), and from the clone itself.
    elsewhere = tmp_path / "home"
    elsewhere.mkdir()
    # tmp_path holds both the clone and the outside file, as a home folder would.
    for cwd in (elsewhere, workspace, tmp_path):
        done = _check(workspace / name, cwd, tmp_path / "none.json")
        assert done.returncode == 0, done.stdout + done.stderr
        assert "flags not passed to nvcc" in done.stdout and REASONS[name][0] in done.stdout
        assert SECRET not in done.stdout + done.stderr
        assert "Traceback" not in done.stderr
        assert not marker.exists(), "a program chosen by the compile database ran"


def _check(source: Path, cwd: Path, user_settings: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kernel_lsp", "check", str(source)], cwd=cwd, text=True,
                          capture_output=True, timeout=300, env={**os.environ, "KERNEL_LSP_CONFIG": str(user_settings)})


@needs_nvcc
def test_user_allowed_compiler_is_used(tmp_path: Path) -> None:
    """The user's own allow-list (a user-level setting) lets -ccbin through: the flag really runs the compiler."""
    workspace, marker = hostile_workspace(tmp_path)
    user_settings = tmp_path / "user.json"
    user_settings.write_text(json.dumps({"allowedCompilers": [str(workspace / "tools" / "*")]}))
    done = _check(workspace / "ccbin.cu", tmp_path, user_settings)
    assert "flags not passed" not in done.stdout, done.stdout
    assert marker.exists(), "the allowed compiler was not used"
