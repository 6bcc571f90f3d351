"""Hostile inputs a cloned repository can hold, one per form of issue 27, for the tests and the benchmark.

Each :class:`Case` is a workspace whose opening (``kernel-lsp check`` or the server's ``didOpen``) would run
``cd; touch PWNED`` through the shell nvcc hands its host-compiler command to: inside a compile-database
value, in a file or folder name, in a setting, or as a program chosen with ``-ccbin``. The marker lands in
``$HOME`` (a file or folder name cannot hold ``/``), so whoever runs a case sets ``HOME`` to ``case.home``.
Each case's source also holds a ``#warning``, so that a finished compile shows at least one diagnostic.
"""

from __future__ import annotations

import json
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: What the shell would run: the marker is created in $HOME (``cd`` with no argument goes there).
RUN = "cd;touch${IFS}PWNED"
KERNEL = '#warning "compiled"\n__global__ void k(float* a) { a[threadIdx.x] *= 2.0f; }\n'


@dataclass(frozen=True)
class Case:
    name: str
    workspace: Path
    source: Path
    home: Path
    user_settings: dict[str, Any] = field(default_factory=dict)
    """For ``check``: the user settings file (``KERNEL_LSP_CONFIG``); the server gets these as
    initializationOptions, the user-level source an editor fills."""
    workspace_settings: dict[str, Any] | None = None
    """The server's ``workspace/configuration`` answer (a cloned ``.vscode/settings.json``)."""

    @property
    def init_options(self) -> dict[str, Any]:
        """The server's initializationOptions: the user settings, except where the workspace layer holds them."""
        return {} if self.workspace_settings is not None else dict(self.user_settings)

    @property
    def marker(self) -> Path:
        return self.home / "PWNED"

    def env(self) -> dict[str, str]:
        """The environment a runner adds: ``HOME`` for the marker, the user settings file for ``check``."""
        settings = self.home / "user-settings.json"
        settings.write_text(json.dumps(self.user_settings))
        return {"HOME": str(self.home), "KERNEL_LSP_CONFIG": str(settings)}


def _db(workspace: Path, name: str, flags: list[str]) -> None:
    (workspace / "compile_commands.json").write_text(json.dumps([{
        "directory": str(workspace), "file": name, "arguments": ["nvcc", *flags, "-c", name]}]))


def _evil_script(workspace: Path, marker: Path) -> Path:
    """A host compiler that creates the marker, then compiles as g++ would (nvcc checks what it runs)."""
    script = workspace / "evil.sh"
    script.write_text(f"#!/bin/sh\ntouch '{marker}'\nexec g++ \"$@\"\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return script


#: Compile-database flags (``arguments``), each of which ran the command before issue 27.
DB_FORMS: dict[str, list[str]] = {
    "db -D $(...)": [f"-DFOO=$({RUN})"],
    "db -D `...`": [f"-DFOO=`{RUN}`"],
    "db --define-macro=": [f"--define-macro=FOO=$({RUN})"],
    "db -U F($(...))": [f"-UF($({RUN}))"],
    "db -I `...`": [f"-I/x/`{RUN}`"],
    "db -isystem `...`": ["-isystem", f"/x/`{RUN}`"],
    "db --include-path=": [f"--include-path=/x/`{RUN}`"],
    "db --system-include": ["--system-include", f"/x/`{RUN}`"],
}
FORMS = (*DB_FORMS, "file name", "folder name", "workspace extraFlags", "initializationOptions -ccbin",
         "allowedCompilers glob over ..")


def make(form: str, root: Path) -> Case:
    """The workspace of ``form`` (one of :data:`FORMS`) under ``root``."""
    home = root / "home"
    workspace = root / "cloned"
    home.mkdir(parents=True)
    workspace.mkdir()
    marker = home / "PWNED"
    source = workspace / "k.cu"
    user: dict[str, Any] = {}
    settings = None
    if form in DB_FORMS:
        _db(workspace, source.name, DB_FORMS[form])
    elif form == "file name":
        source = workspace / f"k$({RUN}).cu"
    elif form == "folder name":
        folder = workspace / f"p`{RUN}`"
        folder.mkdir()
        source = folder / "k.cu"
    elif form == "workspace extraFlags":
        # The server reads it from workspace/configuration; `check` has no workspace layer, so the user file
        # holds it there (the same value through the same policy).
        settings = {"extraFlags": [f"-DFOO=$({RUN})"]}
        user = dict(settings)
    elif form == "initializationOptions -ccbin":
        user = {"extraFlags": ["-ccbin", str(_evil_script(workspace, marker))]}
    elif form == "allowedCompilers glob over ..":
        script = _evil_script(workspace, marker)
        user = {"allowedCompilers": ["/usr/bin/*"]}
        _db(workspace, source.name, ["-ccbin", "/usr/bin/../.." + str(script)])
    else:
        raise ValueError(f"unknown form {form!r}")
    source.write_text(KERNEL)
    return Case(form, workspace, source, home, user, settings)


def compiled(diagnostics: Any) -> bool:
    """Whether published diagnostics include the compile's (not only tree-sitter's syntax hints)."""
    return any(getattr(d, "source", None) not in (None, "kernel-lsp (tree-sitter)") for d in diagnostics)


# --------------------------------------------------------------------------- files that cost work
KERNEL_UNIT = "__global__ void k{n}(float* a) {{ a[threadIdx.x] *= 2.0f; }}\n"


def line_66k() -> str:
    """One 66,000-byte line of 4,400 ``__global__ int;``: nvcc warns twice about each and echoes the whole
    line under every warning (1.36 GB of output from CUDA 13.0)."""
    return "__global__ int;" * 4_400


def kernels_of(size_bytes: int) -> str:
    """Small kernels, one per line, up to ``size_bytes`` (4.9 MB: 84,412 of them)."""
    parts: list[str] = []
    total = n = 0
    while True:
        unit = KERNEL_UNIT.format(n=n)
        if total + len(unit) > size_bytes:
            return "".join(parts)
        parts.append(unit)
        total += len(unit)
        n += 1


#: A stand-in nvcc that prints 20,000 warnings about the file it is given (its last argument).
FAKE_NVCC_20K = """#!{python}
import sys
name = sys.argv[-1]
sys.stderr.write("".join(f"{{name}}({{i % 3 + 1}}): warning #177-D: variable \\"v{{i}}\\" was declared but never referenced\\n"
                         for i in range(20_000)))
"""


# --------------------------------------------------------------------------- macros that expand to 2**40 tokens
MACRO_DEFINES = "#define A0 x\n" + "".join(f"#define A{i} A{i - 1} A{i - 1}\n" for i in range(1, 41))
#: A40 (2**40 tokens if expanded) in a directive, in a kernel's code and in a launch.
MACRO_BOMBS = {
    "directive": MACRO_DEFINES + "#if A40\nint y;\n#endif\n",
    "code": MACRO_DEFINES + "__global__ void k(float *x) { int A40; x[0] = 1.0f; }\n",
    "launch": MACRO_DEFINES + "__global__ void k(float *x) { x[0] = 1.0f; }\nvoid h(float *x) { k<<<A40, 256>>>(x); }\n",
}
