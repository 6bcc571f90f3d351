"""Issue 27: a cloned repository runs nothing, through any value, name or setting.

Each form of :mod:`hostile` (a compile-database value nvcc's shell would expand, a file or folder name, a
workspace setting, ``-ccbin`` in initializationOptions, an ``allowedCompilers`` glob walked out of with
``..``) is opened with ``kernel-lsp check`` and with the real server (``didOpen``), with the real nvcc; the
marker the command would create must not appear, while the compile itself still runs (its ``#warning`` is
reported) and the dropped flag is named. ``test_form_is_live`` runs each form the way kernel-lsp used to
hand it to nvcc and sees the marker appear: the tests above could fail.
"""

from __future__ import annotations

import fnmatch
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import hostile
import pytest
from lsp_helpers import lsp_session, needs_nvcc, open_doc, wait_diagnostics

ROOT = Path(__file__).resolve().parents[2]
#: Forms whose text is a name, not a flag: nothing is dropped, the scratch copy's name and a link stand in.
NAMES = ("file name", "folder name")


def check(case: hostile.Case, argv: list[str] | None = None, **run: object) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **case.env(), "PYTHONPATH": str(ROOT)}
    return subprocess.run(argv or [sys.executable, "-m", "kernel_lsp", "check", str(case.source)],
                          cwd=case.workspace, env=env, text=True, capture_output=True, timeout=300, **run)


@needs_nvcc
@pytest.mark.parametrize("form", hostile.FORMS)
def test_check_runs_nothing(tmp_path: Path, form: str) -> None:
    case = hostile.make(form, tmp_path)
    done = check(case)
    assert not case.marker.exists(), f"{form}: the command ran"
    assert "Traceback" not in done.stderr, done.stderr
    assert '#warning "compiled"' in done.stdout, done.stdout + done.stderr  # nvcc did compile the file
    if form not in NAMES:
        said = done.stdout + done.stderr
        assert "not passed to nvcc" in said or "ignored" in said, said


@needs_nvcc
@pytest.mark.parametrize("form", hostile.FORMS)
async def test_server_runs_nothing(tmp_path: Path, form: str) -> None:
    case = hostile.make(form, tmp_path)
    async with lsp_session(case.workspace, init_options=case.init_options,
                           workspace_settings=case.workspace_settings, env={"HOME": str(case.home)}) as client:
        uri = open_doc(client, case.source)
        diagnostics = await wait_diagnostics(client, uri, lambda ds: any('#warning "compiled"' in d.message for d in ds))
        if form not in NAMES:
            dropped = [d.message for d in diagnostics if d.code == "flags-dropped"]
            assert dropped and ("shell" in dropped[0] or "allowedCompilers" in dropped[0]), dropped
    assert not case.marker.exists(), f"{form}: the command ran"


@needs_nvcc
@pytest.mark.parametrize("where", ["check", "server"])
async def test_local_includes_resolve_from_a_folder_with_shell_text(tmp_path: Path, where: str) -> None:
    """The file's own folder is reached through a plainly named link: its headers are read, and a message
    about one names the header where it really is."""
    case = hostile.make("folder name", tmp_path)
    folder = case.source.parent
    (folder / "local.cuh").write_text('#pragma once\n#define N 4\nint bad = "not an int";\n')
    case.source.write_text('#include "local.cuh"\n__global__ void k(float* a) { a[N] = 1.0f; }\n')
    header = str(folder / "local.cuh")
    if where == "check":
        done = check(case)
        assert f"{header}:3" in done.stdout, done.stdout + done.stderr
    else:
        async with lsp_session(case.workspace, env={"HOME": str(case.home)}) as client:
            uri = open_doc(client, case.source)
            diagnostics = await wait_diagnostics(client, uri, lambda ds: any("local.cuh" in d.message for d in ds))
            [found] = [d for d in diagnostics if "local.cuh" in d.message]
            assert found.message.startswith(f"{header}:3:") and found.range.start.line == 0, found
    assert not case.marker.exists()


def _old_command(case: hostile.Case, scratch: Path) -> list[str]:
    """nvcc's command line as kernel-lsp built it before issue 27 (the scratch copy under the document's
    name, ``-I`` its folder, the database's, the settings' and initializationOptions' flags unchecked)."""
    flags = list(hostile.DB_FORMS.get(case.name, []))
    flags += case.user_settings.get("extraFlags", [])
    if case.name == "allowedCompilers glob over ..":
        script = "/usr/bin/../.." + str(case.workspace / "evil.sh")
        assert fnmatch.fnmatchcase(script, "/usr/bin/*")  # what the old allow-list matched
        flags += ["-ccbin", script]
    name = case.source.name
    shutil.copy(case.source, scratch / name)
    return ["nvcc", "-arch=sm_90", "-cubin", "-Xptxas", "-v", "-lineinfo", *flags, "-I", str(case.source.parent),
            "-o", f"{Path(name).stem}.cubin", name]


@needs_nvcc
@pytest.mark.parametrize("form", hostile.FORMS)
def test_form_is_live(tmp_path: Path, form: str) -> None:
    case = hostile.make(form, tmp_path)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    subprocess.run(_old_command(case, scratch), cwd=scratch, env={**os.environ, "HOME": str(case.home)},
                   capture_output=True, timeout=300)
    assert case.marker.exists(), f"{form}: nvcc did not run the command, so the tests above prove nothing"


def _interpreter_for(user: str) -> list[str] | None:
    """A Python that ``user`` can run and that imports kernel-lsp's dependencies (this one, or the system
    Python of the same version with this environment's packages), as argv plus environment; None if none."""
    import site
    import sysconfig

    paths = os.pathsep.join([str(ROOT), *site.getsitepackages(), sysconfig.get_paths()["purelib"]])
    for python in (sys.executable, shutil.which(f"python{sys.version_info[0]}.{sys.version_info[1]}"), "/usr/bin/python3"):
        if not python:
            continue
        probe = subprocess.run(["runuser", "-u", user, "--", "env", f"PYTHONPATH={paths}", python, "-c",
                                "import kernel_lsp.cli, tree_sitter_cuda, pygls"], capture_output=True, timeout=60)
        if probe.returncode == 0:
            return ["env", f"PYTHONPATH={paths}", python]
    return None


@needs_nvcc
@pytest.mark.parametrize("form", ["db -D $(...)", "file name"])
def test_check_runs_nothing_as_a_normal_user(form: str) -> None:
    if os.geteuid() != 0:
        pytest.skip("the suite already runs as a normal user")
    if shutil.which("runuser") is None:
        pytest.skip("runuser is not available to switch to a normal user")
    user = "nobody"
    python = _interpreter_for(user)
    if python is None:
        pytest.skip(f"no Python that '{user}' may run imports kernel-lsp here")
    root = Path(tempfile.mkdtemp(prefix="kernel-lsp-normal-user-"))
    try:
        os.chmod(root, 0o777)
        case = hostile.make(form, root)
        for path in (case.home, case.workspace, case.source.parent):
            os.chmod(path, 0o777)
        # runuser gives the user its own HOME: the case's is set again inside, where the marker would land.
        settings = [f"{key}={value}" for key, value in case.env().items()]
        argv = ["runuser", "-u", user, "--", *python[:1], *settings, *python[1:], "-m", "kernel_lsp", "check",
                str(case.source)]
        done = subprocess.run(argv, cwd=case.workspace, text=True, capture_output=True, timeout=300)
        assert '#warning "compiled"' in done.stdout, done.stdout + done.stderr
        assert not case.marker.exists()
    finally:
        shutil.rmtree(root, ignore_errors=True)
