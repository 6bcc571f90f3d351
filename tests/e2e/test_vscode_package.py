"""Checks of the VS Code extension: its manifest, the settings docs, and its Node tests.

The build itself (``npm ci && npm run compile && npm run package``) runs in CI;
these catch the mistakes that build would not: settings drifting from
``kernel_lsp.config.Settings``, a lock file out of step with package.json
(``npm ci`` refuses it), contributed files that are missing or not JSON. The
extension's own tests (``npm test``: settings logic and client wiring against a
fake ``vscode`` module) run here too once ``npm ci`` has installed its packages.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kernel_lsp import config

EXTENSION = Path(__file__).resolve().parents[2] / "editors" / "vscode"


def manifest() -> dict:
    return json.loads((EXTENSION / "package.json").read_text(encoding="utf-8"))


def test_settings_match_server_settings() -> None:
    proc = subprocess.run(
        [sys.executable, str(EXTENSION / "scripts" / "sync_settings.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    properties = manifest()["contributes"]["configuration"]["properties"]
    server_keys = {key.removeprefix("kernelLsp.") for key in properties} - {"server.command", "trace.server"}
    assert server_keys == set(config.WIRE_KEYS)
    assert properties["kernelLsp.arch"]["default"] == config.Settings().arch
    assert properties["kernelLsp.extraFlags"]["type"] == "array"
    assert properties["kernelLsp.profileProgram"]["type"] == ["string", "null"]
    assert properties["kernelLsp.server.command"]["default"] == ["kernel-lsp", "serve"]


def test_every_setting_is_documented() -> None:
    readme = (EXTENSION.parent / "README.md").read_text(encoding="utf-8")
    help_file = (EXTENSION.parent / "nvim" / "doc" / "kernel_lsp.txt").read_text(encoding="utf-8")
    for key in config.WIRE_KEYS:
        assert f"| `{key}` |" in readme, f"{key} missing from the settings table in editors/README.md"
        assert f"{key} [" in help_file, f"{key} missing from editors/nvim/doc/kernel_lsp.txt"


def test_lock_file_matches_manifest() -> None:
    package = manifest()
    lock = json.loads((EXTENSION / "package-lock.json").read_text(encoding="utf-8"))
    root = lock["packages"][""]
    assert root.get("dependencies", {}) == package["dependencies"]
    assert root.get("devDependencies", {}) == package["devDependencies"]
    for name in [*package["dependencies"], *package["devDependencies"]]:
        assert f"node_modules/{name}" in lock["packages"], f"{name} missing from package-lock.json"


def test_contributions_exist_and_parse() -> None:
    package = manifest()
    contributes = package["contributes"]
    (language,) = contributes["languages"]
    assert language["id"] == "cuda"
    assert set(language["extensions"]) == {".cu", ".cuh"}
    assert {"onLanguage:cuda", "onLanguage:cuda-cpp"} <= set(package["activationEvents"])
    files = [language["configuration"], *(g["path"] for g in contributes["grammars"])]
    for relative in files:
        json.loads((EXTENSION / relative).read_text(encoding="utf-8"))
    commands = {c["command"] for c in contributes["commands"]}
    source = (EXTENSION / "src" / "extension.ts").read_text(encoding="utf-8")
    for command in commands:
        assert f"registerCommand('{command}'" in source, f"{command} is contributed but never registered"


@pytest.mark.skipif(
    shutil.which("npm") is None or not (EXTENSION / "node_modules" / "typescript").is_dir(),
    reason="needs npm and `npm ci` in editors/vscode",
)
def test_extension_node_tests() -> None:
    proc = subprocess.run(["npm", "test"], cwd=EXTENSION, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    # The summary is "# pass N" (TAP reporter) or "ℹ pass N" (spec reporter), by Node version.
    passed = re.search(r"^(?:#|ℹ) pass (\d+)$", proc.stdout, re.MULTILINE)
    assert passed and int(passed.group(1)) > 0, proc.stdout[-4000:]
    assert re.search(r"^(?:#|ℹ) fail 0$", proc.stdout, re.MULTILINE), proc.stdout[-4000:]
