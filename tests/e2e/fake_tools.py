"""Stand-ins for the GPU tools, so a test decides what machine the server sees.

``fake_tools_env({"nvidia-smi": GPU_H200})`` returns an environment whose PATH
starts with a folder holding executable scripts of those names (and, with
``pycuda=True``, a PYTHONPATH holding an empty ``pycuda`` package: the server
only looks it up, a child process would import it). Scripts are ``/bin/sh``.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

#: nvidia-smi on a machine with one H200 (what ``--query-gpu=name,compute_cap`` prints).
GPU_H200 = 'echo "NVIDIA H200, 9.0"'
#: nvidia-smi on a machine whose driver sees no GPU.
NO_DEVICE = 'echo "No devices were found"; exit 6'
#: Any tool that exists (ncu for detection: it is never run by these tests).
EXISTS = "exit 0"


def fake_tools_env(tools: dict[str, str], *, pycuda: bool = False) -> dict[str, str]:
    folder = Path(tempfile.mkdtemp(prefix="kernel-lsp-fake-tools-"))
    for name, body in tools.items():
        script = folder / name
        script.write_text(f"#!/bin/sh\n{body}\n")
        script.chmod(0o755)
    env = {"PATH": f"{folder}{os.pathsep}{os.environ.get('PATH', '')}"}
    if pycuda:
        package = folder / "site" / "pycuda"
        package.mkdir(parents=True)
        (package / "__init__.py").write_text("")
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(folder / "site"), os.environ.get("PYTHONPATH")) if p)
    return env
